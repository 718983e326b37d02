"""Everything the service publishes, within the broker's size limits: the one place that does.

A whole WAV on <base>/audio/<target>; one self-contained WAV per sentence on its stream topic
(asked for, or because the whole answer is too big for the broker); JSON answers on
<base>/bridge/response/<name> and on the request's MQTT 5 response topic; refusals. Never a
payload over the broker's limit: paho would reconnect forever on the broker's refusal.

Never a requester's MQTT 5 Response Topic that `response_topic_refusal` refuses either: the
bridge publishes with its own broker rights, so a response topic must not point it at its own
inputs, Home Assistant discovery, Hermes or a topic outside `mqtt.response_topics`.

Publishes of a request's audio can be tracked (`Delivery`): the broker's refusal of one
(PUBACK reason code >= 0x80, e.g. 135 "Not authorized" from an ACL) turns its answer into the
error `not_authorized`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tts_bridge.audio.codec import encode_wav
from tts_bridge.config import Settings
from tts_bridge.mqtt import discovery
from tts_bridge.mqtt.client import IncomingMessage, OutgoingMessage, PublishResult
from tts_bridge.mqtt.protocol import Topics, error_response, response_topic_refusal
from tts_bridge.speech.synthesis import AudioPart
from tts_bridge.wire import new_id

_LOGGER = logging.getLogger(__name__)


class Connection(Protocol):
    """What the service needs of its MQTT connection (`MqttConnection`, or a test's fake)."""

    connected: threading.Event
    subscribed: threading.Event

    def start(
        self,
        subscriptions: Sequence[str],
        on_message: Callable[[IncomingMessage], None],
        on_connected: Callable[[], None],
    ) -> None: ...

    def stop(self, final: OutgoingMessage | None = None, timeout_s: float = 5.0) -> None: ...

    def publish(
        self,
        message: OutgoingMessage,
        on_result: Callable[[PublishResult], None] | None = None,
    ) -> Any: ...

    def ack(self, mid: int, qos: int) -> None: ...

    def max_payload(self, topic: str) -> int | None: ...


@dataclass(frozen=True)
class ReplyTo:
    """Where a request's answer goes besides the shared response topic."""

    response_topic: str | None
    correlation_data: bytes | None

    @classmethod
    def of(cls, message: IncomingMessage) -> ReplyTo:
        return cls(message.response_topic, message.correlation_data)


Flags = Sequence[tuple[str, str]]

DELIVERY_WAIT_S = 5.0
"""How long an answer waits for the broker to acknowledge its audio. Over a live connection
the acknowledgement takes milliseconds; while disconnected paho holds the audio and the answer
goes out after this wait without knowing (it is queued behind the audio either way)."""


class Delivery:
    """The broker's answers to the publishes of one request's audio (see `Outbox.audio`)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._waiting = 0
        self.refused: list[PublishResult] = []

    def track(self) -> Callable[[PublishResult], None]:
        """An `on_result` for one more publish."""
        with self._changed:
            self._waiting += 1

        def done(result: PublishResult) -> None:
            with self._changed:
                self._waiting -= 1
                if not result.ok:
                    self.refused.append(result)
                self._changed.notify_all()

        return done

    def wait(self, timeout_s: float = DELIVERY_WAIT_S) -> list[PublishResult]:
        """Wait (bounded) until the broker answered every tracked publish; the refused ones."""
        with self._changed:
            self._changed.wait_for(lambda: self._waiting <= 0, timeout_s)
            return list(self.refused)


class AudioTooLargeError(Exception):
    """Not even one sentence's WAV fits the broker's limit on the audio topic."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"a sentence's audio exceeds the broker's limit of {limit} bytes; "
            "split the text into shorter sentences"
        )
        self.limit = limit


