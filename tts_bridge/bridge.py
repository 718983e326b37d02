"""Wires MQTT to synthesis: parse requests, queue them, publish audio and responses.

No model code lives here: the Synthesizer renders, the Scheduler runs jobs on worker threads,
MqttConnection talks to the broker. Every request gets exactly one response on
<base>/bridge/response/say (and on its MQTT 5 response topic, if it gave one).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass

from tts_bridge import __version__
from tts_bridge.config import Settings
from tts_bridge.engines.base import EngineError
from tts_bridge.engines.registry import UnknownVoiceError
from tts_bridge.mqtt.client import IncomingMessage, MqttConnection, OutgoingMessage
from tts_bridge.mqtt.protocol import (
    ProtocolError,
    SayRequest,
    Topics,
    error_response,
    new_id,
    ok_response,
    parse_say,
)
from tts_bridge.scheduler import Scheduler
from tts_bridge.synthesis import RequestError, Synthesizer
from tts_bridge.textlog import short

_LOGGER = logging.getLogger(__name__)

ONLINE = json.dumps({"state": "online"}).encode()
OFFLINE = json.dumps({"state": "offline"}).encode()


@dataclass(frozen=True)
class ReplyTo:
    """Where a request's answer goes besides the shared response topic."""

    response_topic: str | None
    correlation_data: bytes | None


