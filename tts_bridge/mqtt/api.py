"""The bridge API: <base>/bridge/request/<name> -> <base>/bridge/response/<name>.

Requests are served one at a time on their own thread (cache/clear may take a while), never on
the network thread; they are not journaled (acked at once).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tts_bridge.config import Settings
from tts_bridge.engines.registry import UnknownVoiceError
from tts_bridge.mqtt.client import IncomingMessage
from tts_bridge.mqtt.frontend import MqttFrontEnd, shared
from tts_bridge.mqtt.outbox import Outbox, ReplyTo
from tts_bridge.mqtt.protocol import ProtocolError, api_response, parse_api_request
from tts_bridge.mqtt.reports import Reports
from tts_bridge.speech.pipeline import Pipeline, SpeechError
from tts_bridge.speech.preferences import Preferences, PreferencesError
from tts_bridge.speech.synthesis import RequestError
from tts_bridge.speech.voice_admin import VoiceAdminError
from tts_bridge.text.lexicon import LexiconError

_LOGGER = logging.getLogger(__name__)

_ECHOED_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}(/[A-Za-z0-9_-]{1,32}){0,3}$")
"""A request name short and plain enough to be answered on its own response topic: up to four
levels, no empty or '$' level, at most 131 characters (the name comes from the client)."""


_OTHER_ANSWERS = frozenset({"say"})
"""Response topics that carry other answers (say answers go to response/say)."""


def answer_name(name: str) -> str:
    """The response topic's name for a request: its own name (known or not, as a client
    waiting on response/<name> expects), or 'error' for a name that is not safe to echo or
    whose topic carries other answers."""
    if name in _OTHER_ANSWERS or not _ECHOED_NAME_RE.match(name):
        return "error"
    return name


class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class BridgeApi(MqttFrontEnd):
    def __init__(
        self,
        settings: Settings,
        outbox: Outbox,
        pipeline: Pipeline,
        reports: Reports,
        preferences: Preferences,
    ) -> None:
        self._settings = settings
        self._outbox = outbox
        self._pipeline = pipeline
        self._reports = reports
        self._preferences = preferences
        self.topics = outbox.topics
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api")
        synth = pipeline.synthesizer
        self.requests: dict[str, Callable[[dict[str, Any]], Any]] = {
            "health_check": lambda _: {"healthy": True, **reports.health()},
            "voices": lambda _: reports.info()["voices"],
            "cache/stats": lambda _: synth.cache.stats(),
            "cache/clear": lambda _: {"removed": synth.cache.clear()},
            "prerender": self._prerender,
            "default_voice": self._default_voice,
            "lexicon": lambda _: {"entries": synth.pronunciations.entries()},
            "lexicon/set": self._lexicon_set,
            "lexicon/remove": self._lexicon_remove,
            "chimes": lambda _: {
                "chimes": [{"name": c.name, "source": c.source} for c in synth.chimes.list()]
            },
        }

    def subscriptions(self) -> list[str]:
        return shared(self._settings, [self.topics.requests])

    def owns(self, topic: str) -> bool:
        return self.topics.request_name(topic) is not None

    def on_message(self, message: IncomingMessage) -> None:
        self._outbox.ack(message)
        name = self.topics.request_name(message.topic) or ""
        self._pool.submit(self.serve, name, message)

    def stop(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def serve(self, name: str, message: IncomingMessage) -> None:
        """Answer one request (on the API thread)."""
        transaction: Any = None
        try:
            args = parse_api_request(message.payload, self._settings.limits)
            transaction = args.pop("transaction", None)
            if not isinstance(transaction, str | int | type(None)) or isinstance(transaction, bool):
                transaction = None
                raise ApiError("invalid_request", "'transaction' must be a string or an integer")
            refusal = self._outbox.response_topic_refusal(message.response_topic)
            if refusal is not None:  # not executed: answered on the shared topic only
                raise ApiError(
                    "invalid_response_topic",
                    f"response topic {(message.response_topic or '')[:64]!r} refused: {refusal}",
                )
            handler = self.requests.get(name)
            if handler is None:
                known = ", ".join(sorted(self.requests))
                raise ApiError(
                    "unknown_request", f"unknown bridge request {name[:64]!r}; known: {known}"
                )
            body = api_response("ok", handler(args), transaction)
        except (ApiError, ProtocolError, RequestError, SpeechError, VoiceAdminError) as exc:
            _LOGGER.warning("Bridge request %s refused: %s", name[:64], exc)
            body = api_response("error", {}, transaction, str(exc), getattr(exc, "code", None))
        except UnknownVoiceError as exc:
            body = api_response("error", {}, transaction, str(exc.args[0]), "unknown_voice")
        except Exception as exc:
            _LOGGER.exception("Bridge request %s failed", name[:64])
            body = api_response("error", {}, transaction, type(exc).__name__, "internal_error")
        self._outbox.answer(answer_name(name), body, ReplyTo.of(message))

    def _prerender(self, args: dict[str, Any]) -> dict[str, Any]:
        phrases = args.get("phrases", args.get("value"))
        if isinstance(phrases, str):
            phrases = [phrases]
        if (
            not isinstance(phrases, list)
            or not phrases
            or not all(isinstance(p, str) for p in phrases)
        ):
            raise ApiError("invalid_request", "'phrases' must be a non-empty list of strings")
        voice = args.get("voice")
        if voice is not None and not isinstance(voice, str):
            raise ApiError("invalid_request", "'voice' must be a string")
        idle = self._pipeline.idle
        queued = idle.request_prerender(phrases, voice)
        self._pipeline.scheduler.wake_background()
        return {"queued_sentences": queued, "pending": idle.pending()}

    def _lexicon_set(self, args: dict[str, Any]) -> dict[str, Any]:
        word, say, phonemes = args.get("word"), args.get("say"), args.get("phonemes")
        if not isinstance(word, str) or not isinstance(say, str):
            raise ApiError("invalid_request", 'give {"word": ..., "say": ...} as strings')
        if phonemes is not None and not isinstance(phonemes, str):
            raise ApiError("invalid_request", "'phonemes' must be a string")
        try:
            entry, saved = self._pipeline.synthesizer.pronunciations.set(word, say, phonemes)
        except LexiconError as exc:
            raise ApiError("invalid_request", str(exc)) from None
        _LOGGER.info("Lexicon: %r is said %r", entry.word, entry.say)
        found = {"phonemes": entry.phonemes} if entry.phonemes else {}
        return {"word": entry.word, "say": entry.say, **found, "saved": saved}

    def _lexicon_remove(self, args: dict[str, Any]) -> dict[str, Any]:
        word = args.get("word", args.get("value"))
        if not isinstance(word, str):
            raise ApiError("invalid_request", 'give the word (plain text or {"word": ...})')
        try:
            saved = self._pipeline.synthesizer.pronunciations.remove(word)
        except LexiconError as exc:
            raise ApiError("invalid_request", str(exc)) from None
        _LOGGER.info("Lexicon: %r removed", word[:64])
        return {"removed": word, "saved": saved}

    def _default_voice(self, args: dict[str, Any]) -> dict[str, Any]:
        name = args.get("voice", args.get("value"))
        if not isinstance(name, str):
            raise ApiError("invalid_request", 'give the voice name (plain text or {"voice": …})')
        self._pipeline.synthesizer.engines.set_default_voice(name)
        self._reports.publish_info()
        try:
            self._preferences.save_default_voice(name)
        except PreferencesError as exc:
            # The voice is in use now either way; only the next start will not know it.
            _LOGGER.error("The default voice %s is not saved for the next start: %s", name, exc)
            return {"default_voice": name, "saved": False}
        return {"default_voice": name, "saved": True}
