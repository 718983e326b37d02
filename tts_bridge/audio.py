"""PCM and WAV helpers: float to 16-bit PCM, silence, resampling, WAV encoding."""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt
import soundfile
import soxr

Int16Audio = npt.NDArray[np.int16]


def to_pcm16(audio: npt.NDArray[np.floating] | npt.NDArray[np.int16]) -> Int16Audio:
    """Float audio in [-1, 1] (clipped) to little-endian 16-bit PCM."""
    if audio.dtype == np.int16:
        return np.asarray(audio, dtype="<i2")
    clipped = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    return np.asarray(np.round(clipped * 32767.0), dtype="<i2")


def silence(sample_rate: int, milliseconds: int) -> Int16Audio:
    return np.zeros(sample_rate * milliseconds // 1000, dtype="<i2")


def resample(pcm: Int16Audio, from_rate: int, to_rate: int) -> Int16Audio:
    """High-quality resampling (soxr) of 16-bit PCM; a no-op when the rates match."""
    if from_rate == to_rate or pcm.size == 0:
        return pcm
    return np.asarray(soxr.resample(pcm, from_rate, to_rate), dtype="<i2")


def encode_wav(pcm: Int16Audio, sample_rate: int) -> bytes:
    """A complete mono 16-bit WAV file in memory."""
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, sample_rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def duration_ms(samples: int, sample_rate: int) -> int:
    return round(samples * 1000 / sample_rate)
