"""Pacing a stream: how much more audio may be made before a listener would wait (in process,
on a clock the test moves)."""

from __future__ import annotations

import pytest

from tts_bridge.audio.pacing import SAFETY, PlayClock, take_within


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_is_a_share_of_what_is_still_to_play() -> None:
    clock = Clock()
    playing = PlayClock(clock)
    assert playing.budget_s() == 0.0  # nothing sent: nothing to hide work behind
    playing.sent(2.0)  # playing starts now
    clock.now += 0.5
    playing.sent(1.0)
    assert playing.ahead_s() == pytest.approx(2.5)
    assert playing.budget_s() == pytest.approx(SAFETY * 2.5)
    clock.now += 10.0  # the listener has heard it all
    assert playing.ahead_s() == 0.0 and playing.budget_s() == 0.0


def test_as_many_items_as_fit_and_never_none() -> None:
    assert take_within([1.0, 1.0, 1.0], 2.5) == 2
    assert take_within([1.0, 1.0, 1.0], 3.0) == 3  # exactly fits
    assert take_within([1.0, 1.0, 1.0], 100.0) == 3
    assert take_within([5.0, 1.0], 2.0) == 1  # over the budget alone: still one
    assert take_within([1.0], 0.0) == 1
