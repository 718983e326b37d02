"""One loudness for every voice: ITU BS.1770 integrated loudness with a true-peak cap.

Voices differ by several dB out of their engines, so when the fast voice answers for the
quality voice, or a chime precedes a voice, the listener hears a jump. Each sentence is measured
and scaled to `synthesis.loudness_lufs` before it is cached, so a cache hit costs nothing more.
Raising speech to the target brings its few highest peaks near full scale, so a look-ahead
limiter keeps the true peak (estimated on 4x oversampled audio, as BS.1770 annex 2 does) under
`synthesis.true_peak_dbtp`: the few peaks of speech are turned down over a few milliseconds, the
speech around them keeps the target loudness. The meter and the true peak are in bs1770.py (numpy
only); the limiter runs only when a true peak is over the ceiling, and when it changed nothing
the loudness after the gain follows from the blocks measured before it.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import numpy.typing as npt

from tts_bridge.audio.codec import Int16Audio
from tts_bridge.speech import bs1770

_LOGGER = logging.getLogger(__name__)
FloatArray = npt.NDArray[np.float64]

_BLOCK_S = 0.4
"""BS.1770's gating block: shorter audio has no integrated loudness of its own."""
_SILENT_LUFS = -70.0
"""BS.1770's absolute gate: anything quieter is silence and keeps its level."""
_MAX_GAIN_DB = 30.0
"""A very quiet sentence (a whisper, a glitch) is not raised into noise."""


class LoudnessNormalizer:
    """Measures and scales 16-bit mono PCM to one integrated loudness (thread-safe)."""

    def __init__(self, target_lufs: float | None, true_peak_dbtp: float) -> None:
        self.target_lufs = target_lufs
        """None: audio is left as the engine made it."""
        self.true_peak_dbtp = true_peak_dbtp

    @property
    def enabled(self) -> bool:
        return self.target_lufs is not None

    def cache_field(self) -> str:
        """What goes into a sentence's cache key: audio at another target is other audio."""
        if self.target_lufs is None:
            return "off"
        return f"{self.target_lufs:g}LUFS/{self.true_peak_dbtp:g}dBTP"

    def measure(self, pcm: npt.NDArray[np.generic], sample_rate: int) -> float:
        """Integrated loudness in LUFS (-inf for silence or no audio).

        Audio shorter than one gating block ("Yes.") is measured repeated end to end up to a
        block: the loudness of the sound itself, where padding it with silence would measure
        it quieter than it is."""
        meter = _Meter.of(_as_float(pcm), sample_rate)
        return -math.inf if meter is None else meter.loudness(1.0)

    def normalize(self, pcm: Int16Audio, sample_rate: int) -> tuple[Int16Audio, float]:
        """`pcm` at the target loudness with its true peak under the ceiling, and the gain
        applied in dB (before the limiter)."""
        if self.target_lufs is None or pcm.size == 0:
            return pcm, 0.0
        samples = _as_float(pcm)
        meter = _Meter.of(samples, sample_rate)
        loudness = -math.inf if meter is None else meter.loudness(1.0)
        if meter is None or not math.isfinite(loudness) or loudness < _SILENT_LUFS:
            return pcm, 0.0
        ceiling = 10 ** (self.true_peak_dbtp / 20)
        gain = min(self.target_lufs - loudness, _MAX_GAIN_DB)
        peaks, peaks_up_to = samples, 0.0  # true peaks at unit gain, exact up to that gain
        for round_ in range(1, _ROUNDS + 1):
            # The limiter takes a little loudness off the peaks' surroundings: measured again
            # and made up for, so the answer lands on the target rather than under it.
            scale = 10 ** (gain / 20)
            if scale > peaks_up_to:  # the true peaks scale with the gain: found once
                peaks_up_to = scale * _PEAKS_HEADROOM
                peaks = bs1770.true_peaks(samples, ceiling / peaks_up_to)
            limiting = _limiter_gains(peaks, scale, sample_rate, ceiling)
            if round_ == _ROUNDS:  # the last round's audio is the answer, whatever it measures
                break
            missing = self.target_lufs - meter.loudness(scale, limiting, samples)
            if abs(missing) < _CLOSE_LU or gain + missing > _MAX_GAIN_DB:
                break
            gain += missing
        out = samples * (scale * 32768.0)
        if limiting is not None:
            near, factor = limiting
            out[near] *= factor
        return _rounded(out), gain

    def gain_to_target(self, pcm: Int16Audio, sample_rate: int) -> float:
        """The plain gain from `pcm`'s loudness to the target (0 for silence or when off)."""
        if self.target_lufs is None:
            return 0.0
        loudness = self.measure(pcm, sample_rate)
        if not math.isfinite(loudness) or loudness < _SILENT_LUFS:
            return 0.0
        return min(self.target_lufs - loudness, _MAX_GAIN_DB)

    def scaled(self, pcm: Int16Audio, sample_rate: int, gain_db: float) -> Int16Audio:
        """`pcm` times `gain_db`, its peaks limited under the ceiling (unchanged when off)."""
        if self.target_lufs is None or pcm.size == 0:
            return pcm
        ceiling = 10 ** (self.true_peak_dbtp / 20)
        return _to_pcm16(limit_peaks(_as_float(pcm) * 10 ** (gain_db / 20), sample_rate, ceiling))


