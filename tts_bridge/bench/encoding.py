"""Encoding cost of the formats speakers play: CPU time per second of audio, and the bitrate.

The source is a few seconds of speech-like sound (harmonics with a moving pitch, syllable-like
bursts and breath noise) at Piper's 22.05 kHz, encoded as a Sonos or Cast would be sent it.
Each row is the median of several runs, so a single hiccup on a shared machine does not count.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tts_bridge.audio.codec import encode
from tts_bridge.audio.formats import AudioFormat

SOURCE_RATE = 22050
DEFAULT_FORMATS: tuple[AudioFormat, ...] = (
    AudioFormat("mp3"),
    AudioFormat("mp3", 44100),
    AudioFormat("mp3", 44100, 2),
    AudioFormat("opus"),
    AudioFormat("opus", 48000, 2),
    AudioFormat("flac", 44100),
    AudioFormat("wav", 44100),
)


def speechlike(
    seconds: float, sample_rate: int = SOURCE_RATE, seed: int = 0
) -> npt.NDArray[np.float32]:
    """Deterministic audio with speech's rough shape (codecs work harder on it than on a tone)."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * sample_rate)) / sample_rate
    pitch = 140.0 + 30.0 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    syllables = np.clip(np.sin(2 * np.pi * 4.0 * t), 0.0, None)
    noise = rng.normal(0.0, 0.05, t.size)
    return np.asarray(0.25 * voiced * syllables + noise, dtype=np.float32)


def encode_cost_rows(
    formats: Sequence[AudioFormat] = DEFAULT_FORMATS,
    seconds: float = 10.0,
    repeats: int = 5,
) -> list[dict[str, Any]]:
    """One row per format: encode ms per second of audio (median of repeats), real-time factor,
    output rate, channels, bytes and bitrate."""
    audio = speechlike(seconds)
    rows = []
    for fmt in formats:
        encode(audio[:SOURCE_RATE], SOURCE_RATE, fmt)  # warm-up: codec set-up, page faults
        timings = []
        size = 0
        rate = 0
        for _ in range(repeats):
            start = time.perf_counter()
            encoded = encode(audio, SOURCE_RATE, fmt)
            timings.append(time.perf_counter() - start)
            size, rate = len(encoded.data), encoded.sample_rate
        median = statistics.median(timings)
        rows.append(
            {
                "format": fmt.container,
                "sample_rate": rate,
                "channels": fmt.channels,
                "ms_per_audio_s": round(median * 1000 / seconds, 2),
                "rtf": round(median / seconds, 5),
                "bytes": size,
                "kbps": round(size * 8 / seconds / 1000, 1),
            }
        )
    return rows
