"""Voices to engines: one engine per model file, loaded lazily, shared by its voices, unloaded
when idle or when another model needs the memory.

How a voice's engine is built is its kind's declaration (``catalog``); a kind whose voices are
more than one engine builds them itself (ChatTTS's backends: ``engines/chattts/pool.py``).

Memory: residency.py decides when an engine is in memory (the budget, least recently used
engines unloaded for room, loads measured); this module which engine a voice uses.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tts_bridge.config import Settings
from tts_bridge.engines import catalog
from tts_bridge.engines.base import Engine, EngineError, Tier
from tts_bridge.engines.catalog import EngineContext
from tts_bridge.engines.manifests import FileHasher, ModelFileError
from tts_bridge.engines.residency import Residency, files_mb
from tts_bridge.engines.settings import AUTO_FAST_VOICE, Precision, VoiceSettings
from tts_bridge.system.threads import OnnxSessionPlan

if TYPE_CHECKING:
    from tts_bridge.system.threads import ThreadPlan

_LOGGER = logging.getLogger(__name__)


class UnknownVoiceError(LookupError):
    """The request named a voice that is not configured."""


class VoiceSetError(ValueError):
    """A set of voices that cannot be used together (see EnginePool.prepare_voices)."""


class BackendFallbackError(EngineError):
    """A voice's engine failed to load and the pool rebuilt the voice on another (a ChatTTS
    voice with ``backend: auto`` moves from its ONNX export to torch; see ``add_fallback``).

    The voice's engine, and with it every cache key, changed: look the voice up again
    (``pool.voice(name)``) and start over with the key.
    """


Backend = Literal["torch", "onnx"]


@dataclass(frozen=True)
class Voice:
    """A configured voice: the engine that speaks it and the engine's speaker name."""

    name: str
    engine: Engine
    speaker: str | None
    settings: VoiceSettings
    tier: Tier
    """The tier it reports: its settings' tier, else its engine kind's (see catalog)."""
    backend: Backend | None = None
    """ChatTTS voices (``engine: chattts``): the backend serving it now; None for the others."""
    backend_note: str = ""
    """Why that backend: auto's choice, or the reason of a fallback to torch."""
    spec: catalog.EngineSpec = field(init=False, compare=False, repr=False)
    """The declaration of its configured kind (``settings.engine``), resolved once."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", catalog.spec(self.settings.engine))


VoiceFactory = Callable[[str, VoiceSettings, Path | None], list[Voice]]
"""Builds the voices of one configured voice: (its name, its settings, its model path)."""


@dataclass(frozen=True)
class VoiceSet:
    """Voices built for new settings, not yet in use (see EnginePool.prepare_voices)."""

    settings: Settings
    voices: Mapping[str, Voice]


def _readable(error: Mapping[str, Any]) -> str:
    """One pydantic error as a sentence: where, then what."""
    where = ".".join(str(part) for part in error.get("loc", ()))
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


@dataclass
class _Fallback:
    """Voices to rebuild on another engine if one engine fails to load (see add_fallback)."""

    instead: str
    """What they then run on, as errors and logs name it ("torch")."""
    voices: dict[str, Callable[[str], Voice]] = field(default_factory=dict)
    """Voice name -> builds that voice on the other engine (given the reason)."""
    failed: str | None = None
    """Why the engine failed to load, once it has."""


def manifest_hashes(path: Path, models_dir: Path) -> dict[str, str] | None:
    """Expected SHA-256 per file (relative to the model's root) from the model manifests."""
    from tts_bridge.engines.manifests import ManifestError, find_manifest

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


class EnginePool:
    """Owns every engine instance; nothing here loads a model until synthesis asks for it.

    ``plan`` is the hardware plan (threads, memory budget, onnxruntime session options);
    ``threads`` and ``memory_budget_mb`` override it. Without a plan the settings decide, with
    the hardware consulted for ``onnx_spinning: auto``.
    """

    def __init__(
        self,
        settings: Settings,
        threads: int | None = None,
        memory_budget_mb: int | None = None,
        *,
        plan: ThreadPlan | None = None,
        on_load: Callable[[Engine, float], None] | None = None,
        on_unload: Callable[[Engine], None] | None = None,
    ) -> None:
        """`on_load` is told each model loaded and its load time in seconds, `on_unload` each
        one unloaded (the metrics)."""
        self._settings = settings
        self._hasher = FileHasher()
        self._lock = threading.RLock()
        self._engines: dict[tuple[str, str], Engine] = {}
        self._voices: dict[str, Voice] = {}
        self._default_voice = settings.default_voice
        self.residency = Residency(
            settings.models.memory_budget_mb
            or memory_budget_mb
            or (plan.memory_budget_mb if plan is not None else None),
            on_load=on_load,
            on_unload=on_unload,
        )
        self.session = _session_plan(settings, threads, plan)
        """The onnxruntime session options every ONNX engine of this pool gets."""
        if self.session.inter_op_threads != 1:
            _LOGGER.warning(
                "onnxruntime inter-op threads = %d have no effect: every session runs in "
                "sequential execution mode, which uses none",
                self.session.inter_op_threads,
            )
        self._models_dir = settings.models.dir
        self._known: dict[Path, Mapping[str, str] | None] = {}
        self._factories: dict[str, VoiceFactory] = {}
        self._fallbacks: dict[int, _Fallback] = {}
        self._unverified: dict[str, str] = {}
        self._model_files: dict[int, tuple[Path, str]] = {}
        """Engine (by id) -> its one model file, the manifest's hash, the hash in its identity:
        verified again at every load."""
        self.on_change: Callable[[], None] | None = None
        """Called after the voices changed while running (a backend fell back to torch)."""
        for name, voice in settings.voices.items():
            for built in self._build_configured(name, voice):
                self._voices[built.name] = built
        _LOGGER.debug("Voices: %s", ", ".join(f"{v.name}={v.engine.identity}" for v in self))
        _LOGGER.debug("ONNX sessions: %s", self.session.describe())

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def memory_budget_mb(self) -> int | None:
        return self.residency.memory_budget_mb

    @property
    def load_seconds(self) -> dict[str, float]:
        """How long each engine's last load took (identity -> seconds)."""
        return self.residency.load_seconds

    @property
    def models_dir(self) -> Path:
        return self._models_dir

    def expected(self, path: Path) -> Mapping[str, str] | None:
        """Expected SHA-256 per file of the model at ``path`` from the model manifests."""
        # Looked up once per model path: each lookup reads every manifest file.
        if path not in self._known:
            self._known[path] = manifest_hashes(path, self._models_dir)
        return self._known[path]

    def _build_configured(self, name: str, voice: VoiceSettings) -> list[Voice]:
        """The voices of one configured voice, its model path resolved and checked."""
        try:
            # Again here: settings validated before the catalog was imported were not.
            if catalog.check_voice(voice):
                voice = VoiceSettings.model_validate(voice.model_dump())  # forgets those keys
        except ValueError as exc:
            raise EngineError(f"voices.{name}: {exc}") from None
        model = voice.model
        if model is not None and not model.is_absolute():
            model = self._settings.models.dir / model
        if model is not None and not model.exists():
            from tts_bridge.hub.layout import fetch_hint

            hint = fetch_hint(model, self._settings.models.dir)
            raise EngineError(f"voices.{name}.model: {model} does not exist; {hint}")
        return self._build_voices(name, voice, model)

    def prepare_voices(self, voices: Mapping[str, VoiceSettings]) -> VoiceSet:
        """Build a new set of voices while the running ones keep serving (engines shared with
        them, nothing loaded), to put in use with `use_voices`. Raises VoiceSetError when the
        set is not valid as a whole (a fast voice or the default voice missing) and
        EngineError when a voice cannot be built (its model missing): nothing changes then."""
        from pydantic import ValidationError

        if self._default_voice not in voices:
            raise VoiceSetError(
                f"{self._default_voice!r} is the default voice; choose another default first"
            )
        current = self._settings
        try:
            settings = type(current).model_validate(
                {
                    **current.model_dump(),
                    "voices": dict(voices),
                    "default_voice": self._default_voice,
                }
            )
        except ValidationError as exc:
            raise VoiceSetError("; ".join(_readable(error) for error in exc.errors())) from None
        built: dict[str, Voice] = {}
        with self._lock:
            # A kind's voice factory reads the pool's settings (another voice's name, say).
            self._settings = settings
            try:
                for name, voice in settings.voices.items():
                    for made in self._build_configured(name, voice):
                        built[made.name] = made
            finally:
                self._settings = current
        return VoiceSet(settings, built)

    def use_voices(self, prepared: VoiceSet) -> None:
        """Put a prepared set of voices in use at once. A request already validated keeps the
        voice it holds (and so its engine) until it is answered."""
        with self._lock:
            self._settings = prepared.settings
            self._voices = dict(prepared.voices)
        _LOGGER.info("Voices now: %s", ", ".join(self._voices))

    def _build_voices(self, name: str, voice: VoiceSettings, model: Path | None) -> list[Voice]:
        """The voices of one configured voice: its kind's own factory's, else one voice."""
        spec = catalog.spec(voice.engine)
        if spec.voices is not None:
            factory = self._factories.get(spec.kind)
            if factory is None:
                factory = self._factories[spec.kind] = spec.voices(self)
            return factory(name, voice, model)
        engine = self.engine(spec.kind, model, voice.precision)
        return [Voice(name, engine, spec.speaker(voice), voice, voice.tier or spec.tier)]

    def engine(
        self,
        kind: str,
        model: Path | None,
        precision: Precision,
        *,
        variant: str = "",
    ) -> Engine:
        """The shared engine of this kind for this model (built on first use; nothing is
        loaded). ``model`` None: the kind's bundled model. ``variant`` keeps engines of the
        same model apart that are used differently."""
        key = (kind, f"{model or ''}:{precision}{variant}")
        with self._lock:
            engine = self._engines.get(key)
            if engine is not None:
                return engine
            spec = catalog.spec(kind)
            path = model
            if path is None:
                if spec.bundled_model is None:
                    raise EngineError(f"a {kind} voice needs 'model': {spec.model_hint}")
                path = spec.bundled_model()
            expected = self.expected(path)
            context = EngineContext(
                path,
                precision,
                expected,
                self._hasher.sha256,
                self.session,
                self.on_loader,
                early_start=self.settings.synthesis.chattts_early_start,
                models_dir=self._models_dir,
            )
            engine = spec.build(context)
            self._engines[key] = engine
            self.residency.files_mb[engine.identity] = files_mb(path)
            if spec.check_files is not None:
                problem = spec.check_files(path, expected, self._hasher.sha256)
                if problem:
                    self._unverified[engine.identity] = problem
                elif expected and len(expected) == 1 and path.is_file():
                    # A model folder (ChatTTS) is verified by its engine at every load.
                    (want,) = expected.values()
                    self._model_files[id(engine)] = (path, want)
            return engine

    def add_fallback(
        self, engine: Engine, voice: str, rebuild: Callable[[str], Voice], *, instead: str
    ) -> None:
        """If ``engine`` fails to load, replace voice ``voice`` by ``rebuild(reason)``, which
        runs on ``instead`` (as errors and logs name it), and raise BackendFallbackError."""
        with self._lock:
            fallback = self._fallbacks.setdefault(id(engine), _Fallback(instead))
            fallback.voices[voice] = rebuild

    def __iter__(self) -> Iterator[Voice]:
        return iter(list(self._voices.values()))

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

    def fast_voice_for(self, voice: Voice, language: str | None) -> Voice | None:
        """The voice that answers for ``voice`` when it would be too slow: its fast voice. A
        voice configured with ``fast_voice: auto`` whose resolved fast voice does not speak
        ``language`` (or that resolved to none) gets the quickest other configured voice that
        does, so a Chinese Piper voice answers a ChatTTS voice's Chinese text under load."""
        name = voice.settings.fast_voice
        fast = self._voices.get(name) if name and name != AUTO_FAST_VOICE else None
        if language is None or (fast is not None and language in fast.engine.languages):
            return fast
        configured = self.settings.voices.get(voice.name)
        if configured is None or configured.fast_voice != AUTO_FAST_VOICE:
            return fast
        own_cost = voice.spec.seed_seconds_per_char
        candidates = [
            v
            for v in self._voices.values()
            if v is not voice
            and language in v.engine.languages
            and v.spec.seed_seconds_per_char < own_cost
        ]
        if not candidates:
            return fast
        return min(
            candidates,
            key=lambda v: (v.tier != "fast", v.spec.seed_seconds_per_char),
        )

    def engines(self) -> list[Engine]:
        return list(self._engines.values())

    def loaded(self) -> list[str]:
        """The engines in memory: loaded, or being unloaded with their memory not back yet."""
        return [e.identity for e in self._resident()]

    def resident_mb(self) -> dict[str, float]:
        """Measured resident size of each engine in memory (see ``loaded``)."""
        return self.residency.resident_mb(self._resident())

    def _resident(self) -> list[Engine]:
        return [e for e in self._engines.values() if e.loaded or self.residency.releasing(e)]

    def _loaded(self) -> list[Engine]:
        return [e for e in self._engines.values() if e.loaded]

    def on_loader(self, make: Callable[[], Any]) -> Any:
        """``make()`` run on the loader thread (normal priority, see ``Residency.load``)."""
        return self.residency.on_loader(make)

    def ensure_loaded(self, engine: Engine) -> None:
        """Load `engine` within the memory budget (unloading least recently used ones).

        Only verified models load: a file missing from the manifest or with another hash is
        refused (the identity includes the actual hash, so a changed file is never a cache hit).
        """
        self.residency.used(engine)
        if engine.loaded:
            return
        problem = self._unverified.get(engine.identity)
        if problem:
            raise EngineError(problem)
        with self._lock:
            if engine.loaded:
                return
            self._verify_model_file(engine)
            fallback = self._fallbacks.get(id(engine))
            if fallback is not None and fallback.failed is not None:
                # A request validated before the switch still holds the old voice.
                raise BackendFallbackError(fallback.failed)
            self.residency.make_room(engine, self._loaded())
            try:
                self.residency.load(engine)
            except Exception as exc:
                if fallback is None:
                    raise
                self._fall_back(engine, fallback, exc)

    def _verify_model_file(self, engine: Engine) -> None:
        """The engine's model file as its identity says, checked at every load (after an idle
        unload too): a file swapped since start is refused, so audio made from it is never
        cached under the identity of the original. One stat while the file is unchanged."""
        known = self._model_files.get(id(engine))
        if known is None:
            return
        path, want = known  # the identity was built from a file of this hash (check_files)
        try:
            self._hasher.verify(path, want)
        except ModelFileError as exc:
            _LOGGER.error("Refusing to load %s: %s", engine.identity, exc)
            raise

    def _fall_back(self, engine: Engine, fallback: _Fallback, exc: Exception) -> None:
        """Rebuild the voices of a failed engine on their fallback; always raises."""
        reason = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
        names = ", ".join(sorted(fallback.voices))
        fallback.failed = (
            f"{engine.identity} failed to load, voice(s) {names} now use {fallback.instead}: "
            f"{reason}"
        )
        for name, rebuild in fallback.voices.items():
            if name in self._voices:  # not one removed since
                self._voices[name] = rebuild(reason)
        _LOGGER.error(
            "%s failed to load (%s); voice(s) %s fall back to %s",
            engine.identity,
            reason,
            names,
            fallback.instead,
        )
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # telling others must not turn a fallback into a failure
                _LOGGER.exception("Reporting the fallback failed")
        raise BackendFallbackError(fallback.failed) from exc

    def unload_idle(self, idle_s: float, now: float | None = None) -> list[str]:
        """Unload engines unused for `idle_s` seconds; returns their identities."""
        now = time.monotonic() if now is None else now
        with self._lock:
            dropped = self.residency.unload_idle(self._loaded(), idle_s, now)
        for identity in dropped:
            _LOGGER.info("Unloaded %s after %.0f s unused", identity, idle_s)
        return dropped

    def unload_all(self) -> None:
        with self._lock:
            for engine in self._loaded():
                self.residency.unload(engine)


def _session_plan(
    settings: Settings, threads: int | None, plan: ThreadPlan | None
) -> OnnxSessionPlan:
    """The onnxruntime session options: the plan's, else from the settings (and hardware)."""
    if plan is not None:
        session = plan.onnx_session()
        return replace(session, intra_op_threads=threads) if threads else session
    synthesis = settings.synthesis
    intra = threads or synthesis.onnx_threads or len(os.sched_getaffinity(0))
    if synthesis.onnx_spinning == "auto":
        from tts_bridge.system.hardware import detect_hardware
        from tts_bridge.system.threads import choose_spinning

        spinning, _ = choose_spinning(
            "auto", detect_hardware(), threads=intra, concurrency=synthesis.workers or 1
        )
    else:
        spinning = synthesis.onnx_spinning == "on"
    return OnnxSessionPlan(
        intra_op_threads=intra,
        inter_op_threads=synthesis.onnx_inter_op_threads or 1,
        spinning=spinning,
        arena=synthesis.onnx_arena,
    )
