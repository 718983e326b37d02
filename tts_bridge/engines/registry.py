"""Voices to engines: one engine per model file, loaded lazily, shared by its voices, unloaded
when idle or when another model needs the memory.

Memory: before a model loads, its need is estimated (the last measured resident size, else the
size of its files times a factor); least recently used engines are unloaded until it fits the
budget, and a model that cannot fit even alone is refused with a clear error rather than
risking the out-of-memory killer. After loading, the measured RSS growth becomes the engine's
resident size.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psutil

from tts_bridge.config import AUTO_FAST_VOICE, FALLBACK_FAST_VOICE, Settings, VoiceSettings
from tts_bridge.engines.base import Engine, EngineError
from tts_bridge.manifests import FileHasher
from tts_bridge.speech.hardware import OnnxSessionPlan

if TYPE_CHECKING:
    from tts_bridge.speech.hardware import ThreadPlan

_LOGGER = logging.getLogger(__name__)

# Resident memory per byte of model file before a measurement exists (onnxruntime and torch
# keep roughly one copy of the weights plus their runtime; measured 3-4x for Piper and hibari).
_FILE_TO_RSS = 4.0
_RUNTIME_MB = {"piper": 60, "hibari": 150, "chattts": 900}  # runtime import, measured RSS


class UnknownVoiceError(LookupError):
    """The request named a voice that is not configured."""


class MemoryBudgetError(EngineError):
    """A model does not fit the memory budget even with every other model unloaded."""


class BackendFallbackError(EngineError):
    """A ChatTTS voice's ONNX backend failed to load and the pool switched the voice to torch.

    The voice's engine, and with it every cache key, changed: look the voice up again
    (``pool.voice(name)``) and start over with the key. Raised only for ``backend: auto``.
    """


Backend = Literal["torch", "onnx"]


@dataclass(frozen=True)
class Voice:
    """A configured voice: the engine that speaks it and the engine's speaker name."""

    name: str
    engine: Engine
    speaker: str | None
    settings: VoiceSettings
    backend: Backend | None = None
    """ChatTTS voices (``engine: chattts``): the backend serving it now; None for the others."""
    backend_note: str = ""
    """Why that backend: auto's choice, or the reason of a fallback to torch."""


@dataclass(frozen=True)
class OnnxExport:
    """A ChatTTS ONNX export found in models.dir or the user manifest."""

    folder: Path
    name: str
    """Its model name in the user manifest, else its folder name."""
    recorded: bool
    """Recorded in the user manifest (``models export`` does that)."""
    source: Mapping[str, str]
    """Relative path -> SHA-256 of the torch checkpoint files it was exported from."""
    has_int8: bool = False
    """It has INT8 graphs too (`models quantize`)."""


@dataclass
class _Fallback:
    """The auto-selected ONNX engine of some ChatTTS voices and how to put them on torch."""

    voices: dict[str, Callable[[str], Voice]] = field(default_factory=dict)
    """Voice name -> builds that voice on torch (given the reason)."""
    failed: str | None = None
    """Why the ONNX engine failed to load, once it has."""


def _files_mb(path: Path) -> float:
    if path.is_dir():
        total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    else:
        total = path.stat().st_size
    return total / 2**20


def manifest_hashes(path: Path, models_dir: Path) -> dict[str, str] | None:
    """Expected SHA-256 per file (relative to the model's root) from the model manifests."""
    from tts_bridge.manifests import ManifestError, find_manifest

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


def find_chattts_exports(models_dir: Path) -> list[OnnxExport]:
    """ChatTTS ONNX exports with FP32 graphs: the folders of the user manifest's models and the
    folders directly under ``models_dir`` whose manifest.json is a chattts-onnx one. Recorded
    exports come first, then by name."""
    from tts_bridge.engines.chattts.onnx_engine import MANIFEST_FILE, precision_files, read_manifest
    from tts_bridge.manifests import ManifestError, user_manifests

    candidates: dict[Path, tuple[str, bool]] = {}
    try:
        for name, manifest in sorted(user_manifests(models_dir).items()):
            try:
                candidates.setdefault(manifest.folder(models_dir).resolve(), (name, True))
            except ManifestError:
                continue
    except ManifestError as exc:
        _LOGGER.warning("Looking for ChatTTS ONNX exports: %s", exc)
    if models_dir.is_dir():
        for child in sorted(models_dir.iterdir()):
            if child.is_dir() and (child / MANIFEST_FILE).is_file():
                candidates.setdefault(child.resolve(), (child.name, False))
    exports = []
    for folder, (name, recorded) in candidates.items():
        if not (folder / MANIFEST_FILE).is_file():
            continue
        try:
            data = read_manifest(folder)
            precision_files(data, "fp32")
        except EngineError as exc:
            _LOGGER.debug("Not a usable ChatTTS ONNX export: %s", exc)
            continue
        source = (data.get("source") or {}).get("sha256")
        if not isinstance(source, dict):
            continue
        hashes = {str(rel): str(digest).lower() for rel, digest in source.items()}
        int8 = "int8" in data["variants"]
        exports.append(OnnxExport(folder, name, recorded, hashes, int8))
    exports.sort(key=lambda e: (not e.recorded, e.name))
    return exports


