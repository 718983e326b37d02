"""The WER benchmark's scoring (the benchmark itself needs the recogniser and is not a test)."""

from __future__ import annotations

import pytest

from tts_bridge.bench.wer import ANNOUNCEMENTS, edit_distance, score_words


@pytest.mark.parametrize(
    ("heard", "said"),
    [
        ("It is 21.5°C.", "It is twenty-one point five degrees Celsius."),
        ("Arrive at 7.30 p.m.", "arrive at seven thirty p m"),
        ("Dr. Miller's here", "Doctor Millers here"),
        ("Mr. and Mrs. Smith", "mister and missus smith"),
    ],
)
def test_the_same_words_score_alike(heard: str, said: str) -> None:
    assert score_words(heard) == score_words(said)


def test_letters_are_not_the_unit() -> None:
    reference = score_words("fourteen point two kilowatt hours")
    assert edit_distance(reference, score_words("14.2 K-W-H")) == 3


def test_edit_distance() -> None:
    assert edit_distance(["a", "b", "c"], ["a", "b", "c"]) == 0
    assert edit_distance(["a", "b", "c"], ["a", "x", "c", "d"]) == 2
    assert edit_distance(["a", "b"], []) == 2
    assert edit_distance([], ["a"]) == 1


def test_the_set_is_realistic_and_its_references_are_words() -> None:
    assert len(ANNOUNCEMENTS) >= 40
    for item in ANNOUNCEMENTS:
        assert not any(c.isdigit() for c in item.said), item