class Bridge:
    """The running service. `start` connects; `stop` drains work and says goodbye."""

    def __init__(self, settings: Settings, synthesizer: Synthesizer, workers: int = 1) -> None:
        self._settings = settings
        self._synth = synthesizer
        self.topics = Topics(settings.mqtt.base_topic)
        self._scheduler = Scheduler(workers, settings.limits.max_queue)
        self._connection = MqttConnection(
            settings.mqtt,
            subscriptions=[self.topics.say, self.topics.say_targets],
            will=OutgoingMessage(self.topics.state, OFFLINE, qos=1, retain=True),
            on_message=self._on_message,
            on_connected=self._on_connected,
        )
        self._stopped = threading.Event()

    # lifecycle

    def start(self) -> None:
        self._scheduler.start()
        self._connection.start()

    def stop(self, timeout_s: float = 20.0) -> None:
        """Finish queued work (bounded), publish the offline state, disconnect."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        _LOGGER.info("Stopping: finishing %d queued request(s)", self._scheduler.depth)
        if not self._scheduler.stop(timeout_s):
            _LOGGER.warning("Synthesis still running after %.0f s; exiting anyway", timeout_s)
        self._connection.stop(OutgoingMessage(self.topics.state, OFFLINE, qos=1, retain=True))
        self._synth.cache.close()
        _LOGGER.info("Stopped")

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connection.connected.wait(timeout_s)

    def info(self) -> dict[str, object]:
        limits = self._settings.limits
        return {
            "version": __version__,
            "default_voice": self._settings.default_voice,
            "voices": {
                v.name: {
                    "engine": v.engine.name,
                    "tier": v.engine.tier,
                    "languages": sorted(v.engine.languages),
                    "sample_rate": v.engine.sample_rate,
                    "description": v.settings.description,
                }
                for v in self._synth.engines
            },
            "engines": sorted({e.identity for e in self._synth.engines.engines()}),
            "limits": {
                "max_text_chars": limits.max_text_chars,
                "max_payload_bytes": limits.max_payload_bytes,
                "max_queue": limits.max_queue,
            },
            "topics": {
                "say": self.topics.say_targets,
                "audio": self.topics.audio("+"),
                "response": self.topics.response("say"),
            },
        }

    # MQTT network thread: parse, validate, enqueue; nothing slow.

    def _on_connected(self) -> None:
        self._connection.publish(OutgoingMessage(self.topics.state, ONLINE, retain=True))
        self._connection.publish(
            OutgoingMessage(self.topics.info, json.dumps(self.info()).encode(), retain=True)
        )

    def _on_message(self, message: IncomingMessage) -> None:
        received = time.monotonic()
        target = self.topics.target_of(message.topic)
        if target is None:
            _LOGGER.debug("Ignoring message on %s", message.topic)
            return
        reply = ReplyTo(message.response_topic, message.correlation_data)
        try:
            request = parse_say(target, message.payload, self._settings.limits)
        except ProtocolError as exc:
            self._refuse(exc.request_id, exc.code, str(exc), reply, target)
            return
        _LOGGER.info("Request %s for %s: %s", request.id, target, short(request.text))
        try:  # refuse what cannot be spoken now, rather than after the queue
            self._synth.validate(request.text, request.voice, request.lang)
        except RequestError as exc:
            self._refuse(request.id, exc.code, str(exc), reply, target)
            return
        except UnknownVoiceError as exc:
            self._refuse(request.id, "unknown_voice", str(exc.args[0]), reply, target)
            return
        if not self._scheduler.submit(lambda: self._serve(request, reply, received)):
            self._refuse(
                request.id,
                "busy",
                f"the bridge is busy ({self._settings.limits.max_queue} requests queued); "
                "retry later",
                reply,
                target,
            )

    # synthesis threads

    def _serve(self, request: SayRequest, reply: ReplyTo, received: float) -> None:
        try:
            rendering = self._synth.render(
                request.text, request.voice, use_cache=request.use_cache, lang=request.lang
            )
        except (RequestError, ProtocolError) as exc:
            self._refuse(request.id, exc.code, str(exc), reply, request.target)
            return
        except UnknownVoiceError as exc:
            self._refuse(request.id, "unknown_voice", str(exc.args[0]), reply, request.target)
            return
        except EngineError as exc:
            self._refuse(request.id, "synthesis_failed", str(exc), reply, request.target)
            return
        except Exception as exc:
            _LOGGER.exception("Request %s failed", request.id)
            self._refuse(
                request.id,
                "synthesis_failed",
                f"internal error: {type(exc).__name__}",
                reply,
                request.target,
            )
            return
        flags = [
            ("id", str(request.id)),
            ("tier", rendering.tier),
            ("cached", "true" if rendering.cached else "false"),
        ]
        expiry = self._settings.mqtt.audio_expiry_s or None
        self._connection.publish(
            OutgoingMessage(
                self.topics.audio(request.target),
                rendering.wav,
                content_type="audio/wav",
                user_properties=flags,
                expiry_s=expiry,
            )
        )
        if reply.response_topic:
            self._connection.publish(
                OutgoingMessage(
                    reply.response_topic,
                    rendering.wav,
                    content_type="audio/wav",
                    correlation_data=reply.correlation_data,
                    user_properties=flags,
                    expiry_s=expiry,
                )
            )
        latency_ms = round((time.monotonic() - received) * 1000, 1)
        data = {
            "target": request.target,
            "tier": rendering.tier,
            "engine": rendering.engine,
            "voice": rendering.voice,
            "cached": rendering.cached,
            "sentences": rendering.sentences,
            "cached_sentences": rendering.cached_sentences,
            "duration_ms": rendering.duration_ms,
            "latency_ms": latency_ms,
            "bytes": len(rendering.wav),
        }
        self._connection.publish(
            OutgoingMessage(self.topics.response("say"), ok_response(request.id, data))
        )
        _LOGGER.info(
            "Request %s done: %s/%s, %d ms of audio, cached %d/%d, %.0f ms",
            request.id,
            rendering.voice,
            rendering.engine,
            rendering.duration_ms,
            rendering.cached_sentences,
            rendering.sentences,
            latency_ms,
        )

    def _refuse(
        self, request_id: str | int | None, code: str, message: str, reply: ReplyTo, target: str
    ) -> None:
        request_id = request_id if request_id is not None else new_id()
        _LOGGER.warning("Request %s for %s refused (%s): %s", request_id, target, code, message)
        body = error_response(request_id, code, message)
        self._connection.publish(OutgoingMessage(self.topics.response("say"), body))
        if reply.response_topic:
            self._connection.publish(
                OutgoingMessage(
                    reply.response_topic,
                    body,
                    content_type="application/json",
                    correlation_data=reply.correlation_data,
                )
            )
