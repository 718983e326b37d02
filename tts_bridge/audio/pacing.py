"""How much more audio to make before a listener who already hears a stream would wait.

A stream's first piece is short, so it starts soon; each next piece may be as long as the
machine makes in a share of the time the audio already sent still plays. A fast machine makes
the rest of a sentence at once (fewer joins), a slow one in growing pieces, and the listener,
who started with the first piece, never waits. Piper's windows of latent frames and the
clauses of an engine without a stream of its own are both paced this way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

Piece = TypeVar("Piece")

SAFETY = 0.5
"""A next piece is made in at most this share of the time the audio before it plays."""


class PlayClock:
    """The audio handed to a listener so far, and how long of it is still to play if playing
    began when the first piece was handed over."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self._sent_s = 0.0

    def sent(self, seconds: float) -> None:
        """A piece of `seconds` of audio was handed over (the first one starts the clock)."""
        now = self._clock()
        if self._started is None:
            self._started = now
        self._sent_s += seconds

    def ahead_s(self) -> float:
        """Seconds of the audio sent still to play (0 when the listener has caught up)."""
        if self._started is None:
            return 0.0
        return max(self._sent_s - (self._clock() - self._started), 0.0)

    def budget_s(self) -> float:
        """Seconds of work the next piece may take."""
        return SAFETY * self.ahead_s()

    def counting(
        self, send: Callable[[Piece], None], seconds: Callable[[Piece], float]
    ) -> Callable[[Piece], None]:
        """`send`, each piece it hands over noted (once it went) as `seconds(piece)` of audio."""

        def counted(piece: Piece) -> None:
            send(piece)
            self.sent(seconds(piece))

        return counted


def take_within(costs: Sequence[float], budget: float) -> int:
    """How many of the next items (each costing `costs[i]`) fit in `budget` together: at
    least one, so a stream always moves on."""
    total = 0.0
    for count, cost in enumerate(costs):
        total += cost
        if total > budget:
            return max(count, 1)
    return len(costs)