def export_matches(source: Mapping[str, str], expected: Mapping[str, str]) -> bool:
    """True when an export's ``source.sha256`` is exactly the checkpoint the pool trusts: every
    file ChatTTS loads (and the speaker statistics, where either side has them) with equal
    hashes."""
    from tts_bridge.engines.chattts.torch_engine import CHECKPOINT_FILES, SPK_STAT_FILE

    keys = {*CHECKPOINT_FILES, *source}
    if SPK_STAT_FILE in expected:
        keys.add(SPK_STAT_FILE)
    return all(
        rel in source and rel in expected and source[rel].lower() == expected[rel].lower()
        for rel in keys
    )


def _build_engine(
    kind: str,
    model: Path | None,
    hasher: FileHasher,
    session: OnnxSessionPlan,
    expected: Callable[[Path], Mapping[str, str] | None],
    *,
    precision: Literal["int8", "fp32"] = "int8",
    on_loader: Callable[[Callable[[], Any]], Any] | None = None,
) -> tuple[Engine, Path]:
    # Piper and hibari build their sessions themselves from a thread count (intra-op); only
    # the ChatTTS ONNX engine takes spinning and the arena. Every session is sequential.
    threads = session.intra_op_threads
    if kind == "piper":
        from tts_bridge.engines import piper

        path = model or piper.bundled_model()
        return piper.PiperEngine(path, hasher.sha256(path), threads), path
    if kind == "hibari":
        from tts_bridge.engines import hibari

        path = model or hibari.bundled_model()
        return hibari.HibariEngine(path, hasher.sha256(path), threads), path
    if kind == "chattts":
        from tts_bridge.engines.chattts.torch_engine import ChatTTSEngine

        if model is None:
            raise EngineError("a chattts voice needs 'model': the checkpoint folder")
        engine = ChatTTSEngine(
            model, expected_sha256=expected(model), threads=threads, hasher=hasher.sha256
        )
        return engine, model
    if kind == "chattts-onnx":
        from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine

        if model is None:
            raise EngineError("a chattts-onnx voice needs 'model': the export folder")
        onnx_engine = ChatTTSOnnxEngine(
            model,
            precision=precision,
            expected_sha256=expected(model),
            threads=threads,
            arena=session.arena,
            spinning=session.spinning,
            hasher=hasher.sha256,
            on_loader=on_loader,
        )
        return onnx_engine, model
    raise EngineError(f"unknown engine {kind!r}")


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
    ) -> None:
        self._settings = settings
        self._hasher = FileHasher()
        self._lock = threading.RLock()
        self._engines: dict[tuple[str, str], Engine] = {}
        self._voices: dict[str, Voice] = {}
        self._default_voice = settings.default_voice
        self._files_mb: dict[str, float] = {}
        self._resident_mb: dict[str, float] = {}
        self.load_seconds: dict[str, float] = {}
        """How long each engine's last load took (identity -> seconds)."""
        self._last_used: dict[str, float] = {}
        self.memory_budget_mb = (
            settings.models.memory_budget_mb
            or memory_budget_mb
            or (plan.memory_budget_mb if plan is not None else None)
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
        self._exports: list[OnnxExport] | None = None
        self._fallbacks: dict[int, _Fallback] = {}
        self._unverified: dict[str, str] = {}
        self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="model-load")
        # Start its thread now, from the constructing (normal-priority) thread: an executor
        # starts threads on first use, from whichever thread submits.
        self._loader.submit(lambda: None).result()
        self.on_change: Callable[[], None] | None = None
        """Called after the voices changed while running (a backend fell back to torch)."""
        for name, voice in settings.voices.items():
            model = voice.model
            if model is not None and not model.is_absolute():
                model = settings.models.dir / model
            if model is not None and not model.exists():
                raise EngineError(f"voices.{name}.model: {model} does not exist")
            if voice.engine == "chattts":
                chosen, fast = self._chattts_voice(name, voice, model)
                self._voices[name] = chosen
                if fast is not None:  # its INT8 tier, listed after it
                    self._voices[fast.name] = fast
                _LOGGER.info(
                    "Voice %s: ChatTTS on %s (%s)", name, chosen.backend, chosen.backend_note
                )
            else:
                engine = self._engine(voice.engine, model, voice.precision, voice.tier)
                speaker = voice.spk_emb if voice.engine == "chattts-onnx" else voice.speaker
                self._voices[name] = Voice(name, engine, speaker, voice)
        _LOGGER.debug("Voices: %s", ", ".join(f"{v.name}={v.engine.identity}" for v in self))
        _LOGGER.debug("ONNX sessions: %s", self.session.describe())

    def _expected(self, path: Path) -> Mapping[str, str] | None:
        # Looked up once per model path: each lookup reads every manifest file.
        if path not in self._known:
            self._known[path] = manifest_hashes(path, self._models_dir)
        return self._known[path]

    def _engine(
        self,
        kind: str,
        model: Path | None,
        precision: Literal["int8", "fp32"],
        tier: Literal["quality", "fast"] | None,
        *,
        variant: str = "",
    ) -> Engine:
        """The shared engine for this model (built on first use; nothing is loaded)."""
        key = (kind, f"{model or ''}:{precision}{variant}")
        with self._lock:
            engine = self._engines.get(key)
            if engine is not None:
                return engine
            engine, path = _build_engine(
                kind,
                model,
                self._hasher,
                self.session,
                self._expected,
                precision=precision,
                on_loader=self.on_loader,
            )
            if tier is not None:
                engine.tier = tier
            self._engines[key] = engine
            self._files_mb[engine.identity] = _files_mb(path)
            if not kind.startswith("chattts"):  # ChatTTS checks its own files
                problem = self._check_manifest(path, self._expected(path))
                if problem:
                    self._unverified[engine.identity] = problem
            elif kind == "chattts" and (
                self._expected(path) is None and (path / "asset" / "spk_stat.json").exists()
            ):
                # Not the official release (it has no spk_stat.json) and never added: say
                # so, rather than let it fail against the official hashes.
                self._unverified[engine.identity] = (
                    f"ChatTTS checkpoint {path} is not in the model manifest; trust it with "
                    f"'tts-bridge models add NAME {path}'"
                )
            return engine

    def _chattts_voice(
        self, name: str, voice: VoiceSettings, model: Path | None
    ) -> tuple[Voice, Voice | None]:
        """A ChatTTS voice on the backend its settings ask for (see VoiceSettings.backend)."""

        resolved = voice
        if voice.fast_voice == AUTO_FAST_VOICE:
            # Resolved below to the INT8 tier when the export has one; this is the fallback.
            known = FALLBACK_FAST_VOICE in self._settings.voices
            otherwise = FALLBACK_FAST_VOICE if known else None
            resolved = voice.model_copy(update={"fast_voice": otherwise})

        on_torch_settings = resolved  # a fallback to torch has no INT8 tier of the export

        def on_torch(note: str) -> Voice:
            engine = self._engine("chattts", model, voice.precision, voice.tier)
            return Voice(name, engine, voice.spk_emb, on_torch_settings, "torch", note)

        if voice.backend == "torch" or model is None:
            # No model: _build_engine refuses it with the reason.
            return on_torch("set by the voice (backend: torch)"), None
        export, why = self._find_export(model)
        if export is None:
            if voice.backend == "onnx":
                raise EngineError(
                    f"voices.{name}.backend: onnx needs an ONNX export of {model}, and {why}; "
                    f"run: tts-bridge models export chattts --from {model} "
                    f"--to {self._models_dir / (model.name + '-onnx')}"
                )
            return on_torch(f"auto: {why}"), None
        engine = self._engine(
            "chattts-onnx", export.folder, "fp32", voice.tier or "quality", variant=":backend"
        )
        note = f"{voice.backend}: FP32 graphs of the ONNX export {export.name} ({export.folder})"
        if voice.backend == "auto":
            fallback = self._fallbacks.setdefault(id(engine), _Fallback())
            fallback.voices[name] = on_torch
        fast = self._int8_fast_voice(name, voice, export)
        if fast is not None:
            resolved = voice.model_copy(update={"fast_voice": fast.name})
            note += f"; fast tier {fast.name} (INT8 graphs, same speaker)"
        return Voice(name, engine, voice.spk_emb, resolved, "onnx", note), fast

    def _int8_fast_voice(self, name: str, voice: VoiceSettings, export: OnnxExport) -> Voice | None:
        """The same speaker on the export's INT8 graphs, as the fast tier of a ChatTTS voice
        that has none configured: under load the voice keeps its timbre instead of switching to
        another engine's speaker, and its sentences are re-rendered in FP32 at idle."""
        fast_name = f"{name}_int8"
        if voice.fast_voice not in (None, AUTO_FAST_VOICE) or fast_name in self._settings.voices:
            return None
        if not export.has_int8:
            return None
        settings = VoiceSettings(
            engine="chattts-onnx",
            model=export.folder,
            precision="int8",
            tier="fast",
            spk_emb=voice.spk_emb,
            spk_emb_sha256=voice.spk_emb_sha256,
            options=dict(voice.options),
            speed=voice.speed,
            description=f"{name} on the INT8 graphs of {export.name} (its fast tier)",
        )
        engine = self._engine("chattts-onnx", export.folder, "int8", "fast")
        return Voice(
            fast_name, engine, voice.spk_emb, settings, "onnx", f"fast tier of {name} (INT8)"
        )

    def _find_export(self, model: Path) -> tuple[OnnxExport | None, str]:
        """The ONNX export of the checkpoint in ``model``, or None and why there is none."""
        expected = self._expected(model)
        if expected is None:
            from tts_bridge.engines.chattts.torch_engine import official_sha256

            try:
                expected = official_sha256()  # what ChatTTSEngine checks without a manifest
            except EngineError:
                return None, (
                    f"the checkpoint {model} is not in the model manifest, so no export can be "
                    f"matched to it (trust it with 'tts-bridge models add NAME {model}')"
                )
        if self._exports is None:
            self._exports = find_chattts_exports(self._models_dir)
        for export in self._exports:
            if export.folder != model.resolve() and export_matches(export.source, expected):
                return export, ""
        others = f"; {len(self._exports)} of other checkpoints" if self._exports else ""
        return None, f"no ONNX export of this checkpoint in {self._models_dir}{others}"

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

    def on_loader(self, make: Callable[[], Any]) -> Any:
        """``make()`` run on the loader thread (normal priority, see ``ensure_loaded``)."""
        return self._loader.submit(make).result()

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
            fallback = self._fallbacks.get(id(engine))
            if fallback is not None and fallback.failed is not None:
                # A request validated before the switch still holds the old voice.
                raise BackendFallbackError(fallback.failed)
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
            try:
                # On the loader thread (normal priority): runtimes start their worker threads
                # while loading, and threads inherit the niceness of the thread creating them.
                # Loaded from the idle thread (nice +10), every later live request would
                # compute on deprioritized threads.
                self._loader.submit(engine.load).result()
            except Exception as exc:
                if fallback is None:
                    raise
                self._fall_back(engine, fallback, exc)
            grown = max(0.0, (psutil.Process().memory_info().rss - before) / 2**20)
            if grown > 1:
                self._resident_mb[engine.identity] = grown
            self.load_seconds[engine.identity] = time.perf_counter() - started
            _LOGGER.info(
                "Loaded %s in %.2f s (+%.0f MB resident)",
                engine.identity,
                self.load_seconds[engine.identity],
                grown,
            )

    def _fall_back(self, engine: Engine, fallback: _Fallback, exc: Exception) -> None:
        """Put the voices of a failed auto-selected ONNX engine on torch; always raises."""
        reason = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
        names = ", ".join(sorted(fallback.voices))
        fallback.failed = (
            f"{engine.identity} failed to load, voice(s) {names} now use torch: {reason}"
        )
        for name, on_torch in fallback.voices.items():
            self._voices[name] = on_torch(f"auto: torch, the ONNX export failed to load: {reason}")
        _LOGGER.error(
            "ChatTTS ONNX backend %s failed to load (%s); voice(s) %s fall back to torch",
            engine.identity,
            reason,
            names,
        )
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # telling others must not turn a fallback into a failure
                _LOGGER.exception("Reporting the fallback failed")
        raise BackendFallbackError(fallback.failed) from exc

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
        from tts_bridge.speech.hardware import choose_spinning, detect_hardware

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
