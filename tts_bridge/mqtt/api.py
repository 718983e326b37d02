"""The bridge API: <base>/bridge/request/<name> -> <base>/bridge/response/<name>.

Requests are served one at a time on their own thread (cache/clear may take a while), never on
the network thread; they are not journaled (acked at once).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tts_bridge.config import Settings
from tts_bridge.control.actions import Control
from tts_bridge.control.errors import ControlError
from tts_bridge.engines.registry import UnknownVoiceError
from tts_bridge.mqtt.client import IncomingMessage
from tts_bridge.mqtt.frontend import MqttFrontEnd, shared
from tts_bridge.mqtt.outbox import Outbox, ReplyTo
from tts_bridge.mqtt.protocol import ProtocolError, api_response, parse_api_request
from tts_bridge.mqtt.reports import Reports
from tts_bridge.speech.pipeline import Pipeline, SpeechError
from tts_bridge.speech.preferences import Preferences
from tts_bridge.speech.synthesis import RequestError
from tts_bridge.speech.voice_admin import VoiceAdminError

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
        *,
        control: Control | None = None,
        more: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
    ) -> None:
        """`control`: the actions this serves (shared with the other doors), by default its own;
        `more`: requests served beside the bridge's own (the voice administration's)."""
        self._settings = settings
        self._outbox = outbox
        self._pipeline = pipeline
        self._reports = reports
        self._preferences = preferences
        self.topics = outbox.topics
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api")
        self.control = control or Control(pipeline, preferences, reports.publish_info)
        actions = self.control
        self.requests: dict[str, Callable[[dict[str, Any]], Any]] = {
            "health_check": lambda _: {"healthy": True, **reports.health()},
            "voices": lambda _: reports.info()["voices"],
            "cache/stats": actions.cache_stats,
            "cache/clear": actions.cache_clear,
            "cache/remove": actions.cache_remove,
            "phrases": actions.phrases,
            "phrases/set": actions.phrases_set,
            "phrases/remove": actions.phrases_remove,
            "prerender": actions.prerender,
            "default_voice": actions.default_voice,
            "lexicon": actions.lexicon,
            "lexicon/set": actions.lexicon_set,
            "lexicon/remove": actions.lexicon_remove,
            "chimes": actions.chimes,
            **(more or {}),
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
        except (
            ApiError,
            ControlError,
            ProtocolError,
            RequestError,
            SpeechError,
            VoiceAdminError,
        ) as exc:
            _LOGGER.warning("Bridge request %s refused: %s", name[:64], exc)
            body = api_response("error", {}, transaction, str(exc), getattr(exc, "code", None))
        except UnknownVoiceError as exc:
            body = api_response("error", {}, transaction, str(exc.args[0]), "unknown_voice")
        except Exception as exc:
            _LOGGER.exception("Bridge request %s failed", name[:64])
            body = api_response("error", {}, transaction, type(exc).__name__, "internal_error")
        self._outbox.answer(answer_name(name), body, ReplyTo.of(message))
