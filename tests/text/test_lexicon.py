"""The pronunciation lexicon's matching: whole words, case, phrases, longest first."""

from __future__ import annotations

import pytest

from tts_bridge.text.lexicon import Lexicon, LexiconError, make_entry


def _lexicon(*entries: tuple[str, str] | tuple[str, str, str]) -> Lexicon:
    return Lexicon(make_entry(*e) for e in entries)


def test_whole_words_in_any_case() -> None:
    lex = _lexicon(("Nguyen", "win"))
    assert lex.apply("Call Mrs Nguyen, NGUYEN and nguyen.") == "Call Mrs win, win and win."
    assert lex.apply("Nguyenville and the Nguyens") == "Nguyenville and the Nguyens"
    assert lex.apply("Nguyen's car") == "win's car"


def test_phrases_and_the_longest_entry_win() -> None:
    lex = _lexicon(("St", "street"), ("St Albans", "saint albans"))
    assert lex.apply("From St  Albans to Main St.") == "From saint albans to Main street."


def test_an_acronym_matches_only_as_written() -> None:
    lex = _lexicon(("US", "you ess"))
    assert lex.apply("Tell us about the US.") == "Tell us about the you ess."


def test_phonemes_for_engines_that_take_them() -> None:
    lex = _lexicon(("Worcester", "wuster", "wˈʊstɚ"), ("Siobhan", "shiv awn"))
    text = "Siobhan is in Worcester."
    assert lex.apply(text) == "shiv awn is in wuster."
    assert lex.apply(text, phonemes=True) == "shiv awn is in [[ wˈʊstɚ ]]."


def test_symbols_in_words_are_literal() -> None:
    lex = _lexicon(("C++", "see plus plus"), ("a.m.", "in the morning"))
    assert (
        lex.apply("I like C++ at 7 a.m. daily") == "I like see plus plus at 7 in the morning daily"
    )


@pytest.mark.parametrize(
    ("word", "say", "reason"),
    [
        ("", "x", "empty"),
        ("x" * 65, "y", "limit"),
        ("!!", "bang", "no letters"),
        ("ok", "", "empty"),
        ("ok", "[[ oʊ ]]", "phonemes"),
        ("ok\x00", "okay", "control"),
    ],
)
def test_bad_entries_are_refused(word: str, say: str, reason: str) -> None:
    with pytest.raises(LexiconError, match=reason):
        make_entry(word, say)
