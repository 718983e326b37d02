"""The voices file: voices made at run time (`voices new`, `models download --add-voice`, the
bridge API), merged into the configured voices at start. One reader and one writer, so every
caller keeps the same layout (``voices: {name: entry}``) and the same durable write."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tts_bridge.config import Settings
from tts_bridge.engines.settings import AUTO_FAST_VOICE, VoiceSettings
from tts_bridge.settings_base import NAME_PATTERN
from tts_bridge.system.durable import write_atomic


class VoicesFileError(ValueError):
    """A voice that cannot be written (a bad name, an unreadable voices file)."""


def read_voices(path: Path) -> dict[str, Any]:
    """The voices in the file as plain mappings; {} when there is no file."""
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise VoicesFileError(f"cannot read {path}: {exc}") from exc
    voices = data.get("voices") if isinstance(data, dict) else None
    return dict(voices) if isinstance(voices, dict) else {}


def _write(path: Path, voices: Mapping[str, Any]) -> None:
    text = yaml.safe_dump(
        {"voices": dict(voices)}, sort_keys=False, allow_unicode=True, width=1 << 20
    )
    write_atomic(path, text)


def write_voice(path: Path, name: str, entry: Mapping[str, Any]) -> None:
    """Add or replace one voice in the file; the others stay as they are."""
    import re

    if not re.match(NAME_PATTERN, name):
        raise VoicesFileError(f"voice name {name!r} must match {NAME_PATTERN}")
    voices = read_voices(path)
    voices[name] = dict(entry)
    _write(path, voices)


def remove_voice(path: Path, name: str) -> bool:
    """Remove one voice from the file; False when it was not there."""
    voices = read_voices(path)
    if name not in voices:
        return False
    del voices[name]
    _write(path, voices)
    return True


def chattts_voice_from_seed(
    settings: Settings, seed: int, model: Path | None = None, fast_voice: str | None = None
) -> VoiceSettings:
    """A ChatTTS voice whose speaker is sampled deterministically from `seed`.

    `model` is a checkpoint folder (under models.dir when relative); without one, the first
    configured chattts voice's. Raises VoicesFileError when there is no checkpoint and
    EngineError when the checkpoint cannot sample a speaker.
    """
    from tts_bridge.engines.chattts.torch_engine import ChatTTSEngine
    from tts_bridge.engines.registry import manifest_hashes

    if model is None:
        chattts = [v for v in settings.voices.values() if v.engine == "chattts" and v.model]
        if not chattts:
            raise VoicesFileError("give --model CHECKPOINT_DIR (no chattts voice configured)")
        model = chattts[0].model
    assert model is not None
    folder = model if model.is_absolute() else settings.models.dir / model
    engine = ChatTTSEngine(folder, expected_sha256=manifest_hashes(folder, settings.models.dir))
    spk_emb = engine.sample_speaker(seed)
    return VoiceSettings(
        engine="chattts",
        model=model,
        spk_emb=spk_emb,
        spk_emb_sha256=hashlib.sha256(spk_emb.encode()).hexdigest(),
        fast_voice=(
            fast_voice
            if fast_voice == AUTO_FAST_VOICE or (fast_voice and fast_voice in settings.voices)
            else None
        ),
        description=f"ChatTTS speaker from seed {seed}",
    )
