"""ChatTTS voices in the engine pool: the backend a ``chattts`` voice runs on, and its INT8 tier.

A ``chattts`` voice names a torch checkpoint. With ``backend: auto`` (the default) it runs on
the FP32 graphs of an ONNX export of exactly that checkpoint when ``models.dir`` has one (found
by the checkpoint's file hashes, which the export records), else on torch; if the export then
fails to load, the voice moves to torch. When the export also has INT8 graphs and the voice has
no fast voice of its own, the same speaker on them becomes its fast tier (``<name>_int8``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tts_bridge.engines import catalog
from tts_bridge.engines.base import EngineError
from tts_bridge.engines.catalog import FALLBACK_FAST_VOICE
from tts_bridge.engines.chattts.voice_options import ChatTTSVoiceOptions
from tts_bridge.engines.registry import EnginePool, Voice
from tts_bridge.engines.settings import AUTO_FAST_VOICE, VoiceSettings

_LOGGER = logging.getLogger(__name__)


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


def find_chattts_exports(models_dir: Path) -> list[OnnxExport]:
    """ChatTTS ONNX exports with FP32 graphs: the folders of the user manifest's models and the
    folders directly under ``models_dir`` whose manifest.json is a chattts-onnx one. Recorded
    exports come first, then by name."""
    from tts_bridge.engines.chattts.onnx_format import MANIFEST_FILE, precision_files, read_manifest
    from tts_bridge.engines.manifests import ManifestError, user_manifests

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


class ChatTTSVoices:
    """Builds the ``chattts`` voices of one pool (see the module docstring); the exports in
    ``models.dir`` are looked for once, on the first voice that may use one."""

    def __init__(self, pool: EnginePool) -> None:
        self._pool = pool
        self._exports: list[OnnxExport] | None = None

    def __call__(self, name: str, voice: VoiceSettings, model: Path | None) -> list[Voice]:
        chosen, fast = self._voice(name, voice, model)
        _LOGGER.info("Voice %s: ChatTTS on %s (%s)", name, chosen.backend, chosen.backend_note)
        return [chosen] if fast is None else [chosen, fast]  # its INT8 tier listed after it

    def _voice(
        self, name: str, voice: VoiceSettings, model: Path | None
    ) -> tuple[Voice, Voice | None]:
        """The voice on the backend its settings ask for (see ChatTTSVoiceOptions.backend)."""
        pool = self._pool
        given = ChatTTSVoiceOptions.of(voice)
        resolved = voice
        if voice.fast_voice == AUTO_FAST_VOICE:
            # Resolved below to the INT8 tier when the export has one; this is the fallback.
            known = FALLBACK_FAST_VOICE in pool.settings.voices
            otherwise = FALLBACK_FAST_VOICE if known else None
            resolved = voice.model_copy(update={"fast_voice": otherwise})

        on_torch_settings = resolved  # a fallback to torch has no INT8 tier of the export
        tier = voice.tier or catalog.spec("chattts").tier  # on either backend

        def on_torch(note: str) -> Voice:
            engine = pool.engine("chattts", model, voice.precision)
            return Voice(name, engine, given.spk_emb, on_torch_settings, tier, "torch", note)

        if given.backend == "torch" or model is None:
            # No model: the pool refuses it with the reason.
            return on_torch("set by the voice (backend: torch)"), None
        export, why = self._find_export(model)
        if export is None:
            if given.backend == "onnx":
                raise EngineError(
                    f"voices.{name}.backend: onnx needs an ONNX export of {model}, and {why}; "
                    f"run: tts-bridge models export chattts --from {model} "
                    f"--to {pool.models_dir / (model.name + '-onnx')}"
                )
            return on_torch(f"auto: {why}"), None
        engine = pool.engine("chattts-onnx", export.folder, "fp32", variant=":backend")
        note = f"{given.backend}: FP32 graphs of the ONNX export {export.name} ({export.folder})"
        if given.backend == "auto":
            pool.add_fallback(
                engine,
                name,
                lambda reason: on_torch(f"auto: torch, the ONNX export failed to load: {reason}"),
                instead="torch",
            )
        fast = self._int8_fast_voice(name, voice, export)
        if fast is not None:
            resolved = voice.model_copy(update={"fast_voice": fast.name})
            note += f"; fast tier {fast.name} (INT8 graphs, same speaker)"
        return Voice(name, engine, given.spk_emb, resolved, tier, "onnx", note), fast

    def _int8_fast_voice(self, name: str, voice: VoiceSettings, export: OnnxExport) -> Voice | None:
        """The same speaker on the export's INT8 graphs, as the fast tier of a ChatTTS voice
        that has none configured: under load the voice keeps its timbre instead of switching to
        another engine's speaker, and its sentences are re-rendered in FP32 at idle."""
        fast_name = f"{name}_int8"
        if (
            voice.fast_voice not in (None, AUTO_FAST_VOICE)
            or fast_name in self._pool.settings.voices
        ):
            return None
        if not export.has_int8:
            return None
        given = ChatTTSVoiceOptions.of(voice)
        settings = VoiceSettings(
            engine="chattts-onnx",
            model=export.folder,
            precision="int8",
            tier="fast",
            spk_emb=given.spk_emb,
            spk_emb_sha256=given.spk_emb_sha256,
            options=dict(voice.options),
            speed=voice.speed,
            description=f"{name} on the INT8 graphs of {export.name} (its fast tier)",
        )
        engine = self._pool.engine("chattts-onnx", export.folder, "int8")
        return Voice(
            fast_name,
            engine,
            given.spk_emb,
            settings,
            "fast",
            "onnx",
            f"fast tier of {name} (INT8)",
        )

    def _find_export(self, model: Path) -> tuple[OnnxExport | None, str]:
        """The ONNX export of the checkpoint in ``model``, or None and why there is none."""
        models_dir = self._pool.models_dir
        expected = self._pool.expected(model)
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
            self._exports = find_chattts_exports(models_dir)
        for export in self._exports:
            if export.folder != model.resolve() and export_matches(export.source, expected):
                return export, ""
        others = f"; {len(self._exports)} of other checkpoints" if self._exports else ""
        return None, f"no ONNX export of this checkpoint in {models_dir}{others}"
