"""The bridge API's own actions on the speech core: the lexicon, the default voice, the cache
and pre-rendering, the chimes. Each takes the request's fields (a plain mapping, as the MQTT
bridge API and the web UI both have them) and returns what the answer carries."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from tts_bridge.control import phrases
from tts_bridge.control.errors import ControlError
from tts_bridge.speech.pipeline import Pipeline
from tts_bridge.speech.preferences import Preferences, PreferencesError
from tts_bridge.text.lexicon import LexiconError

_LOGGER = logging.getLogger(__name__)

Fields = Mapping[str, Any]


class Control:
    """The actions, on one pipeline; any thread (each part guards itself)."""

    def __init__(
        self,
        pipeline: Pipeline,
        preferences: Preferences,
        publish_info: Callable[[], None] | None = None,
    ) -> None:
        """`publish_info` republishes what describes the bridge after a change of its default
        voice (bridge/info)."""
        self.pipeline = pipeline
        self.preferences = preferences
        self.publish_info = publish_info

    # the cache

    def cache_stats(self, _: Fields | None = None) -> dict[str, Any]:
        return self.pipeline.synthesizer.cache.stats()

    def cache_clear(self, _: Fields | None = None) -> dict[str, Any]:
        return {"removed": self.pipeline.synthesizer.cache.clear()}

    def prerender(self, args: Fields) -> dict[str, Any]:
        phrases = args.get("phrases", args.get("value"))
        if isinstance(phrases, str):
            phrases = [phrases]
        if (
            not isinstance(phrases, list)
            or not phrases
            or not all(isinstance(p, str) for p in phrases)
        ):
            raise ControlError("invalid_request", "'phrases' must be a non-empty list of strings")
        voice = args.get("voice")
        if voice is not None and not isinstance(voice, str):
            raise ControlError("invalid_request", "'voice' must be a string")
        idle = self.pipeline.idle
        queued = idle.request_prerender(phrases, voice)
        self.pipeline.scheduler.wake_background()
        return {"queued_sentences": queued, "pending": idle.pending()}

    def cache_remove(self, args: Fields) -> dict[str, Any]:
        return phrases.uncache_phrase(self.pipeline, args)

    # the phrases rendered ahead

    def phrases(self, _: Fields | None = None) -> dict[str, Any]:
        return {"phrases": phrases.phrase_status(self.pipeline)}

    def phrases_set(self, args: Fields) -> dict[str, Any]:
        return phrases.add_phrase(self.pipeline, args)

    def phrases_remove(self, args: Fields) -> dict[str, Any]:
        return phrases.remove_phrase(self.pipeline, args)

    # the lexicon

    def lexicon(self, _: Fields | None = None) -> dict[str, Any]:
        return {"entries": self.pipeline.synthesizer.pronunciations.entries()}

    def lexicon_set(self, args: Fields) -> dict[str, Any]:
        word, say, phonemes = args.get("word"), args.get("say"), args.get("phonemes")
        if not isinstance(word, str) or not isinstance(say, str):
            raise ControlError("invalid_request", 'give {"word": ..., "say": ...} as strings')
        if phonemes is not None and not isinstance(phonemes, str):
            raise ControlError("invalid_request", "'phonemes' must be a string")
        try:
            entry, saved = self.pipeline.synthesizer.pronunciations.set(word, say, phonemes)
        except LexiconError as exc:
            raise ControlError("invalid_request", str(exc)) from None
        _LOGGER.info("Lexicon: %r is said %r", entry.word, entry.say)
        found = {"phonemes": entry.phonemes} if entry.phonemes else {}
        return {"word": entry.word, "say": entry.say, **found, "saved": saved}

    def lexicon_remove(self, args: Fields) -> dict[str, Any]:
        word = args.get("word", args.get("value"))
        if not isinstance(word, str):
            raise ControlError("invalid_request", 'give the word (plain text or {"word": ...})')
        try:
            saved = self.pipeline.synthesizer.pronunciations.remove(word)
        except LexiconError as exc:
            raise ControlError("invalid_request", str(exc)) from None
        _LOGGER.info("Lexicon: %r removed", word[:64])
        return {"removed": word, "saved": saved}

    # voices and chimes

    def default_voice(self, args: Fields) -> dict[str, Any]:
        """Use `voice` as the default now and at the next start. Raises UnknownVoiceError."""
        name = args.get("voice", args.get("value"))
        if not isinstance(name, str):
            raise ControlError(
                "invalid_request", 'give the voice name (plain text or {"voice": …})'
            )
        self.pipeline.synthesizer.engines.set_default_voice(name)
        if self.publish_info is not None:
            self.publish_info()
        try:
            self.preferences.save_default_voice(name)
        except PreferencesError as exc:
            # The voice is in use now either way; only the next start will not know it.
            _LOGGER.error("The default voice %s is not saved for the next start: %s", name, exc)
            return {"default_voice": name, "saved": False}
        return {"default_voice": name, "saved": True}

    def chimes(self, _: Fields | None = None) -> dict[str, Any]:
        library = self.pipeline.synthesizer.chimes
        return {"chimes": [{"name": c.name, "source": c.source} for c in library.list()]}
