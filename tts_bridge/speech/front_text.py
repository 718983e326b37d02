"""The front text: what a voice is given for a sentence (the lexicon, then the language front end
its engine asks for), and so the one place a cache key's sentence is made.

A changed reading (a lexicon edit, a new normalization) changes the key, so it renders fresh
audio; a sentence the front end leaves alone keeps its key.
"""

from __future__ import annotations

from tts_bridge.config import Settings
from tts_bridge.engines.base import Engine, SynthesisOptions
from tts_bridge.engines.registry import Voice
from tts_bridge.speech.cache import CacheKey
from tts_bridge.speech.loudness import LoudnessNormalizer
from tts_bridge.speech.pronunciations import Pronunciations
from tts_bridge.text.voice import for_voice


class FrontText:
    """Sentences as engines read them, and the cache keys they are kept under."""

    def __init__(
        self, settings: Settings, pronunciations: Pronunciations, loudness: LoudnessNormalizer
    ) -> None:
        self._settings = settings
        self.pronunciations = pronunciations
        """The lexicon (edited while running: each sentence reads its entries then)."""
        self._loudness = loudness

    def text(self, engine: Engine, sentence: str) -> str:
        """The sentence as the engine's phonemizer needs it (its `front_end`, see
        `tts_bridge.engines.base.FrontEnd`): what the engine is given and what its cache key
        holds."""
        # The lexicon first: a respelled name is then read like any other word, a number in a
        # respelling like any other number.
        phonemes = bool(getattr(engine, "lexicon_phonemes", False))
        sentence = self.pronunciations.apply(sentence, phonemes=phonemes)
        front = getattr(engine, "front_end", "none")
        return for_voice(front, sentence, date_order=self._settings.synthesis.date_order)

    def key(self, voice: Voice, sentence: str, options: SynthesisOptions) -> CacheKey:
        """The cache key of `sentence` spoken by `voice` with `options`."""
        return CacheKey(
            sentence=self.text(voice.engine, sentence),
            engine=voice.engine.identity,
            voice=voice.name,
            speaker=voice.speaker,
            options=tuple(sorted(options.cache_fields().items())),
            sample_rate=voice.engine.sample_rate,
            loudness=self._loudness.cache_field(),
        )
