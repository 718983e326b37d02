"""Engine kinds: one declaration per kind, read by everything that needs to know the engines.

Each engine module declares its kind with ``register(EngineSpec(...))`` when it is imported, and
is named once in ``BUILTIN_MODULES``; the configuration validation, the engine pool, routing's
seed costs and the doctor all read the declaration. Adding an engine is its module plus one line
there.

A declaration must be cheap to import: ``build`` and the other hooks import the engine's runtime
(torch, onnxruntime) when they are called, never at registration.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

from tts_bridge.engines.base import Engine, EngineError, SynthesisOptions, Tier
from tts_bridge.engines.settings import Precision, VoiceSettings, use_voice_rules

if TYPE_CHECKING:
    from tts_bridge.system.threads import OnnxSessionPlan


BUILTIN_MODULES = (
    "tts_bridge.engines.piper",
    "tts_bridge.engines.hibari",
    "tts_bridge.engines.kokoro",
    "tts_bridge.engines.chattts",
)
"""The modules whose import registers the engines that come with the bridge."""

FALLBACK_FAST_VOICE = "heart"
"""The fast voice "auto" stands for when a ChatTTS voice has no INT8 export: the bundled
hibari voice (English only; Chinese text stays on ChatTTS)."""


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


class NoVoiceOptions(BaseModel):
    """The voice options of an engine that takes none beyond the ones every voice has."""

    model_config = ConfigDict(extra="forbid")


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
    voice_options: type[BaseModel] = NoVoiceOptions
    """The schema of the voice keys only this engine takes (ChatTTS: spk_emb, backend), written
    beside the common ones in voices.<name>; checked when a voice is configured."""
    speaker: Callable[[VoiceSettings], str | None] = _plain_speaker
    """The speaker a voice's settings name for this engine (default: ``speaker``)."""
    check_voice: Callable[[VoiceSettings], None] | None = None
    """Checks a voice's settings beyond its schema (ChatTTS: the embedding matches its SHA-256)
    when the configuration loads; raises ValueError."""
    check_files: (
        Callable[[Path, Mapping[str, str] | None, Callable[[Path], str]], str | None] | None
    ) = check_model_file
    """Why a model may not load, given its expected hashes; None: it may, or the engine checks
    its files itself when it loads."""
    voices: Callable[[Any], Callable[[str, VoiceSettings, Path | None], list[Any]]] | None = None
    """Builds this kind's voices for one pool, when a configured voice is more than one engine
    (ChatTTS: the backend it runs on, its INT8 fast tier); None: one voice on one engine.
    Typed loosely here (an ``EnginePool`` to a ``registry.VoiceFactory``): the catalog sits
    below the engine pool and does not name it."""
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


def check_voice(voice: VoiceSettings) -> list[str]:
    """Checks ``voice`` against its engine: a known kind, the keys it writes beside the common
    ones in the engine's ``voice_options`` schema, then the engine's own ``check_voice``.
    Raises ValueError whose message starts with the key it is about. Returns the keys of other
    engines it leaves at their default (``backend: auto`` on a Piper voice, as the example file
    writes every key): they mean "not set", and the voice forgets them."""
    try:
        found = spec(voice.engine)
    except UnknownEngineError as exc:
        raise ValueError(f"engine: {exc}") from None
    given = voice.engine_options()
    schema = found.voice_options
    unset: list[str] = []
    for key, value in given.items():
        if key in schema.model_fields:
            continue
        takers = [k for k in kinds() if key in spec(k).voice_options.model_fields]
        if takers and all(spec(k).voice_options.model_fields[key].default == value for k in takers):
            unset.append(key)
            continue
        if takers:
            # A choice (backend: torch) is worth repeating; a speaker embedding is not.
            choice = get_origin(spec(takers[0]).voice_options.model_fields[key].annotation)
            shown = f" {value!r}" if choice is Literal else ""
            raise ValueError(f"{key}{shown} is only for engine {' or '.join(takers)}")
        known = [*VoiceSettings.model_fields, *schema.model_fields]
        close = difflib.get_close_matches(key, known, n=1)
        raise ValueError(
            f"{key}: unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")
        )
    try:
        schema.model_validate({k: v for k, v in given.items() if k not in unset})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None
    if found.check_voice is not None:
        found.check_voice(voice)
    return unset


class _Rules:
    """The catalog as the voice settings ask it (see engines.settings.VoiceRules)."""

    def check_voice(self, voice: VoiceSettings) -> list[str]:
        return check_voice(voice)

    def takes_auto_fast_voice(self, engine: str) -> bool:
        found = find(engine)
        return found is not None and found.auto_fast_voice


use_voice_rules(_Rules())