class PieceLevel:
    """The level of one sentence that goes out in pieces before it is complete (a streaming
    engine): its own loudness is known only at its end, so every piece gets one gain, the
    voice's recent one or else the first piece's own, and is limited on its own; the sentence
    as cached is those pieces joined, so a stream joins to the answer sample for sample."""

    def __init__(self, normalizer: LoudnessNormalizer, sample_rate: int, recent: float | None):
        self._normalizer = normalizer
        self._rate = sample_rate
        self.gain = recent
        self._pieces: list[Int16Audio] = []
        self.seconds = 0.0
        """Time spent levelling the pieces (the request's loudness stage)."""
        self.sent_whole: Int16Audio | None = None
        """The sentence, when it went out as one part at its own loudness (not in pieces):
        what is cached, without measuring it again."""

    @property
    def used(self) -> bool:
        return bool(self._pieces)

    def piece(self, pcm: Int16Audio) -> Int16Audio:
        started = time.perf_counter()
        if self.gain is None:
            self.gain = self._normalizer.gain_to_target(pcm, self._rate)
        out = self._normalizer.scaled(pcm, self._rate, self.gain)
        self._pieces.append(out)
        self.seconds += time.perf_counter() - started
        return out

    def whole(self, exact: Int16Audio | None) -> Int16Audio:
        """The sentence: the pieces joined, or (an engine that ends with exact audio after an
        approximate start) the exact audio at the pieces' gain."""
        if exact is not None:
            return self._normalizer.scaled(exact, self._rate, self.gain or 0.0)
        return np.concatenate(self._pieces)


_ROUNDS = 3
_PEAKS_HEADROOM = 10 ** (1 / 20)
"""The true peaks are found exact for gains up to 1 dB above the first round's (the make-up of
the later rounds is a fraction of a dB; more, and they are found again)."""
_CLOSE_LU = 0.05
_LOOKAHEAD_S = 0.005
"""How early the limiter starts to turn a peak down (and how long it takes to come back):
short enough to stay inaudible on speech, long enough not to distort a waveform's cycle."""


def limit_peaks(samples: npt.NDArray[np.float64], sample_rate: int, ceiling: float) -> FloatArray:
    """A look-ahead peak limiter: the gain needed under each sample's true peak (4x
    oversampled), spread over the look-ahead window both ways (a minimum, then a moving
    average of the same width, which never exceeds the gain any sample in it needs), so a
    peak is turned down smoothly instead of clipped. `samples` itself when no true peak is
    over the ceiling."""
    return _limit(samples, bs1770.true_peaks(samples, ceiling), 1.0, sample_rate, ceiling)


def _limit(
    scaled: FloatArray, peaks: FloatArray, scale: float, sample_rate: int, ceiling: float
) -> FloatArray:
    """limit_peaks of `scaled`, `scale` times audio whose true peaks are `peaks`."""
    limiting = _limiter_gains(peaks, scale, sample_rate, ceiling)
    if limiting is None:
        return scaled
    near, factor = limiting
    out = scaled.copy()
    out[near] *= factor
    return out


def _limiter_gains(
    peaks: FloatArray, scale: float, sample_rate: int, ceiling: float
) -> tuple[npt.NDArray[np.intp], FloatArray] | None:
    """The limiter's gains for `scale` times audio whose true peaks are `peaks`: the indices
    where they are not 1, and the gains there; None when no peak is over the ceiling."""
    over = np.flatnonzero(peaks > ceiling / scale)
    if over.size == 0:
        return None
    half = max(1, round(_LOOKAHEAD_S * sample_rate))
    width = 2 * half + 1
    # The gain differs from 1 only within 2 x half of a sample over the ceiling (a minimum, then
    # an average, each over half both ways): smoothed on those samples alone, run together. Each
    # run starts and ends with half samples that need no limiting, so a window crossing from one
    # run into the next sees only gains of 1, as it would in the whole signal.
    near = bs1770.spans(over, 2 * half, 2 * half, peaks.size)
    needed = np.ones(near.size)
    needed[np.searchsorted(near, over)] = ceiling / (peaks[over] * scale)
    smooth = _moving_average(_running_min(needed, width), width)
    # The moving average's rounding can lift it a hair above a sample's need.
    return near, np.minimum(smooth, needed)


