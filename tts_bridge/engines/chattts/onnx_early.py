"""An early, approximate start for a streamed generation on the streaming step graphs.

Exact streamed audio trails the generated codes by the decoders' lookahead (at full size 52
codes, over a second of generation): the first exact piece waits for its own codes plus all of
those. ``EarlyStream`` starts sooner. Once ``EarlyStart.codes + EarlyStart.context`` codes exist
it sends a preview (``StatefulStreamingDecoder.preview``: the decoders flushed on copies of
their state, as if the text ended there) up to ``codes`` codes, so each sample of it has
``context`` real codes to its right instead of the lookahead's 52. While the exact decoder has
not reached the audio already sent, further previews follow only when the audio sent would
otherwise run out before the next chance (tracked by wall clock: when playback of the first
piece began, the step time measured so far, and what a preview cost); then the exact pieces
follow from where the previews ended.

Each piece holds back its last ``crossfade`` samples, and they are crossfaded with the next
source's samples for the same span (the next preview's, or the exact ones): no step where two
approximations, or an approximation and the exact audio, meet. Every sample is sent once, in
order; from the end of the last crossfade on, the samples are the exact decoder's own, and the
exact audio of the whole generation is kept (``exact``) for the cache, without a second decode.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from tts_bridge.engines.base import FloatAudio
from tts_bridge.engines.chattts.onnx_stream import StatefulStreamingDecoder

__all__ = ["EarlyReport", "EarlyStart", "EarlyStream", "crossfade", "snr_db"]

_LOGGER = logging.getLogger(__name__)

SAMPLES_PER_CODE = 512
"""One audio code is two mel frames of 256 samples (21.3 ms at 24 kHz)."""


@dataclass(frozen=True)
class EarlyStart:
    """How a streamed generation starts before its first samples are final."""

    codes: int = 8
    """Codes of audio the first piece covers (less the crossfade held back): what the
    listener has to play while the next piece is made."""
    context: int = 8
    """Real codes to the right of every approximate sample when it is sent (the right-hand
    context the preview sees before its zero padding)."""
    crossfade: int = 240
    """Samples (10 ms) held back at the end of each approximate piece and crossfaded with
    the next samples for that span."""
    guard_s: float = 0.03
    """Slack kept when deciding whether a preview can wait one more step."""

    def __post_init__(self) -> None:
        if self.codes < 1 or self.context < 1:
            raise ValueError("an early start needs at least one code and one code of context")
        if not 0 <= self.crossfade < self.codes * SAMPLES_PER_CODE:
            raise ValueError("the crossfade must be shorter than the first piece")

    @property
    def first_codes(self) -> int:
        """Codes that must exist before the first piece goes out."""
        return self.codes + self.context


@dataclass
class EarlyReport:
    """What an early start did, for the log, the bench and the tests."""

    first_codes: int = 0
    """Codes generated when the first piece was sent (0: no early piece was sent)."""
    approximate: int = 0
    """Samples from the start that are approximate or crossfaded; after them, all are exact."""
    previews: int = 0
    """Approximate pieces sent."""
    snr_db: float | None = None
    """Signal-to-noise ratio of the approximate samples sent against the exact ones (at the
    end of the generation; None without approximate samples)."""
    stalls_s: float = 0.0
    """Wall-clock time a listener playing each piece as it came would have waited for the
    next one after the first (codes generated slower than real time leave gaps)."""


def crossfade(old: FloatAudio, new: FloatAudio) -> FloatAudio:
    """``old`` fading out into ``new`` (same length) with a raised-cosine ramp: the two are
    versions of the same signal, so their gains sum to one."""
    if old.size != new.size:
        raise ValueError("crossfaded spans differ in length")
    ramp = 0.5 - 0.5 * np.cos(np.pi * (np.arange(old.size, dtype=np.float32) + 0.5) / old.size)
    return np.asarray(old * (1.0 - ramp) + new * ramp, dtype=np.float32)


def snr_db(approximate: npt.NDArray[np.float32], exact: npt.NDArray[np.float32]) -> float:
    """10 log10 of the exact signal's energy over the difference's (inf when equal)."""
    error = float(np.sum((approximate.astype(np.float64) - exact) ** 2))
    signal = float(np.sum(exact.astype(np.float64) ** 2))
    if error == 0.0:
        return math.inf
    return 10.0 * math.log10(max(signal, 1e-30) / error)


_Phase = Literal["waiting", "previewing", "exact"]


class EarlyStream:
    """The pieces of one generation, early start included (see the module docstring).

    ``push`` is called after every generated code with every hidden state so far and returns
    the samples to send now (often none); ``finish`` with the last states returns the rest.
    ``schedule`` is the exact pieces' sizes in codes, as the engine streams without an early
    start (the last size repeats). ``clock`` is the wall clock in seconds (a test passes its own).
    """

    def __init__(
        self,
        decoder: StatefulStreamingDecoder,
        settings: EarlyStart,
        schedule: Sequence[int],
        *,
        sample_rate: int = 24_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._decoder = decoder
        self._settings = settings
        self._schedule = tuple(schedule)
        self._sizes: Iterator[int] = iter(self._schedule)
        self._due = 0
        self._rate = sample_rate
        self._clock = clock
        self._phase: _Phase = "waiting"
        self._exact: list[FloatAudio] = []
        self._exact_size = 0
        self._sent = 0
        """Samples sent so far (the held tail starts here)."""
        self._held = np.zeros(0, dtype=np.float32)
        self._approximate: list[FloatAudio] = []
        """The approximate and crossfaded samples sent, from sample 0 on."""
        self._playback_ends: float | None = None
        """When the audio sent so far will have played (playback starts with the first piece
        and, after a gap, resumes with the next)."""
        self._left_at: float | None = None
        """When the last ``push`` returned: the time until the next is the code loop's."""
        self._step_s: float | None = None
        self._preview_s = 0.0
        self.report = EarlyReport()

    @property
    def exact(self) -> FloatAudio:
        """The exact audio decoded so far (all of it after ``finish``)."""
        if len(self._exact) > 1:
            self._exact = [np.concatenate(self._exact)]
        return self._exact[0] if self._exact else np.zeros(0, dtype=np.float32)

    def push(self, hiddens: npt.NDArray[np.float32]) -> FloatAudio:
        """The samples to send now that ``hiddens`` (every state so far) exist."""
        arrived = self._clock()
        if self._left_at is not None:
            step = arrived - self._left_at
            self._step_s = step if self._step_s is None else 0.7 * self._step_s + 0.3 * step
        try:
            return self._sending(self._push(hiddens, arrived))
        finally:
            self._left_at = self._clock()

    def finish(self, hiddens: npt.NDArray[np.float32]) -> FloatAudio:
        """The rest of the audio: no state follows ``hiddens``."""
        self._add_exact(self._decoder.push(hiddens, final=True))
        out = self._join_exact() if self._phase == "previewing" else self._rest()
        self._phase = "exact"
        self._sending(out)
        if self._approximate:
            sent = np.concatenate(self._approximate)
            self.report.snr_db = snr_db(sent, self.exact[: sent.size])
        return out

    # -- the phases ------------------------------------------------------------------------

    def _push(self, hiddens: npt.NDArray[np.float32], now: float) -> FloatAudio:
        codes = hiddens.shape[0]
        if self._phase == "waiting":
            if codes < self._settings.first_codes:
                return np.zeros(0, dtype=np.float32)
            self.report.first_codes = codes
            return self._preview(hiddens)
        if self._phase == "previewing":
            return self._previewing(hiddens, now)
        if self._decoder.ready(codes) - self._exact_size >= self._due:
            self._add_exact(self._decoder.push(hiddens))
            self._due = next(self._sizes, self._schedule[-1]) * SAMPLES_PER_CODE
            return self._rest()
        return np.zeros(0, dtype=np.float32)

    def _previewing(self, hiddens: npt.NDArray[np.float32], now: float) -> FloatAudio:
        """Between the first piece and the exact ones: join the exact audio once it covers
        everything sent and held, else preview again only if waiting would starve playback."""
        if self._decoder.ready(hiddens.shape[0]) >= self._sent + self._held.size:
            self._add_exact(self._decoder.push(hiddens))
            return self._join_exact()
        if self._runs_out_before_next_step(now):
            return self._preview(hiddens)
        return np.zeros(0, dtype=np.float32)

    def _runs_out_before_next_step(self, now: float) -> bool:
        """Whether the audio sent would run out before a piece made after one more code."""
        assert self._playback_ends is not None
        wait = (self._step_s or 0.0) + self._preview_s + self._settings.guard_s
        return now + wait >= self._playback_ends

    def _sending(self, piece: FloatAudio) -> FloatAudio:
        """Note ``piece`` going out now, for the playback clock."""
        if piece.size:
            now = self._clock()
            if self._playback_ends is None:
                self._playback_ends = now
            elif now > self._playback_ends:
                self.report.stalls_s += now - self._playback_ends
            self._playback_ends = max(self._playback_ends, now) + piece.size / self._rate
        return piece

    def _preview(self, hiddens: npt.NDArray[np.float32]) -> FloatAudio:
        """Send approximate samples up to ``context`` codes before the newest, holding back
        the crossfade; none while that would add less than the first piece did.

        Each preview decodes the stacks' right padding again (before the exact decoder has
        started, the whole text so far), so when the codes come slower than real time a
        preview at every code would cost more than it plays: a piece is at least as long as
        the first, and playback waits for it instead."""
        hold = self._settings.crossfade
        end = (hiddens.shape[0] - self._settings.context) * SAMPLES_PER_CODE
        if end - hold - self._sent < self._settings.codes * SAMPLES_PER_CODE - hold:
            return np.zeros(0, dtype=np.float32)
        started = self._clock()
        # The exact state first: its new frames are decoded once, and the preview then adds
        # only the flush (the right padding) on top of them.
        self._add_exact(self._decoder.push(hiddens))
        preview = self._decoder.preview(hiddens)
        # Where a sample is final already, the exact one is taken, else the preview's.
        done = self._exact_size
        span = [self.exact[self._sent :]] if self._sent < done else []
        span.append(preview[max(0, self._sent - done) : end - done])
        fresh = np.concatenate(span)
        out = fresh[: fresh.size - hold].copy()
        if self._held.size:
            out[: self._held.size] = crossfade(self._held, out[: self._held.size])
        self._held = fresh[fresh.size - hold :].copy()
        self._sent += out.size
        self._approximate.append(out)
        self.report.previews += 1
        self.report.approximate = self._sent + self._held.size
        self._phase = "previewing"
        self._preview_s = self._clock() - started
        return out

    def _join_exact(self) -> FloatAudio:
        """The held tail crossfaded into the exact samples, and the exact ones after it."""
        out = self.exact[self._sent :].copy()
        if self._held.size:
            out[: self._held.size] = crossfade(self._held, out[: self._held.size])
            self._approximate.append(out[: self._held.size].copy())
        self._sent += out.size
        self._held = np.zeros(0, dtype=np.float32)
        self._phase = "exact"
        self._due = next(self._sizes, self._schedule[-1]) * SAMPLES_PER_CODE
        return out

    def _rest(self) -> FloatAudio:
        out = self.exact[self._sent :]
        self._sent += out.size
        return out

    def _add_exact(self, audio: FloatAudio) -> None:
        if audio.size:
            self._exact.append(audio)
            self._exact_size += audio.size
