"""Voices to engines: one engine per model file, loaded lazily, shared by its voices, unloaded
when idle or when another model needs the memory.

Memory: before a model loads, its need is estimated (the last measured resident size, else the
size of its files times a factor); least recently used engines are unloaded until it fits the
budget, and a model that cannot fit even alone is refused with a clear error rather than
risking the out-of-memory killer. After loading, the measured RSS growth becomes the engine's
resident size.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

from tts_bridge.config import Settings, VoiceSettings
from tts_bridge.engines.base import Engine, EngineError
from tts_bridge.models import FileHasher

_LOGGER = logging.getLogger(__name__)

# Resident memory per byte of model file before a measurement exists (onnxruntime and torch
# keep roughly one copy of the weights plus their runtime; measured 3-4x for Piper and hibari).
_FILE_TO_RSS = 4.0
_RUNTIME_MB = {"piper": 60, "hibari": 150, "chattts": 900}  # runtime import, measured RSS


class UnknownVoiceError(LookupError):
    """The request named a voice that is not configured."""


class MemoryBudgetError(EngineError):
    """A model does not fit the memory budget even with every other model unloaded."""


@dataclass(frozen=True)
class Voice:
    """A configured voice: the engine that speaks it and the engine's speaker name."""

    name: str
    engine: Engine
    speaker: str | None
    settings: VoiceSettings


def _files_mb(path: Path) -> float:
    if path.is_dir():
        total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    else:
        total = path.stat().st_size
    return total / 2**20


def manifest_hashes(path: Path, models_dir: Path) -> dict[str, str] | None:
    """Expected SHA-256 per file (relative to the model's root) from the model manifests."""
    from tts_bridge.models import ManifestError, find_manifest

    manifest = find_manifest(path, models_dir)
    if manifest is None:
        return None
    try:
        root = manifest.folder(models_dir).resolve()
    except ManifestError:
        return None
    hashes = manifest.expected_hashes()
    if path.resolve() == root:
        return hashes
    rel = str(path.resolve().relative_to(root))
    return {rel: hashes[rel]} if rel in hashes else None


def _build_engine(
    kind: str,
    model: Path | None,
    hasher: FileHasher,
    threads: int,
    expected: Callable[[Path], Mapping[str, str] | None],
    *,
    precision: Literal["int8", "fp32"] = "int8",
) -> tuple[Engine, Path]:
    if kind == "piper":
        from tts_bridge.engines import piper

        path = model or piper.bundled_model()
        return piper.PiperEngine(path, hasher.sha256(path), threads), path
    if kind == "hibari":
        from tts_bridge.engines import hibari

        path = model or hibari.bundled_model()
        return hibari.HibariEngine(path, hasher.sha256(path), threads), path
    if kind == "chattts":
        from tts_bridge.engines.chattts_torch import ChatTTSEngine

        if model is None:
            raise EngineError("a chattts voice needs 'model': the checkpoint folder")
        engine = ChatTTSEngine(
            model, expected_sha256=expected(model), threads=threads, hasher=hasher.sha256
        )
        return engine, model
    if kind == "chattts-onnx":
        from tts_bridge.engines.chattts_onnx import ChatTTSOnnxEngine

        if model is None:
            raise EngineError("a chattts-onnx voice needs 'model': the export folder")
        onnx_engine = ChatTTSOnnxEngine(
            model,
            precision=precision,
            expected_sha256=expected(model),
            threads=threads,
            hasher=hasher.sha256,
        )
        return onnx_engine, model
    raise EngineError(f"unknown engine {kind!r}")


