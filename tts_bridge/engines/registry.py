"""Voices to engines: builds one engine per model file, lazily loaded and shared by its voices."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tts_bridge.config import Settings, VoiceSettings
from tts_bridge.engines.base import Engine, EngineError
from tts_bridge.models import FileHasher

_LOGGER = logging.getLogger(__name__)


class UnknownVoiceError(LookupError):
    """The request named a voice that is not configured."""


@dataclass(frozen=True)
class Voice:
    """A configured voice: the engine that speaks it and the engine's speaker name."""

    name: str
    engine: Engine
    speaker: str | None
    settings: VoiceSettings


def _build_engine(kind: str, model: Path | None, hasher: FileHasher, threads: int) -> Engine:
    if kind == "piper":
        from tts_bridge.engines import piper

        path = model or piper.bundled_model()
        return piper.PiperEngine(path, hasher.sha256(path), threads)
    if kind == "hibari":
        from tts_bridge.engines import hibari

        path = model or hibari.bundled_model()
        return hibari.HibariEngine(path, hasher.sha256(path), threads)
    raise EngineError(f"unknown engine {kind!r}")


class EnginePool:
    """Owns every engine instance; nothing here loads a model until synthesis asks for it."""

    def __init__(self, settings: Settings, threads: int | None = None) -> None:
        self._settings = settings
        self._hasher = FileHasher()
        self._lock = threading.Lock()
        self._engines: dict[tuple[str, str], Engine] = {}
        self._voices: dict[str, Voice] = {}
        self._default_voice = settings.default_voice
        threads = threads or settings.synthesis.onnx_threads or len(os.sched_getaffinity(0))
        for name, voice in settings.voices.items():
            key = (voice.engine, str(voice.model or ""))
            engine = self._engines.get(key)
            if engine is None:
                model = voice.model
                if model is not None and not model.is_absolute():
                    model = settings.models.dir / model
                if model is not None and not model.is_file():
                    raise EngineError(f"voices.{name}.model: file {model} does not exist")
                engine = _build_engine(voice.engine, model, self._hasher, threads)
                self._engines[key] = engine
            self._voices[name] = Voice(name, engine, voice.speaker, voice)
        _LOGGER.debug("Voices: %s", ", ".join(f"{v.name}={v.engine.identity}" for v in self))

    def __iter__(self) -> Iterator[Voice]:
        return iter(self._voices.values())

    @property
    def default_voice(self) -> str:
        return self._default_voice

    def set_default_voice(self, name: str) -> None:
        """Change the default voice while running (e.g. from Home Assistant's select)."""
        self.voice(name)  # raises UnknownVoiceError
        self._default_voice = name

    def voice(self, name: str | None) -> Voice:
        name = name or self._default_voice
        try:
            return self._voices[name]
        except KeyError:
            raise UnknownVoiceError(
                f"unknown voice {name!r}; available: {', '.join(sorted(self._voices))}"
            ) from None

    def engines(self) -> list[Engine]:
        return list(self._engines.values())

    def loaded(self) -> list[str]:
        return [e.identity for e in self._engines.values() if e.loaded]

    def unload_all(self) -> None:
        with self._lock:
            for engine in self._engines.values():
                engine.unload()
