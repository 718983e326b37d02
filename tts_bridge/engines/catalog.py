"""Engine kinds: one declaration per kind, read by everything that needs to know the engines.

Each engine module declares its kind with ``register(EngineSpec(...))`` when it is imported, and
is named once in ``BUILTIN_MODULES``; the configuration validation, the engine pool, routing's
seed costs and the doctor all read the declaration. Adding an engine is its module plus one line
there.

A declaration must be cheap to import: ``build`` and the other hooks import the engine's runtime
(torch, onnxruntime) when they are called, never at registration.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tts_bridge.engines.base import Engine, EngineError, Precision, SynthesisOptions, Tier

if TYPE_CHECKING:
    from tts_bridge.config import VoiceSettings
    from tts_bridge.engines.registry import EnginePool, Voice
    from tts_bridge.hardware import OnnxSessionPlan

    VoiceFactory = Callable[[str, VoiceSettings, Path | None], list[Voice]]
    """Builds the voices of one configured voice: (its name, its settings, its model path)."""

BUILTIN_MODULES = (
    "tts_bridge.engines.piper",
    "tts_bridge.engines.hibari",
    "tts_bridge.engines.kokoro",
    "tts_bridge.engines.chattts",
)
"""The modules whose import registers the engines that come with the bridge."""


class UnknownEngineError(EngineError, LookupError):
    """A voice names an engine kind nobody registered."""


@dataclass(frozen=True)
class EngineContext:
    """What ``EngineSpec.build`` gets from the engine pool for one model."""

    model: Path
    """The model: the voice's (resolved under models.dir) or the engine's bundled one."""
    precision: Precision
    """The voice's precision (engines with one set of weights ignore it)."""
    expected: Mapping[str, str] | None
    """Expected SHA-256 per file from the model manifests; None when no manifest knows it."""
    sha256: Callable[[Path], str]
    """The pool's hasher (each file is hashed once per size and mtime)."""
    session: OnnxSessionPlan
    """The onnxruntime session options every ONNX engine of the pool gets."""
    on_loader: Callable[[Callable[[], Any]], Any]
    """Runs a function on the pool's loader thread (normal priority) and returns its result."""
    early_start: bool = False
    """Streaming engines that can: start with approximate audio (synthesis.chattts_early_start)."""
    models_dir: Path | None = None
    """models.dir, for engines that read files of their own there (Kokoro's downloaded voices)."""


def check_model_file(
    path: Path, expected: Mapping[str, str] | None, sha256: Callable[[Path], str]
) -> str | None:
    """Why the one-file model ``path`` may not load (not in a manifest, or changed); None if
    it may. The check of engines whose model is a single file."""
    if not expected:
        return (
            f"model file {path} is not in the model manifest; trust it with "
            f"'tts-bridge models add NAME {path}'"
        )
    (want,) = expected.values()
    actual = sha256(path)
    if actual != want.lower():
        return f"model file {path} was changed: expected sha256 {want}, actual {actual}"
    return None


def _plain_speaker(voice: VoiceSettings) -> str | None:
    return voice.speaker


@dataclass(frozen=True)
class EngineSpec:
    """One engine kind as the bridge knows it."""

    kind: str
    """The value of a voice's ``engine`` key; the engine's name."""
    build: Callable[[EngineContext], Engine]
    """Makes the engine of one model: cheap, nothing is loaded (the runtime is imported inside
    the engine, or inside this function)."""
    tier: Tier
    """The tier its voices report unless their settings say otherwise."""
    seed_seconds_per_char: float
    """Compute per character of text before a measurement exists, so that the first request
    already routes sensibly (from `tts-bridge bench`)."""
    languages: frozenset[str] | None
    """Languages it speaks; None when each model says (Piper's voice config)."""
    bundled_model: Callable[[], Path] | None = None
    """The model of a voice without ``model`` (found without importing the runtime); None: a
    voice must name its model."""
    model_hint: str = "the model file"
    """What a voice's ``model`` names, for the error when it is missing."""
    runtime_mb: float = 100.0
    """Resident memory of the runtime itself, added to the model's estimate before loading."""
    options: type[SynthesisOptions] = SynthesisOptions
    """The synthesis options it takes (a voice's ``options`` and a request's overrides)."""
    voice_keys: frozenset[str] = frozenset()
    """Engine-specific voice settings it accepts (``spk_emb``, ``backend``)."""
    speaker: Callable[[VoiceSettings], str | None] = _plain_speaker
    """The speaker a voice's settings name for this engine (default: ``speaker``)."""
    check_voice: Callable[[VoiceSettings], None] | None = None
    """Checks a voice's settings when the configuration loads; raises ValueError."""
    check_files: (
        Callable[[Path, Mapping[str, str] | None, Callable[[Path], str]], str | None] | None
    ) = check_model_file
    """Why a model may not load, given its expected hashes; None: it may, or the engine checks
    its files itself when it loads."""
    voices: Callable[[EnginePool], VoiceFactory] | None = None
    """Builds this kind's voices for one pool, when a configured voice is more than one engine
    (ChatTTS: the backend it runs on, its INT8 fast tier); None: one voice on one engine."""
    auto_fast_voice: bool = False
    """Its voices may say ``fast_voice: auto`` (resolved by ``voices``)."""


_LOCK = threading.RLock()
_SPECS: dict[str, EngineSpec] = {}
_builtins_loaded = False


def register(spec: EngineSpec) -> EngineSpec:
    """Make ``spec`` known; a second, different declaration of the same kind is an error."""
    with _LOCK:
        known = _SPECS.get(spec.kind)
        if known is not None and known is not spec:
            raise ValueError(f"engine {spec.kind!r} is registered twice")
        _SPECS[spec.kind] = spec
    return spec


def unregister(kind: str) -> None:
    """Forget a kind (tests, and plugins that withdraw one)."""
    with _LOCK:
        _SPECS.pop(kind, None)


def _load_builtins() -> None:
    global _builtins_loaded  # noqa: PLW0603 - the one flag of the one registry
    if _builtins_loaded:
        return
    with _LOCK:
        if not _builtins_loaded:
            for module in BUILTIN_MODULES:
                importlib.import_module(module)
            _builtins_loaded = True


def kinds() -> list[str]:
    """Every registered kind, sorted."""
    _load_builtins()
    with _LOCK:
        return sorted(_SPECS)


def find(kind: str) -> EngineSpec | None:
    """The declaration of ``kind``, or None."""
    _load_builtins()
    with _LOCK:
        return _SPECS.get(kind)


def spec(kind: str) -> EngineSpec:
    """The declaration of ``kind``; UnknownEngineError (listing the known kinds) if none."""
    found = find(kind)
    if found is None:
        raise UnknownEngineError(f"unknown engine {kind!r}; known: {', '.join(kinds())}")
    return found


def model_path(voice: VoiceSettings, models_dir: Path) -> Path | None:
    """The voice's model as the engine pool resolves it: its ``model`` under ``models_dir``,
    else the engine's bundled one; None when it names none and the engine bundles none."""
    if voice.model is not None:
        return voice.model if voice.model.is_absolute() else models_dir / voice.model
    bundled = spec(voice.engine).bundled_model
    return bundled() if bundled is not None else None