class EnginePool:
    """Owns every engine instance; nothing here loads a model until synthesis asks for it."""

    def __init__(
        self,
        settings: Settings,
        threads: int | None = None,
        memory_budget_mb: int | None = None,
    ) -> None:
        self._settings = settings
        self._hasher = FileHasher()
        self._lock = threading.RLock()
        self._engines: dict[tuple[str, str], Engine] = {}
        self._voices: dict[str, Voice] = {}
        self._default_voice = settings.default_voice
        self._files_mb: dict[str, float] = {}
        self._resident_mb: dict[str, float] = {}
        self._last_used: dict[str, float] = {}
        self.memory_budget_mb = settings.models.memory_budget_mb or memory_budget_mb
        threads = threads or settings.synthesis.onnx_threads or len(os.sched_getaffinity(0))
        models_dir = settings.models.dir

        known: dict[Path, Mapping[str, str] | None] = {}

        def expected(path: Path) -> Mapping[str, str] | None:
            # Looked up once per model path: each lookup reads every manifest file.
            if path not in known:
                known[path] = manifest_hashes(path, models_dir)
            return known[path]

        self._unverified: dict[str, str] = {}
        for name, voice in settings.voices.items():
            model = voice.model
            if model is not None and not model.is_absolute():
                model = settings.models.dir / model
            key = (voice.engine, f"{model or ''}:{voice.precision}")
            engine = self._engines.get(key)
            if engine is None:
                if model is not None and not model.exists():
                    raise EngineError(f"voices.{name}.model: {model} does not exist")
                engine, path = _build_engine(
                    voice.engine, model, self._hasher, threads, expected, precision=voice.precision
                )
                if voice.tier is not None:
                    engine.tier = voice.tier
                self._engines[key] = engine
                self._files_mb[engine.identity] = _files_mb(path)
                if not voice.engine.startswith("chattts"):  # ChatTTS checks its own files
                    problem = self._check_manifest(path, expected(path))
                    if problem:
                        self._unverified[engine.identity] = problem
                elif expected(path) is None and (path / "asset" / "spk_stat.json").exists():
                    # Not the official release (it has no spk_stat.json) and never added: say
                    # so, rather than let it fail against the official hashes.
                    self._unverified[engine.identity] = (
                        f"ChatTTS checkpoint {path} is not in the model manifest; trust it with "
                        f"'tts-bridge models add NAME {path}'"
                    )
            speaker = voice.spk_emb if voice.engine.startswith("chattts") else voice.speaker
            self._voices[name] = Voice(name, engine, speaker, voice)
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

    def resident_mb(self) -> dict[str, float]:
        """Measured resident size of each loaded engine."""
        return {e.identity: self._resident_mb.get(e.identity, 0.0) for e in self._loaded()}

    def _loaded(self) -> list[Engine]:
        return [e for e in self._engines.values() if e.loaded]

    def _need_mb(self, engine: Engine) -> float:
        measured = self._resident_mb.get(engine.identity)
        if measured:
            return measured
        runtime = _RUNTIME_MB.get(engine.name, 100)
        return self._files_mb.get(engine.identity, 0.0) * _FILE_TO_RSS + runtime

    def _check_manifest(self, path: Path, expected: Mapping[str, str] | None) -> str | None:
        """Why `path` may not load (not in a manifest, or a different hash); None if fine."""
        if not expected:
            return (
                f"model file {path} is not in the model manifest; trust it with "
                f"'tts-bridge models add NAME {path}'"
            )
        (want,) = expected.values()
        actual = self._hasher.sha256(path)
        if actual != want.lower():
            return f"model file {path} was changed: expected sha256 {want}, actual {actual}"
        return None

    def ensure_loaded(self, engine: Engine) -> None:
        """Load `engine` within the memory budget (unloading least recently used ones).

        Only verified models load: a file missing from the manifest or with another hash is
        refused (the identity includes the actual hash, so a changed file is never a cache hit).
        """
        self._last_used[engine.identity] = time.monotonic()
        if engine.loaded:
            return
        problem = self._unverified.get(engine.identity)
        if problem:
            raise EngineError(problem)
        with self._lock:
            if engine.loaded:
                return
            budget = self.memory_budget_mb
            need = self._need_mb(engine)
            if budget is not None:
                if need > budget:
                    raise MemoryBudgetError(
                        f"{engine.name} model needs about {need:.0f} MB; the memory budget is "
                        f"{budget} MB (models.memory_budget_mb)"
                    )
                others = sorted(self._loaded(), key=lambda e: self._last_used.get(e.identity, 0))
                while others and need + sum(self._need_mb(e) for e in others) > budget:
                    victim = others.pop(0)
                    _LOGGER.info(
                        "Unloading %s to make room for %s (budget %d MB)",
                        victim.identity,
                        engine.identity,
                        budget,
                    )
                    self._unload(victim)
            before = psutil.Process().memory_info().rss
            started = time.perf_counter()
            engine.load()
            grown = max(0.0, (psutil.Process().memory_info().rss - before) / 2**20)
            if grown > 1:
                self._resident_mb[engine.identity] = grown
            _LOGGER.info(
                "Loaded %s in %.2f s (+%.0f MB resident)",
                engine.identity,
                time.perf_counter() - started,
                grown,
            )

    def _unload(self, engine: Engine) -> None:
        engine.unload()
        gc.collect()

    def unload_idle(self, idle_s: float, now: float | None = None) -> list[str]:
        """Unload engines unused for `idle_s` seconds; returns their identities."""
        now = time.monotonic() if now is None else now
        dropped = []
        with self._lock:
            for engine in self._loaded():
                if now - self._last_used.get(engine.identity, now) >= idle_s:
                    self._unload(engine)
                    dropped.append(engine.identity)
        for identity in dropped:
            _LOGGER.info("Unloaded %s after %.0f s unused", identity, idle_s)
        return dropped

    def unload_all(self) -> None:
        with self._lock:
            for engine in self._loaded():
                self._unload(engine)
