"""One loudness for every voice: ITU BS.1770 integrated loudness (pyloudnorm) with a true-peak cap.

Voices differ by several dB out of their engines, so when the fast voice answers for the
quality voice, or a chime precedes a voice, the listener hears a jump. Each sentence is measured
and scaled to `synthesis.loudness_lufs` before it is cached, so a cache hit costs nothing more.
Engines that normalize to full-scale peaks (Piper) leave no room to raise them, so a look-ahead
limiter keeps the true peak (estimated on 4x oversampled audio, as BS.1770 annex 2 does) under
`synthesis.true_peak_dbtp`: the few peaks of speech are turned down over a few milliseconds, the
speech around them keeps the target loudness.
"""

from __future__ import annotations

import logging
import math
import threading

import numpy as np
import numpy.typing as npt
import pyloudnorm
import soxr
from scipy.ndimage import minimum_filter1d, uniform_filter1d

from tts_bridge.audio import Int16Audio

_LOGGER = logging.getLogger(__name__)
FloatArray = npt.NDArray[np.float64]

_BLOCK_S = 0.4
"""BS.1770's gating block: shorter audio has no integrated loudness of its own."""
_OVERSAMPLE = 4
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
        self._meters: dict[int, pyloudnorm.Meter] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.target_lufs is not None

    def cache_field(self) -> str:
        """What goes into a sentence's cache key: audio at another target is other audio."""
        if self.target_lufs is None:
            return "off"
        return f"{self.target_lufs:g}LUFS/{self.true_peak_dbtp:g}dBTP"

    def _meter(self, sample_rate: int) -> pyloudnorm.Meter:
        with self._lock:
            meter = self._meters.get(sample_rate)
            if meter is None:
                meter = pyloudnorm.Meter(sample_rate)
                self._meters[sample_rate] = meter
            return meter

    def measure(self, pcm: npt.NDArray[np.generic], sample_rate: int) -> float:
        """Integrated loudness in LUFS (-inf for silence or no audio).

        Audio shorter than one gating block ("Yes.") is measured repeated end to end up to a
        block: the loudness of the sound itself, where padding it with silence would measure
        it quieter than it is."""
        samples = _as_float(pcm)
        if samples.size == 0 or not np.any(samples):
            return -math.inf
        block = math.ceil(_BLOCK_S * sample_rate) + 1
        if samples.size < block:
            samples = np.resize(samples, block)
        return float(self._meter(sample_rate).integrated_loudness(samples))

    def normalize(self, pcm: Int16Audio, sample_rate: int) -> tuple[Int16Audio, float]:
        """`pcm` at the target loudness with its true peak under the ceiling, and the gain
        applied in dB (before the limiter)."""
        if self.target_lufs is None or pcm.size == 0:
            return pcm, 0.0
        samples = _as_float(pcm)
        loudness = self.measure(samples, sample_rate)
        if not math.isfinite(loudness) or loudness < _SILENT_LUFS:
            return pcm, 0.0
        ceiling = 10 ** (self.true_peak_dbtp / 20)
        gain = min(self.target_lufs - loudness, _MAX_GAIN_DB)
        out = samples
        for _ in range(_ROUNDS):
            # The limiter takes a little loudness off the peaks' surroundings: measured again
            # and made up for, so the answer lands on the target rather than under it.
            out = limit_peaks(samples * 10 ** (gain / 20), sample_rate, ceiling)
            missing = self.target_lufs - self.measure(out, sample_rate)
            if abs(missing) < _CLOSE_LU or gain + missing > _MAX_GAIN_DB:
                break
            gain += missing
        return _to_pcm16(out), gain

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

    @property
    def used(self) -> bool:
        return bool(self._pieces)

    def piece(self, pcm: Int16Audio) -> Int16Audio:
        if self.gain is None:
            self.gain = self._normalizer.gain_to_target(pcm, self._rate)
        out = self._normalizer.scaled(pcm, self._rate, self.gain)
        self._pieces.append(out)
        return out

    def whole(self, exact: Int16Audio | None) -> Int16Audio:
        """The sentence: the pieces joined, or (an engine that ends with exact audio after an
        approximate start) the exact audio at the pieces' gain."""
        if exact is not None:
            return self._normalizer.scaled(exact, self._rate, self.gain or 0.0)
        return np.concatenate(self._pieces)


_ROUNDS = 3
_CLOSE_LU = 0.05
_LOOKAHEAD_S = 0.005
"""How early the limiter starts to turn a peak down (and how long it takes to come back):
short enough to stay inaudible on speech, long enough not to distort a waveform's cycle."""


def limit_peaks(samples: npt.NDArray[np.float64], sample_rate: int, ceiling: float) -> FloatArray:
    """A look-ahead peak limiter: the gain needed under each sample's true peak (4x
    oversampled), spread over the look-ahead window both ways (a minimum, then a moving
    average of the same width, which never exceeds the gain any sample in it needs), so a
    peak is turned down smoothly instead of clipped."""
    peaks = _sample_true_peaks(samples, sample_rate)
    if peaks.size == 0 or float(peaks.max()) <= ceiling:
        return samples
    needed = np.minimum(1.0, ceiling / np.maximum(peaks, 1e-9))
    width = 2 * max(1, round(_LOOKAHEAD_S * sample_rate)) + 1
    smooth = uniform_filter1d(minimum_filter1d(needed, width, mode="nearest"), width)
    # The moving average's rounding can lift it a hair above a sample's need.
    return np.asarray(samples * np.minimum(smooth, needed), dtype=np.float64)


def _sample_true_peaks(samples: npt.NDArray[np.float64], sample_rate: int) -> FloatArray:
    """Per sample, the largest magnitude of the 4x oversampled signal around it."""
    if samples.size == 0:
        return np.zeros(0)
    upsampled = np.abs(soxr.resample(samples, sample_rate, sample_rate * _OVERSAMPLE))
    count = samples.size
    frames = count * _OVERSAMPLE
    if upsampled.size < frames:
        upsampled = np.pad(upsampled, (0, frames - upsampled.size))
    per_sample = upsampled[:frames].reshape(count, _OVERSAMPLE).max(axis=1)
    return np.asarray(np.maximum(per_sample, np.abs(samples)), dtype=np.float64)


def _to_pcm16(samples: npt.NDArray[np.float64]) -> Int16Audio:
    scaled = np.round(samples * 32768.0)
    return np.asarray(np.clip(scaled, -32768, 32767), dtype="<i2")


def _as_float(pcm: npt.NDArray[np.generic]) -> FloatArray:
    array = np.asarray(pcm)
    if array.dtype == np.int16:
        return array.astype(np.float64) / 32768.0
    return array.astype(np.float64)


def true_peak_dbfs(pcm: npt.NDArray[np.generic], sample_rate: int) -> float:
    """The peak of the audio between its samples too (4x oversampled), in dBFS."""
    peaks = _sample_true_peaks(_as_float(pcm), sample_rate)
    peak = float(peaks.max()) if peaks.size else 0.0
    return 20 * math.log10(peak) if peak > 0 else -math.inf


def apply_gain(pcm: Int16Audio, gain_db: float) -> Int16Audio:
    """`pcm` scaled by `gain_db`, clipped to 16 bits (a no-op at 0 dB)."""
    if gain_db == 0.0 or pcm.size == 0:
        return pcm
    scaled = np.round(pcm.astype(np.float64) * 10 ** (gain_db / 20))
    return np.asarray(np.clip(scaled, -32768, 32767), dtype="<i2")