class _Meter:
    """The loudness of one sentence at any gain, with or without what a limiter takes off,
    from one pass of the filter: the filter is linear, so the sentence times a gain is the
    weighted sentence times it, and what the limiter takes off (near the peaks only) is
    filtered on its own, where its weighting is not negligible, and subtracted."""

    def __init__(self, samples: FloatArray, sample_rate: int, resized: bool) -> None:
        self._rate = sample_rate
        self._resized = resized
        """Shorter than a gating block, measured repeated (see `measure`): measured anew."""
        self._weighted = bs1770.k_weighted(samples, sample_rate)
        self._bounds = bs1770.segment_bounds(samples.size, sample_rate)
        self._segments = bs1770.segment_energies(self._weighted, self._bounds)

    @classmethod
    def of(cls, samples: FloatArray, sample_rate: int) -> _Meter | None:
        """None for silence or no audio."""
        if samples.size == 0 or not np.any(samples):
            return None
        block = math.ceil(_BLOCK_S * sample_rate) + 1
        if samples.size < block:
            return cls(np.resize(samples, block), sample_rate, resized=True)
        return cls(samples, sample_rate, resized=False)

    def loudness(
        self,
        scale: float,
        limiting: tuple[npt.NDArray[np.intp], FloatArray] | None = None,
        samples: FloatArray | None = None,
    ) -> float:
        """LUFS of `samples` (the measured ones) x `scale`, limited by `limiting`."""
        if limiting is None:
            return bs1770.gated_loudness(bs1770.energies_of(self._segments, self._rate) * scale**2)
        assert samples is not None
        near, factor = limiting
        if self._resized:
            out = samples * scale
            out[near] *= factor
            meter = _Meter.of(out, self._rate)
            return -math.inf if meter is None else meter.loudness(1.0)
        taken = samples[near] * scale * (1.0 - factor)
        where, change = bs1770.k_weighted_where(taken, near, samples.size, self._rate)
        segments = bs1770.changed_segments(
            self._segments, self._bounds, self._weighted, scale, where, change
        )
        return bs1770.gated_loudness(bs1770.energies_of(segments, self._rate))


def _running_min(values: FloatArray, width: int) -> FloatArray:
    """The minimum over a centred window of odd `width`, the ends repeated outward (in O(n):
    the minimum of a block's suffix and of the next block's prefix)."""
    half = width // 2
    padded = np.pad(values, (half, half), mode="edge")
    blocks = -(-padded.size // width)
    grid = np.full(blocks * width, np.inf)
    grid[: padded.size] = padded
    # One block per column: the accumulation runs down the rows, across all blocks at once.
    columns = np.ascontiguousarray(grid.reshape(blocks, width).T)
    prefix = np.minimum.accumulate(columns, axis=0).T.reshape(-1)
    suffix = np.minimum.accumulate(columns[::-1], axis=0)[::-1].T.reshape(-1)
    count = values.size
    return np.minimum(suffix[:count], prefix[width - 1 : width - 1 + count])


def _moving_average(values: FloatArray, width: int) -> FloatArray:
    """The mean over a centred window of odd `width`, the ends mirrored outward."""
    half = width // 2
    padded = np.pad(values, (half, half), mode="symmetric")
    total = np.concatenate(([0.0], np.cumsum(padded)))
    return (total[width:] - total[:-width]) / width


def _to_pcm16(samples: npt.NDArray[np.float64]) -> Int16Audio:
    return _rounded(samples * 32768.0)


def _rounded(scaled: FloatArray) -> Int16Audio:
    """16-bit samples from full-scale ones, rounded and clipped (`scaled` is overwritten)."""
    np.rint(scaled, out=scaled)
    np.clip(scaled, -32768, 32767, out=scaled)
    return scaled.astype("<i2")


def _as_float(pcm: npt.NDArray[np.generic]) -> FloatArray:
    array = np.asarray(pcm)
    if array.dtype == np.int16:  # 1/32768 is a power of two: exactly the division
        return np.multiply(array, 1 / 32768.0, dtype=np.float64)
    return array.astype(np.float64)


def true_peak_dbfs(pcm: npt.NDArray[np.generic], sample_rate: int) -> float:
    """The peak of the audio between its samples too (4x oversampled), in dBFS."""
    samples = _as_float(pcm)
    if samples.size == 0:
        return -math.inf
    peak = float(bs1770.true_peaks(samples, float(np.abs(samples).max())).max())
    return 20 * math.log10(peak) if peak > 0 else -math.inf


def apply_gain(pcm: Int16Audio, gain_db: float) -> Int16Audio:
    """`pcm` scaled by `gain_db`, clipped to 16 bits (a no-op at 0 dB)."""
    if gain_db == 0.0 or pcm.size == 0:
        return pcm
    scaled = np.round(pcm.astype(np.float64) * 10 ** (gain_db / 20))
    return np.asarray(np.clip(scaled, -32768, 32767), dtype="<i2")
