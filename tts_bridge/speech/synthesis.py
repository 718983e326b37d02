"""Synthesis by step, put together: validation (request -> plan), the front text (what a voice is
given, and the cache key), rendering (cache or engine, loudness, chimes) and batched rendering.

`Synthesizer` holds one of each step for the pipeline, the idle work and the offline users (the
`say` command, the benchmark); each step is its own module, and the names they define are
re-exported here for those callers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tts_bridge.config import Settings
from tts_bridge.engines.base import Engine, SynthesisOptions
from tts_bridge.engines.registry import EnginePool, Voice
from tts_bridge.speech.batching import render_batch
from tts_bridge.speech.cache import CacheKey, SentenceCache
from tts_bridge.speech.chimes import ChimeLibrary
from tts_bridge.speech.front_text import FrontText
from tts_bridge.speech.loudness import LoudnessNormalizer
from tts_bridge.speech.metrics import Metrics
from tts_bridge.speech.pronunciations import Pronunciations
from tts_bridge.speech.rendering import (
    AudioPart,
    EngineStats,
    Renderer,
    Rendering,
    RenderParts,
    SentenceAudio,
    StreamLayout,
    StreamNumbering,
)
from tts_bridge.speech.request import Announcement, SpeechRequest
from tts_bridge.speech.routing import CostEstimator
from tts_bridge.speech.validation import (
    Plan,
    RequestError,
    Validator,
    options_for,
    options_for_plan,
    prepare_text,
)

__all__ = [
    "Announcement",
    "AudioPart",
    "EngineStats",
    "Plan",
    "Rendering",
    "RequestError",
    "SentenceAudio",
    "StreamLayout",
    "StreamNumbering",
    "Synthesizer",
    "prepare_text",
]


class Synthesizer:
    """One of each synthesis step, sharing the voices, the cache, the lexicon and the loudness."""

    def __init__(
        self,
        settings: Settings,
        engines: EnginePool,
        cache: SentenceCache,
        estimator: CostEstimator | None = None,
        pronunciations: Pronunciations | None = None,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self.engines = engines
        self.cache = cache
        self.loudness = LoudnessNormalizer(
            settings.synthesis.loudness_lufs, settings.synthesis.true_peak_dbtp
        )
        self.chimes = ChimeLibrary(settings.chimes, self.loudness)
        self.front = FrontText(
            settings,
            # Without a state folder: the configured entries, edits not kept.
            pronunciations or Pronunciations.from_settings(settings, None),
            self.loudness,
        )
        self.validator = Validator(settings, engines, self.chimes)
        self.renderer = Renderer(
            settings,
            RenderParts(engines, cache, self.front, self.loudness, self.chimes),
            estimator=estimator,
            metrics=metrics,
        )

    @property
    def pronunciations(self) -> Pronunciations:
        return self.front.pronunciations

    @property
    def estimator(self) -> CostEstimator:
        return self.renderer.estimator

    @property
    def stats(self) -> EngineStats:
        return self.renderer.stats

    @property
    def metrics(self) -> Metrics | None:
        return self.renderer.metrics

    # validation

    def plan(self, request: SpeechRequest) -> Plan:
        """A door's request checked: see `Validator.plan`."""
        return self.validator.plan(request)

    def validate(
        self,
        text: str,
        voice_name: str | None,
        lang: str | None,
        options: Mapping[str, object] | None = None,
        announcement: Announcement | None = None,
    ) -> Plan:
        return self.validator.validate(text, voice_name, lang, options, announcement)

    def options_for(
        self, voice: Voice, overrides: Mapping[str, object] | None = None
    ) -> SynthesisOptions:
        return options_for(voice, overrides)

    def options_for_plan(self, voice: Voice, plan: Plan) -> SynthesisOptions:
        return options_for_plan(voice, plan)

    # front text

    def front_text(self, engine: Engine, sentence: str) -> str:
        return self.front.text(engine, sentence)

    def _key(self, voice: Voice, sentence: str, options: SynthesisOptions) -> CacheKey:
        return self.front.key(voice, sentence, options)

    # rendering

    def is_cached(
        self, voice: Voice, sentence: str, options: SynthesisOptions | None = None
    ) -> bool:
        return self.renderer.is_cached(voice, sentence, options)

    def forget(self, voice: Voice, sentence: str, options: SynthesisOptions | None = None) -> bool:
        return self.renderer.forget(voice, sentence, options)

    def uncached_cost_s(
        self,
        voice: Voice,
        sentences: list[str],
        options: SynthesisOptions | None = None,
        *,
        use_cache: bool = True,
    ) -> float:
        return self.renderer.uncached_cost_s(voice, sentences, options, use_cache=use_cache)

    def speak(
        self,
        request: SpeechRequest,
        on_sentence: Callable[[SentenceAudio], None] | None = None,
    ) -> Rendering:
        """A request to a complete WAV with its own voice (offline use: the `say` command and
        the benchmark; no tier routing, no queue)."""
        plan = self.plan(request)
        return self.render_plan(
            plan, plan.voice, use_cache=request.use_cache, on_sentence=on_sentence
        )

    def render(
        self,
        text: str,
        voice_name: str | None = None,
        use_cache: bool = True,
        lang: str | None = None,
        on_sentence: Callable[[SentenceAudio], None] | None = None,
    ) -> Rendering:
        """Text to a complete WAV with the named voice (`speak` with a plain request)."""
        request = SpeechRequest(text=text, voice=voice_name, language=lang, use_cache=use_cache)
        return self.speak(request, on_sentence)

    def render_plan(
        self,
        plan: Plan,
        voice: Voice,
        *,
        use_cache: bool = True,
        on_sentence: Callable[[SentenceAudio], None] | None = None,
        on_part: Callable[[AudioPart], None] | None = None,
        volume: float | None = None,
        streaming: bool = False,
    ) -> Rendering:
        return self.renderer.render_plan(
            plan,
            voice,
            use_cache=use_cache,
            on_sentence=on_sentence,
            on_part=on_part,
            volume=volume,
            streaming=streaming,
        )

    def sentence(
        self,
        voice: Voice,
        index: int,
        text: str,
        options: SynthesisOptions,
        use_cache: bool,
        *,
        on_part: Callable[[AudioPart], None] | None = None,
        streaming: bool = False,
    ) -> SentenceAudio:
        return self.renderer.sentence(
            voice, index, text, options, use_cache, on_part=on_part, streaming=streaming
        )

    def sentences_batch(
        self, voice: Voice, texts: list[str], options: SynthesisOptions
    ) -> list[SentenceAudio]:
        """See `batching.render_batch`."""
        return render_batch(self.renderer, voice, texts, options)

    def layout(self, plan: Plan, sample_rate: int) -> StreamLayout:
        return self.renderer.layout(plan, sample_rate)

    def sentence_parts(
        self,
        pieces: Sequence[SentenceAudio],
        sample_rate: int,
        layout: StreamLayout | None = None,
    ) -> list[AudioPart]:
        return self.renderer.sentence_parts(pieces, sample_rate, layout)
