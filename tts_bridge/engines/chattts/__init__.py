"""ChatTTS, one family, one module a job (torch and onnxruntime imported only inside engines):

``common`` what both engines share (options, text chunking, file checks, the engine base),
``speaker`` spk_emb strings and speaker statistics, ``torch_engine`` ChatTTS itself on torch,
``onnx_format`` the ONNX export's files and manifest, ``onnx_model`` its sessions, code loop,
sampler and KV cache, ``onnx_stream`` the ISTFT and streaming decoders, ``onnx_engine`` the
torch-free engine, ``refine`` the refine pass on ONNX, and the one-off ``export`` and
``quantize``.

Importing the family registers its two engine kinds: ``chattts`` (a checkpoint, on torch or on
the FP32 graphs of its ONNX export, see ``pool``) and ``chattts-onnx`` (an export itself).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tts_bridge.engines.base import Engine
from tts_bridge.engines.catalog import EngineContext, EngineSpec, register
from tts_bridge.engines.chattts.common import ChatTTSEngineBase, ChatTTSOptions
from tts_bridge.engines.chattts.voice_options import ChatTTSOnnxVoiceOptions, ChatTTSVoiceOptions

if TYPE_CHECKING:
    from tts_bridge.engines.registry import EnginePool, VoiceFactory
    from tts_bridge.engines.settings import VoiceSettings

__all__ = ["CHATTTS", "CHATTTS_ONNX"]


def _speaker(voice: VoiceSettings) -> str | None:
    return ChatTTSOnnxVoiceOptions.of(voice).spk_emb


def _check_speaker(voice: VoiceSettings) -> None:
    """A configured spk_emb is the one its SHA-256 names and a well-formed speaker: a changed
    character would silently be another voice."""
    given = ChatTTSOnnxVoiceOptions.of(voice)
    if given.spk_emb is None:
        return
    from tts_bridge.engines.chattts.speaker import SpeakerError, validate_spk_emb

    actual = hashlib.sha256(given.spk_emb.encode()).hexdigest()
    if given.spk_emb_sha256 is None:
        raise ValueError(f"spk_emb_sha256 is missing (the spk_emb's SHA-256 is {actual})")
    if actual != given.spk_emb_sha256.lower():
        raise ValueError(
            f"spk_emb does not match spk_emb_sha256 (expected {given.spk_emb_sha256}, "
            f"actual {actual}): the embedding was changed"
        )
    try:
        validate_spk_emb(given.spk_emb)
    except SpeakerError as exc:
        raise ValueError(f"spk_emb is malformed: {exc}") from exc


def _build_torch(context: EngineContext) -> Engine:
    from tts_bridge.engines.chattts.torch_engine import ChatTTSEngine

    return ChatTTSEngine(
        context.model,
        expected_sha256=context.expected,
        threads=context.session.intra_op_threads,
        hasher=context.sha256,
    )


def _check_checkpoint(
    path: Path, expected: Mapping[str, str] | None, sha256: Callable[[Path], str]
) -> str | None:
    # The engine checks the files against the manifest, or without one against the official
    # release's hashes. A checkpoint with speaker statistics is not the official release (it
    # has none): unrecorded, say so rather than let it fail against the official hashes.
    if expected is None and (path / "asset" / "spk_stat.json").exists():
        return (
            f"ChatTTS checkpoint {path} is not in the model manifest; trust it with "
            f"'tts-bridge models add NAME {path}'"
        )
    return None


def _backends(pool: EnginePool) -> VoiceFactory:
    from tts_bridge.engines.chattts.pool import ChatTTSVoices

    return ChatTTSVoices(pool)


def _build_onnx(context: EngineContext) -> Engine:
    from tts_bridge.engines.chattts.onnx_early import EarlyStart
    from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine

    # The only engine that takes the whole session plan: spinning and the arena too.
    return ChatTTSOnnxEngine(
        context.model,
        precision=context.precision,
        expected_sha256=context.expected,
        threads=context.session.intra_op_threads,
        arena=context.session.arena,
        spinning=context.session.spinning,
        hasher=context.sha256,
        on_loader=context.on_loader,
        early_start=EarlyStart() if context.early_start else None,
    )


CHATTTS = register(
    EngineSpec(
        kind="chattts",
        build=_build_torch,
        tier="quality",
        # torch FP32 on CPU, slower than real time; replaced by the first measurement.
        seed_seconds_per_char=0.27,
        languages=ChatTTSEngineBase.languages,
        model_hint="the checkpoint folder",
        runtime_mb=900,
        options=ChatTTSOptions,
        voice_options=ChatTTSVoiceOptions,
        speaker=_speaker,
        check_voice=_check_speaker,
        check_files=_check_checkpoint,
        voices=_backends,
        auto_fast_voice=True,
    )
)

CHATTTS_ONNX = register(
    EngineSpec(
        kind="chattts-onnx",
        build=_build_onnx,
        tier="fast",
        seed_seconds_per_char=0.06,
        languages=ChatTTSEngineBase.languages,
        model_hint="the export folder",
        options=ChatTTSOptions,
        voice_options=ChatTTSOnnxVoiceOptions,
        speaker=_speaker,
        check_voice=_check_speaker,
        check_files=None,  # the engine checks the export's files against its manifest.json
    )
)
