"""Cleaning and sentence splitting (English and Chinese punctuation)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tts_bridge.speech.synthesis import RequestError, prepare_text
from tts_bridge.text.sentences import (
    StreamCleaner,
    clean,
    drop_chattts_tags,
    has_cjk,
    is_speakable,
    split_sentences,
)


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Dinner is ready.", ["Dinner is ready."]),
        (
            "The door is open. Please close it! Is the oven off? Yes.",
            ["The door is open.", "Please close it!", "Is the oven off?", "Yes."],
        ),
        ("Dr. Smith is at the door. J. Doe too.", ["Dr. Smith is at the door.", "J. Doe too."]),
        ("It is 21.5 degrees. Nice.", ["It is 21.5 degrees.", "Nice."]),
        ("客厅温度21度。湿度45%！要开空调吗？", ["客厅温度21度。", "湿度45%！", "要开空调吗？"]),
        ("洗衣机洗好了。The laundry is done.", ["洗衣机洗好了。", "The laundry is done."]),
        ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
        ("Wait... what?! OK", ["Wait...", "what?!", "OK"]),
        ("no punctuation at all", ["no punctuation at all"]),
    ],
)
def test_split_sentences(text: str, sentences: list[str]) -> None:
    assert split_sentences(clean(text)) == sentences


def test_clean_strips_control_and_format_characters() -> None:
    assert clean("a\x00b\x07c\u200bd\u202ee\nf\t g\r\n") == "abcde f g"
    assert clean("  \n\t ") == ""


@pytest.mark.parametrize(
    ("text", "speakable"),
    [("🎉🎉", False), ("?!...", False), ("\x01\x02", False), ("5", True), ("好", True)],
)
def test_is_speakable(text: str, speakable: bool) -> None:
    assert is_speakable(clean(text)) is speakable


def test_has_cjk() -> None:
    assert has_cjk("温度")
    assert not has_cjk("temperature ü")


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "empty_text"),
        ("   \n ", "empty_text"),
        ("\x00\x01", "nothing_speakable"),
        ("🎉🎉", "nothing_speakable"),
        ("?!...", "nothing_speakable"),
        ("x" * 11, "text_too_long"),
    ],
)
def test_prepare_text_refuses(text: str, code: str) -> None:
    with pytest.raises(RequestError) as caught:
        prepare_text(text, max_chars=10)
    assert caught.value.code == code


def test_prepare_text_drops_unspeakable_fragments() -> None:
    assert prepare_text("Hello! 🎉 Bye.", max_chars=100) == ["Hello!", "🎉 Bye."]


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("Hello [uv_break] there [laugh].", "Hello there."),
        ("[speed_3][oral_2]Dinner is ready [lbreak]", "Dinner is ready"),
        ("客厅的灯[laugh_1]已经打开了[break_4]。", "客厅的灯 已经打开了。"),
        ("[laugh]", ""),
        ("Room [12] and [note] stay", "Room [12] and [note] stay"),
        ("No tags at all.", "No tags at all."),
    ],
)
def test_drop_chattts_tags(text: str, spoken: str) -> None:
    assert drop_chattts_tags(text) == spoken


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("The bins go out at 7 p.m. tomorrow.", ["The bins go out at 7 p.m. tomorrow."]),
        ("We leave at 7 p.m. Dinner is at 8.", ["We leave at 7 p.m.", "Dinner is at 8."]),
        ("The U.S. grid is stable. Good.", ["The U.S. grid is stable.", "Good."]),
        ("Prof. Lee is here.", ["Prof. Lee is here."]),
        (
            "Gen. Grant and Capt. Hook are at the door.",
            ["Gen. Grant and Capt. Hook are at the door."],
        ),
        ("See Fig. 3 for the wiring. Thanks.", ["See Fig. 3 for the wiring.", "Thanks."]),
        ("Dr. Miller called. It is 3.5 degrees.", ["Dr. Miller called.", "It is 3.5 degrees."]),
        ("It was approx. 5 kWh, e.g. the dryer.", ["It was approx. 5 kWh, e.g. the dryer."]),
        ("Collection on Dec. 5 at 9 a.m. sharp.", ["Collection on Dec. 5 at 9 a.m. sharp."]),
        ("Lunch is at 12.30. Be on time.", ["Lunch is at 12.30.", "Be on time."]),
        ("Arsenal vs. Chelsea is on. Enjoy.", ["Arsenal vs. Chelsea is on.", "Enjoy."]),
    ],
)
def test_split_knows_abbreviations_and_initials(text: str, sentences: list[str]) -> None:
    assert split_sentences(clean(text)) == sentences


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list(" \n\t.a\u00a0\u200b\u2028e\u0301\u0327你!"))),
    st.lists(st.integers(min_value=1, max_value=5), max_size=20),
)
def test_streamed_cleaning_equals_cleaning_the_whole(text: str, cuts: list[int]) -> None:
    cleaner = StreamCleaner()
    out, start = [], 0
    for size in cuts:
        out.append(cleaner.feed(text[start : start + size]))
        start += size
    out.append(cleaner.feed(text[start:]))
    out.append(cleaner.finish())
    assert "".join(out) == clean(text)


def test_streamed_whitespace_is_not_kept() -> None:
    cleaner = StreamCleaner()
    assert cleaner.feed("   \n\u200b  ") == ""
    assert cleaner.feed("Hi") == "H"  # the last character waits for what may compose with it
    assert cleaner.feed("   ") == "i"
    assert cleaner.feed("there") == " ther"
    assert cleaner.finish() == "e"