class Outbox:
    """Publishes answers through the connection."""

    def __init__(self, settings: Settings, connection: Connection) -> None:
        self.topics = Topics(settings.mqtt.base_topic)
        self._settings = settings
        self._connection = connection
        self._expiry = settings.mqtt.audio_expiry_s or None

    def response_topic_refusal(self, topic: str | None) -> str | None:
        """Why the bridge must not publish to this MQTT 5 Response Topic; None if it may (or
        there is none)."""
        if not topic:
            return None
        return response_topic_refusal(
            topic,
            self.topics.base,
            discovery_prefix=self._settings.homeassistant.prefix,
            allowed=self._settings.mqtt.response_topics,
        )

    def _reply_topic(self, reply: ReplyTo | None) -> str | None:
        """The request's response topic when the bridge may publish there."""
        if reply is None or not reply.response_topic:
            return None
        reason = self.response_topic_refusal(reply.response_topic)
        if reason is not None:
            # The front ends refuse such a request first; this is the last guard.
            _LOGGER.warning("Not publishing to response topic %r: %s", reply.response_topic, reason)
            return None
        return reply.response_topic

    @property
    def connected(self) -> bool:
        return self._connection.connected.is_set()

    @property
    def subscribed(self) -> bool:
        """Connected, and the broker has acknowledged the bridge's subscriptions."""
        return self._connection.subscribed.is_set()

    def connection_health(self) -> dict[str, Any]:
        """The broker's refusals of the bridge's publishes (by reason) and session takeovers
        (another client with the bridge's client id), for health."""
        refusals = getattr(self._connection, "refusals", {})
        return {
            "publish_refusals": dict(refusals),
            "session_takeovers": int(getattr(self._connection, "takeovers", 0)),
        }

    def ack(self, message: IncomingMessage) -> None:
        self._connection.ack(message.mid, message.qos)

    def publish(self, message: OutgoingMessage) -> None:
        self._connection.publish(message)

    def retained_json(self, topic: str, body: bytes) -> None:
        self._connection.publish(OutgoingMessage(topic, body, retain=True))

    # JSON answers

    def answer(self, name: str, body: bytes, reply: ReplyTo | None = None) -> None:
        """A JSON answer on <base>/bridge/response/<name> and on the request's response topic."""
        self._connection.publish(OutgoingMessage(self.topics.response(name), body))
        topic = self._reply_topic(reply)
        if topic is not None and reply is not None:
            self._connection.publish(
                OutgoingMessage(
                    topic,
                    body,
                    content_type="application/json",
                    correlation_data=reply.correlation_data,
                )
            )

    def say_answer(self, target: str, body: bytes, reply: ReplyTo | None = None) -> None:
        """A say request's one answer (ok or refused): on <base>/bridge/response/say and its
        response topic, and as Home Assistant's answer event on <base>/bridge/event."""
        self.answer("say", body, reply)
        event = discovery.answer_event(json.loads(body), target)
        self._connection.publish(OutgoingMessage(self.topics.event, event))

    def refuse(
        self,
        request_id: str | int | None,
        code: str,
        message: str,
        reply: ReplyTo,
        target: str,
    ) -> bytes:
        """Answer a say request with an error; returns the answer (for the journal)."""
        request_id = request_id if request_id is not None else new_id()
        _LOGGER.warning("Request %s for %s refused (%s): %s", request_id, target, code, message)
        body = error_response(request_id, code, message)
        self.say_answer(target, body, reply)
        return body

    # audio

    def audio(
        self,
        target: str,
        wav: bytes,
        flags: Flags,
        parts: Callable[[], list[AudioPart]],
        sample_rate: int,
        *,
        delivery: Delivery | None = None,
        content_type: str = "audio/wav",
    ) -> bool:
        """The answer on <base>/audio/<target>: one file (the WAV, or `wav` encoded as
        `content_type`), or (too big for the broker) one WAV per sentence from `parts()` on the
        stream topic; True for the latter. Raises AudioTooLargeError when even a sentence does
        not fit (then nothing was published). `delivery` collects the broker's answers."""
        topic = self.topics.audio(target)
        limit = self._connection.max_payload(topic)
        if limit is None or len(wav) <= limit:
            self._connection.publish(
                OutgoingMessage(
                    topic,
                    wav,
                    content_type=content_type,
                    user_properties=flags,
                    expiry_s=self._expiry,
                ),
                on_result=_tracked(delivery),
            )
            return False
        sentences = parts()
        if any(len(encode_wav(p.pcm, sample_rate)) > limit for p in sentences):
            raise AudioTooLargeError(limit)
        for part in sentences:
            self.stream_part(target, flags, part, sample_rate, delivery)
        return True

    def audio_link(
        self, target: str, body: bytes, flags: Flags, delivery: Delivery | None = None
    ) -> None:
        """A link to the answer's audio on <base>/audio/<target>, for devices that fetch it."""
        self._connection.publish(
            OutgoingMessage(
                self.topics.audio(target),
                body,
                content_type="application/json",
                user_properties=flags,
                expiry_s=self._expiry,
            ),
            on_result=_tracked(delivery),
        )

    def stream_part(
        self,
        target: str,
        flags: Flags,
        part: AudioPart,
        sample_rate: int,
        delivery: Delivery | None = None,
    ) -> None:
        """One self-contained WAV on <base>/audio/<target>/stream, in order: a sentence, or a
        piece of one from an engine that streams within a sentence. `flags` start with the
        request's id and tier."""
        props = [
            *flags[:2],
            ("seq", str(part.seq)),
            ("sentence", str(part.sentence)),
            ("last", "true" if part.last else "false"),
            ("cached", "true" if part.cached else "false"),
        ]
        self._connection.publish(
            OutgoingMessage(
                self.topics.audio_stream(target),
                encode_wav(part.pcm, sample_rate),
                content_type="audio/wav",
                user_properties=props,
                expiry_s=self._expiry,
            ),
            on_result=_tracked(delivery),
        )

    def reply_audio(
        self,
        request_id: str | int,
        wav: bytes,
        flags: Flags,
        reply: ReplyTo,
        delivery: Delivery | None = None,
        *,
        content_type: str = "audio/wav",
    ) -> None:
        """The audio on the request's MQTT 5 response topic, if it fits (else a warning)."""
        topic = self._reply_topic(reply)
        if topic is None:
            return
        limit = self._connection.max_payload(topic)
        if limit is not None and len(wav) > limit:
            _LOGGER.warning("Request %s: audio too big for its response topic", request_id)
            return
        self._connection.publish(
            OutgoingMessage(
                topic,
                wav,
                content_type=content_type,
                correlation_data=reply.correlation_data,
                user_properties=flags,
                expiry_s=self._expiry,
            ),
            on_result=_tracked(delivery),
        )


def _tracked(delivery: Delivery | None) -> Callable[[PublishResult], None] | None:
    return delivery.track() if delivery is not None else None
