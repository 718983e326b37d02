"""The SSML subset: each element, and hostile or broken documents refused with a position."""

from __future__ import annotations

import pytest

from tts_bridge.text.ssml import MAX_DEPTH, MAX_ELEMENTS, SsmlError, is_ssml, parse, say_as


def _texts(ssml: str) -> list[tuple[str, float, int | None]]:
    return [(" ".join(p.text.split()), p.rate, p.pause_before_ms) for p in parse(ssml).pieces]


def test_plain_words_in_speak() -> None:
    assert _texts("<speak>Dinner is ready.</speak>") == [("Dinner is ready.", 1.0, None)]
    namespaced = '<speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis">Hi.</speak>'
    assert _texts(namespaced) == [("Hi.", 1.0, None)]


@pytest.mark.parametrize(
    ("element", "ms"),
    [
        ('<break time="1500ms"/>', 1500),
        ('<break time="2s"/>', 2000),
        ('<break time="0.25s"/>', 250),
        ('<break strength="x-strong"/>', 1000),
        ('<break strength="none"/>', 0),
        ("<break/>", 400),
    ],
)
def test_breaks(element: str, ms: int) -> None:
    assert _texts(f"<speak>One.{element}Two.</speak>") == [
        ("One.", 1.0, None),
        ("Two.", 1.0, ms),
    ]


def test_a_break_at_the_end_is_trailing_silence() -> None:
    script = parse('<speak>One.<break time="700ms"/></speak>')
    assert script.trailing_ms == 700


@pytest.mark.parametrize(
    ("rate", "factor"),
    [("slow", 0.8), ("x-fast", 1.5), ("50%", 0.5), ("+20%", 1.2), ("-10%", 0.9), ("1.1", 1.1)],
)
def test_prosody_rates(rate: str, factor: float) -> None:
    pieces = parse(f'<speak>Now <prosody rate="{rate}">this part</prosody>.</speak>').pieces
    assert [p.rate for p in pieces] == [1.0, pytest.approx(factor), 1.0]
    assert pieces[1].joined and pieces[1].pause_before_ms is None


def test_nested_prosody_multiplies() -> None:
    ssml = '<speak><prosody rate="50%"><prosody rate="50%">slow</prosody></prosody></speak>'
    assert parse(ssml).pieces[0].rate == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        ("characters", "NASA", "N A S A"),
        ("spell-out", "ab c", "a b c"),
        ("digits", "2024", "2 0 2 4"),
        ("telephone", "+44 20-7946", "plus 4 4, 2 0, 7 9 4 6"),
        ("ordinal", "3", "3rd"),
        ("ordinal", "12", "12th"),
        ("ordinal", "22", "22nd"),
        ("cardinal", "42", "42"),
        ("date", "24/12", "24/12"),
    ],
)
def test_say_as(kind: str, text: str, said: str) -> None:
    assert say_as(kind, text) == said
    ssml = f'<speak>Say <say-as interpret-as="{kind}">{text}</say-as>.</speak>'
    assert _texts(ssml)[0][0] == f"Say {said} ."


def test_sub_paragraphs_sentences_and_unknown_elements() -> None:
    ssml = (
        '<speak><p>The <sub alias="World Wide Web">WWW</sub> is up</p>'
        "<s>Second <emphasis>sentence</emphasis></s><voice name='x'>Third</voice></speak>"
    )
    assert [t for t, _, _ in _texts(ssml)] == [
        "The World Wide Web is up",
        "Second sentence",
        "Third",
    ]


def test_audio_before_and_after_the_words_are_chimes() -> None:
    script = parse('<speak><audio src="ding"/>Hello.<audio src="alert"/></speak>')
    assert (script.chime, script.chime_after) == ("ding", "alert")
    with pytest.raises(SsmlError, match="not between"):
        parse('<speak>One.<audio src="ding"/>Two.</speak>')


def test_is_ssml() -> None:
    assert is_ssml("  <speak>x</speak>")
    assert not is_ssml("Use <speak> tags")
    assert is_ssml('<?xml version="1.0"?><speak>x</speak>') and is_ssml("<!DOCTYPE x><speak/>")


@pytest.mark.parametrize(
    ("ssml", "message"),
    [
        ("<speak>Hello <break time='1s'></speak>", "line 1, column"),
        ("<speak>\n  <p>one</speak>", "line 2"),
        ("<speak>Hi &nbsp; there</speak>", "undefined entity"),
        ("<p>Hi</p>", "must start with <speak>"),
        ("<speak><sub>x</sub></speak>", "alias"),
        ("<speak><break time='soon'/></speak>", "milliseconds"),
        ("<speak><break time='60s'/></speak>", "longer than"),
        ("<speak><prosody rate='warp'>x</prosody></speak>", "prosody rate"),
    ],
)
def test_malformed_ssml_says_what_and_where(ssml: str, message: str) -> None:
    with pytest.raises(SsmlError, match=message):
        parse(ssml)


LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    '<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">'
    '<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>'
    "<speak>&lol3;</speak>"
)
EXTERNAL = '<!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>'


@pytest.mark.parametrize("ssml", [LAUGHS, EXTERNAL])
def test_entities_and_external_references_are_refused(ssml: str) -> None:
    with pytest.raises(SsmlError, match=r"DOCTYPE.*line 1"):
        parse(ssml)


def test_deep_nesting_and_huge_documents_are_refused() -> None:
    deep = "<speak>" + "<s>" * MAX_DEPTH + "x" + "</s>" * MAX_DEPTH + "</speak>"
    with pytest.raises(SsmlError, match="nested"):
        parse(deep)
    very_deep = "<speak>" + "<p>" * 100_000 + "x" + "</p>" * 100_000 + "</speak>"
    with pytest.raises(SsmlError, match="nested"):
        parse(very_deep)
    many = "<speak>" + "<break/>" * (MAX_ELEMENTS + 1) + "</speak>"
    with pytest.raises(SsmlError, match="elements"):
        parse(many)
