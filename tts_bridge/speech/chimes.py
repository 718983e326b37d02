"""Chimes played in the same audio as an announcement: a few made here, and the user's files.

The built-in chimes are synthesized (bell-like partials under an envelope), so the project ships
no sound files and each is made at the voice's own rate. A user's chime is a WAV, FLAC, OGG or
MP3 file in `chimes.dir`, named after the file; it is decoded (libsndfile), mixed to mono,
resampled to the voice's rate and cut to `chimes.max_seconds`. Every chime is brought to the
bridge's loudness target, so it is as loud as the speech after it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soundfile

from tts_bridge.audio import codec
from tts_bridge.speech.loudness import LoudnessNormalizer
from tts_bridge.speech.settings import ChimesSettings

_LOGGER = logging.getLogger(__name__)

EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3")
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FADE_S = 0.05
"""Fade at the end of a chime file cut to the length limit (a hard cut clicks)."""

Float64Audio = npt.NDArray[np.float64]


class ChimeError(Exception):
    """A chime that cannot be played: unknown (code unknown_chime) or a file that does not
    decode (code invalid_chime)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _bell(sample_rate: int, hz: float, seconds: float, decay_s: float) -> Float64Audio:
    """A struck-bell tone: a fundamental and two softer, faster-fading partials, a 5 ms attack
    (no click) and an exponential decay."""
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    tone = (
        np.sin(2 * np.pi * hz * t)
        + 0.4 * np.sin(2 * np.pi * 2 * hz * t) * np.exp(-t / (decay_s / 2))
        + 0.15 * np.sin(2 * np.pi * 3 * hz * t) * np.exp(-t / (decay_s / 3))
    )
    envelope = np.minimum(t / 0.005, 1.0) * np.exp(-t / decay_s)
    return np.asarray(tone * envelope, dtype=np.float64)


def _sequence(sample_rate: int, notes: list[tuple[float, float]], ring_s: float) -> Float64Audio:
    """Bell notes (start in seconds, frequency) overlaid, each ringing `ring_s`."""
    length = int((max(start for start, _ in notes) + ring_s) * sample_rate)
    out = np.zeros(length)
    for start, hz in notes:
        note = _bell(sample_rate, hz, ring_s, ring_s / 4)
        first = int(start * sample_rate)
        out[first : first + note.size] += note
    return out


def _beeps(sample_rate: int) -> Float64Audio:
    """Three short two-tone beeps: urgent, and unlike any doorbell."""
    beep_s, gap_s = 0.12, 0.08
    t = np.arange(int(beep_s * sample_rate)) / sample_rate
    ramp = np.minimum(1.0, np.minimum(t, beep_s - t) / 0.004)  # 4 ms edges: no clicks
    beep = (np.sin(2 * np.pi * 988 * t) + 0.5 * np.sin(2 * np.pi * 1976 * t)) * ramp
    gap = np.zeros(int(gap_s * sample_rate))
    return np.concatenate([beep, gap, beep, gap, beep])


BUILT_IN: dict[str, Callable[[int], Float64Audio]] = {
    "ding": lambda rate: _sequence(rate, [(0.0, 1318.5)], 1.0),
    "dingdong": lambda rate: _sequence(rate, [(0.0, 659.3), (0.45, 523.3)], 1.1),
    "chime": lambda rate: _sequence(
        rate, [(0.0, 523.3), (0.15, 659.3), (0.3, 784.0), (0.45, 1046.5)], 1.0
    ),
    "alert": _beeps,
}
"""The chimes the bridge makes itself, by name."""


@dataclass(frozen=True)
class ChimeInfo:
    name: str
    source: str
    """"built-in" or the file's name."""


class ChimeLibrary:
    """The chimes by name, made or decoded once per sample rate (thread-safe)."""

    def __init__(self, settings: ChimesSettings, loudness: LoudnessNormalizer) -> None:
        self._settings = settings
        self._loudness = loudness
        self._lock = threading.Lock()
        self._made: dict[tuple[str, int, float], codec.Int16Audio] = {}

    def _files(self) -> dict[str, Path]:
        """The user's chime files by name (read each time: files may be added while running)."""
        folder = self._settings.dir
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            return {}
        files: dict[str, Path] = {}
        for path in entries:
            if path.suffix.lower() in EXTENSIONS and _NAME_RE.match(path.stem):
                files.setdefault(path.stem, path)
        return files

    def list(self) -> list[ChimeInfo]:
        files = self._files()
        chimes = [ChimeInfo(name, "built-in") for name in BUILT_IN if name not in files]
        chimes += [ChimeInfo(name, path.name) for name, path in files.items()]
        return sorted(chimes, key=lambda c: c.name)

    def check(self, name: str) -> None:
        """Raise ChimeError(unknown_chime) unless `name` is a chime."""
        if name in BUILT_IN or name in self._files():
            return
        known = ", ".join(c.name for c in self.list())
        raise ChimeError("unknown_chime", f"unknown chime {name[:64]!r}; the chimes are {known}")

    def pcm(self, name: str, sample_rate: int) -> codec.Int16Audio:
        """The chime at `sample_rate` and the bridge's loudness; raises ChimeError."""
        path = self._files().get(name)  # a file overrides a built-in of the same name
        if path is None and name not in BUILT_IN:
            self.check(name)
        try:
            stamp = path.stat().st_mtime if path is not None else 0.0
        except OSError as exc:
            raise ChimeError("invalid_chime", f"chime {name}: {exc.strerror}") from None
        key = (name, sample_rate, stamp)
        with self._lock:
            made = self._made.get(key)
        if made is not None:
            return made
        samples = BUILT_IN[name](sample_rate) if path is None else self._decode(path, sample_rate)
        peak = float(np.max(np.abs(samples))) if samples.size else 0.0
        if peak > 1.0:
            samples = samples / peak
        pcm, _ = self._loudness.normalize(codec.to_pcm16(samples), sample_rate)
        with self._lock:
            self._made = {k: v for k, v in self._made.items() if k[:2] != key[:2]}
            self._made[key] = pcm
        return pcm

    def _decode(self, path: Path, sample_rate: int) -> Float64Audio:
        try:
            data, rate = soundfile.read(str(path), dtype="float64", always_2d=True)
        except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
            _LOGGER.warning("Chime file %s does not decode: %s", path, exc)
            raise ChimeError(
                "invalid_chime", f"chime file {path.name} is not audio libsndfile reads: {exc}"
            ) from None
        mono = data.mean(axis=1) if data.size else np.zeros(0)
        if mono.size == 0:
            raise ChimeError("invalid_chime", f"chime file {path.name} has no audio")
        limit = int(self._settings.max_seconds * rate)
        if mono.size > limit:
            _LOGGER.info(
                "Chime %s is cut to %g s (chimes.max_seconds)",
                path.name,
                self._settings.max_seconds,
            )
            mono = mono[:limit].copy()
            fade = min(limit, int(_FADE_S * rate))
            mono[limit - fade :] *= np.linspace(1.0, 0.0, fade)
        if rate != sample_rate:
            pcm = codec.resample(codec.to_pcm16(np.clip(mono, -1.0, 1.0)), rate, sample_rate)
            return pcm.astype(np.float64) / 32768.0
        return np.asarray(mono, dtype=np.float64)
