"""Where ``models download`` puts each model under ``models.dir``, and the hint that names the
command fetching a missing one. Imports nothing heavy: the engine pool uses it at start-up."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

CHATTTS_DIR = "chattts"
"""The ChatTTS checkpoint (ChatTTS's asset layout), also its model name in the manifest."""
CHATTTS_ONNX_DIR = "chattts-onnx"
"""Its ONNX export (FP32 and INT8 graphs), also its model name in the manifest."""
PIPER_DIR = "piper"
"""Piper voices, one folder per voice: ``piper/<key>/<key>.onnx`` and ``.onnx.json``."""
KOKORO_VOICES_DIR = "kokoro/voices"
"""Kokoro voices fetched by ``models download kokoro NAME``: ``kokoro/voices/<NAME>.bin``."""
STAGING_DIR = ".downloads"
"""Downloads land here until every file is verified; never loaded from."""


def piper_model(key: str) -> PurePosixPath:
    """The path of a downloaded Piper voice's ``.onnx``, relative to models.dir."""
    return PurePosixPath(PIPER_DIR, key, f"{key}.onnx")


def piper_model_name(key: str) -> str:
    """The voice's name in the model manifest (like the bundled ``piper-en_US-joe-medium``)."""
    return f"piper-{key}"


def fetch_hint(model: Path, models_dir: Path) -> str:
    """The command that downloads ``model`` when it is where ``models download`` puts a model,
    else the manual way; for the error that reports a voice's missing model files."""
    try:
        rel = PurePosixPath(model.resolve().relative_to(models_dir.resolve()).as_posix())
    except ValueError:
        rel = None
    if rel is not None and rel.parts and rel.parts[0] in (CHATTTS_DIR, CHATTTS_ONNX_DIR):
        return "fetch it with: tts-bridge models download chattts"
    if rel is not None and len(rel.parts) == 3 and rel.parts[0] == PIPER_DIR:
        return f"fetch it with: tts-bridge models download piper {rel.parts[1]}"
    return (
        "put the files there (tts-bridge models download chattts | piper NAME fetches the "
        "known models), then trust them with 'tts-bridge models add NAME PATH'"
    )
