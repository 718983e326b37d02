"""The MQTT say front end: <base>/say[/<target>] in, audio and one JSON answer out.

Parse, validate, journal, ack, route and queue on the network thread; render and deliver on a
worker. Every say request gets exactly one answer on <base>/bridge/response/say (and on its
MQTT 5 response topic, if it gave one), which is also recorded in the journal.
"""

from __future__ import annotations

import json
import logging
import time

from tts_bridge.config import Settings
from tts_bridge.mqtt.client import IncomingMessage
from tts_bridge.mqtt.protocol import ProtocolError, SayRequest, ok_response, parse_say
from tts_bridge.service.delivery import Delivered, Delivery, DeliveryError, link_message
from tts_bridge.service.frontend import MqttFrontEnd, shared
from tts_bridge.service.journal import (
    AcceptStatus,
    Journal,
    JournalEntry,
    JournalError,
    request_key,
)
from tts_bridge.service.outbox import AudioTooLargeError, Outbox, ReplyTo
from tts_bridge.service.pipeline import Pipeline, SpeechError, SpeechJob
from tts_bridge.speech.synthesis import AudioPart, SentenceAudio
from tts_bridge.textlog import short

_LOGGER = logging.getLogger(__name__)


class SayFrontEnd(MqttFrontEnd):
    def __init__(
        self,
        settings: Settings,
        outbox: Outbox,
        pipeline: Pipeline,
        journal: Journal,
        delivery: Delivery | None = None,
    ) -> None:
        self._settings = settings
        self._outbox = outbox
        self._pipeline = pipeline
        self._journal = journal
        self._delivery = delivery if delivery is not None else Delivery(settings, None)
        self.topics = outbox.topics

    def subscriptions(self) -> list[str]:
        return shared(self._settings, [self.topics.say, self.topics.say_targets])

    def owns(self, topic: str) -> bool:
        return self.topics.target_of(topic) is not None

    def on_message(self, message: IncomingMessage) -> None:
        target = self.topics.target_of(message.topic) or "default"
        self._accept(
            target, message.payload, ReplyTo.of(message), time.monotonic(), message=message
        )

    def resume(self, entry: JournalEntry) -> None:
        """Serve a request accepted (and acked) but not answered before the last stop."""
        target = self.topics.target_of(entry.topic) or "default"
        reply = ReplyTo(entry.response_topic, entry.correlation_data)
        self._accept(target, entry.payload, reply, time.monotonic(), entry.entry_id)

    # network thread: nothing slow

    def _accept(
        self,
        target: str,
        payload: bytes,
        reply: ReplyTo,
        received: float,
        entry_id: int | None = None,
        *,
        message: IncomingMessage | None = None,
    ) -> None:
        """Parse, validate, journal, ack, route and queue one say request.

        `message` is the live MQTT message (to journal and ack); `entry_id` a resumed entry.
        """
        try:
            request = parse_say(target, payload, self._settings.limits)
            _LOGGER.info("Request %s for %s: %s", request.id, target, short(request.text))
            plan = self._pipeline.check(request.text, request.voice, request.lang, request.options)
        except ProtocolError as exc:
            self._refuse(exc.request_id, exc.code, str(exc), reply, target, entry_id)
            if message is not None:
                self._outbox.ack(message)
            return
        except SpeechError as exc:
            self._refuse(request.id, exc.code, str(exc), reply, target, entry_id)
            if message is not None:
                self._outbox.ack(message)
            return
        if message is not None:
            entry_id = self._journal_accept(message, request, reply)
            if entry_id is None:
                return  # a duplicate (answered again) or the journal failed (not acked)
        job = self._pipeline.route(
            request.id,
            plan,
            tier=request.tier,
            use_cache=request.use_cache,
            budget_ms=request.latency_budget_ms,
            target=target,
            received=received,
        )
        if not self._pipeline.submit(
            job,
            lambda job: self._serve(job, request, reply, entry_id),
            force=message is None,
        ):
            self._refuse(request.id, "busy", self._pipeline.busy_message(), reply, target, entry_id)

    def _journal_accept(
        self, message: IncomingMessage, request: SayRequest, reply: ReplyTo
    ) -> int | None:
        """Journal the request durably, then ack it; None when it must not be served now."""
        key = request_key(
            message.topic,
            message.payload,
            request_id=request.id if request.id_given else None,
            packet_id=message.mid,
        )
        try:
            result = self._journal.accept(
                key,
                message.topic,
                message.payload,
                response_topic=reply.response_topic,
                correlation_data=reply.correlation_data,
                received_at=time.time(),
                dedupe=request.id_given or message.duplicate,
            )
        except JournalError as exc:
            # Not acked: the broker delivers it again after a reconnect.
            _LOGGER.error("Cannot journal request %s (not acknowledged): %s", request.id, exc)
            return None
        self._outbox.ack(message)
        if result.status is AcceptStatus.NEW:
            return result.entry_id
        if result.status is AcceptStatus.DONE and result.outcome is not None:
            _LOGGER.info("Request %s is a duplicate; answering from the journal", request.id)
            # The answer again, for whoever missed it; not a second event (nothing new happened).
            self._outbox.answer("say", json.dumps(result.outcome).encode(), reply)
        else:
            _LOGGER.info("Request %s is already being served; duplicate ignored", request.id)
        return None

    # worker thread

    def _serve(
        self, job: SpeechJob, request: SayRequest, reply: ReplyTo, entry_id: int | None
    ) -> None:
        flags = [("id", str(request.id)), ("tier", job.route.tier)]
        pieces: list[SentenceAudio] = []

        def on_part(part: AudioPart) -> None:  # out as soon as it is made
            self._outbox.stream_part(request.target, flags, part, job.sample_rate)

        try:
            rendering = self._pipeline.render(
                job, on_sentence=pieces.append, on_part=on_part if request.stream else None
            )
        except SpeechError as exc:
            self._refuse(request.id, exc.code, str(exc), reply, request.target, entry_id)
            return
        flags.append(("cached", "true" if rendering.cached else "false"))
        how = self._delivery.for_target(request.target, request.format)
        delivered: Delivered | None = None
        audio, content_type = rendering.wav, "audio/wav"
        chunked = False
        try:
            if how.topic_needs_delivery:  # the topic waits for the encoding or the URL
                delivered = self._delivery.deliver(how, rendering)
                if delivered.data is not None and delivered.format is not None:
                    audio, content_type = delivered.data, delivered.format.content_type
                    flags.append(("format", delivered.format.container))
            if how.payload == "url":  # streamed or not: the device fetches the whole answer
                assert delivered is not None and delivered.published is not None
                link = link_message(request.id, delivered.published)
                link_flags = [*flags, ("format", delivered.published.format.container)]
                self._outbox.audio_link(request.target, link, link_flags)
            elif not request.stream:
                chunked = self._outbox.audio(
                    request.target,
                    audio,
                    flags,
                    lambda: self._pipeline.sentence_parts(pieces, rendering.sample_rate),
                    rendering.sample_rate,
                    content_type=content_type,
                )
            if delivered is None:  # WAV on the topic first; the answer's URL after it
                delivered = self._delivery.deliver(how, rendering)
        except DeliveryError as exc:
            self._refuse(request.id, exc.code, str(exc), reply, request.target, entry_id)
            return
        except AudioTooLargeError as exc:
            self._refuse(request.id, "audio_too_large", str(exc), reply, request.target, entry_id)
            return
        self._outbox.reply_audio(request.id, audio, flags, reply, content_type=content_type)
        latency_ms = round((time.monotonic() - job.received) * 1000, 1)
        data = {
            "target": request.target,
            "tier": rendering.tier,
            "engine": rendering.engine,
            "voice": rendering.voice,
            "requested_voice": job.plan.voice.name,
            "cached": rendering.cached,
            "stream": request.stream or chunked,
            "sentences": rendering.sentences,
            "cached_sentences": rendering.cached_sentences,
            "duration_ms": rendering.duration_ms,
            "latency_ms": latency_ms,
            # What the target got: the audio, or behind its link the audio at the URL.
            "bytes": len(audio) if how.payload == "audio" else delivered.size,
            **delivered.answer_fields(),
        }
        if rendering.sentence_voices:  # a Chinese sentence went to a voice that speaks it
            data["sentence_voices"] = list(rendering.sentence_voices)
        body = ok_response(request.id, data)
        # Counted first: a client that reads health after its answer finds it counted.
        self._pipeline.count_answer(job.route.tier, latency_ms)
        self._outbox.say_answer(request.target, body)
        self._finish(entry_id, body)
        _LOGGER.info(
            "Request %s done: %s tier, %s/%s, %d ms of audio, cached %d/%d, %.0f ms",
            request.id,
            job.route.tier,
            rendering.voice,
            rendering.engine,
            rendering.duration_ms,
            rendering.cached_sentences,
            rendering.sentences,
            latency_ms,
        )

    def _refuse(  # noqa: PLR0917  (the outbox's refusal and the journal entry it closes)
        self,
        request_id: str | int | None,
        code: str,
        message: str,
        reply: ReplyTo,
        target: str,
        entry_id: int | None,
    ) -> None:
        self._pipeline.count_error()
        body = self._outbox.refuse(request_id, code, message, reply, target)
        self._finish(entry_id, body)

    def _finish(self, entry_id: int | None, body: bytes) -> None:
        if entry_id is None:
            return
        try:
            self._journal.finish(entry_id, json.loads(body))
        except JournalError as exc:
            _LOGGER.error("Cannot record the answer in the journal: %s", exc)
