"""The MQTT say front end: <base>/say[/<target>] in, audio and one JSON answer out.

Parse, validate, journal, ack, route and queue on the network thread; render and deliver on a
worker. Every say request gets exactly one answer on <base>/bridge/response/say (and on its
MQTT 5 response topic, if it gave one and the bridge may publish there), which is also
recorded in the journal.

When the journal cannot be written (disk full) a request is served without it and acked only
once its answer is out, so the broker still has it if the bridge dies first. When the broker
refuses the request's audio (an ACL), the answer is the error `not_authorized`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tts_bridge.config import Settings
from tts_bridge.mqtt.client import IncomingMessage
from tts_bridge.mqtt.frontend import MqttFrontEnd, shared
from tts_bridge.mqtt.journal import (
    AcceptStatus,
    Journal,
    JournalEntry,
    JournalError,
    request_key,
)
from tts_bridge.mqtt.outbox import AudioTooLargeError, Delivery, Outbox, ReplyTo
from tts_bridge.mqtt.protocol import (
    ProtocolError,
    SayRequest,
    check_audio_seconds,
    error_response,
    ok_response,
    parse_say,
    speech_request,
)
from tts_bridge.mqtt.resumption import ResumeOrder
from tts_bridge.players.announce import play_order
from tts_bridge.players.service import Outcomes, Players
from tts_bridge.speech.delivery import AudioDelivery, Delivered, DeliveryError, link_message
from tts_bridge.speech.engine_start import on_engine_start
from tts_bridge.speech.loudness import apply_gain
from tts_bridge.speech.pipeline import Pipeline, SpeechError, SpeechJob
from tts_bridge.speech.synthesis import AudioPart, Rendering, SentenceAudio
from tts_bridge.textlog import short, size
from tts_bridge.wire import encode_json

_LOGGER = logging.getLogger(__name__)
POISON_CODE = "poison_request"
PLAYERS_DRAIN_S = 15.0
"""How long a stop waits for answers whose media players have not all answered."""


@dataclass(frozen=True)
class _Closing:
    """What closes a request once its answer is out: its journal entry (None or 0: none),
    and the message to ack then (one the journal could not take, acked only after the answer
    so that the broker keeps it until then)."""

    entry_id: int | None = None
    ack: IncomingMessage | None = None


@dataclass(frozen=True)
class _Answer:
    """An ok answer ready to go out, but for what the media players say."""

    request: SayRequest
    closing: _Closing
    data: dict[str, object]
    rendering: Rendering
    latency_ms: float


class SayFrontEnd(MqttFrontEnd):
    def __init__(
        self,
        settings: Settings,
        outbox: Outbox,
        pipeline: Pipeline,
        journal: Journal | None,
        audio_delivery: AudioDelivery | None = None,
        *,
        players: Players | None = None,
    ) -> None:
        self._settings = settings
        self._outbox = outbox
        self._pipeline = pipeline
        self._journal = journal
        self._delivery = (
            audio_delivery if audio_delivery is not None else AudioDelivery(settings, None)
        )
        self._players = players
        self.topics = outbox.topics
        self.refused_deliveries = 0
        """Answers turned into not_authorized because the broker refused their audio."""
        self._order = ResumeOrder()

    def use_journal(self, journal: Journal | None) -> None:
        """The journal to record requests in (None: serve without one, acking after answers)."""
        self._journal = journal

    def stop(self) -> None:
        """Before the connection closes: the answers still waiting for their media players."""
        if self._players is not None and not self._players.drain(PLAYERS_DRAIN_S):
            _LOGGER.warning("Some answers were still waiting for their media players")

    def subscriptions(self) -> list[str]:
        return shared(self._settings, [self.topics.say, self.topics.say_targets])

    def owns(self, topic: str) -> bool:
        return self.topics.target_of(topic) is not None

    def on_message(self, message: IncomingMessage) -> None:
        # `owns` took only say topics; an empty target ("<base>/say/") is refused by parse_say.
        target = self.topics.target_of(message.topic)
        assert target is not None
        self._accept(
            target, message.payload, ReplyTo.of(message), time.monotonic(), message=message
        )

    def resume(self, entry: JournalEntry) -> None:
        """Serve a request accepted (and acked) but not answered before the last stop."""
        target = self.topics.target_of(entry.topic) or "default"
        reply = ReplyTo(entry.response_topic, entry.correlation_data)
        self._accept(target, entry.payload, reply, time.monotonic(), entry.entry_id)

    def resume_all(self, waiting: list[JournalEntry], suspects: list[JournalEntry]) -> None:
        """Serve the entries that were waiting at the last stop, then the suspects (in
        synthesis then) one at a time (see resumption.py)."""
        self._order.start(waiting, suspects, self.resume)

    def retire(self, entry: JournalEntry, attempts: int) -> None:
        """Answer a journal entry whose synthesis started `attempts` times without finishing
        (it likely made the bridge crash each time) with an error, and finish it. Logged here,
        once, as an error naming the request."""
        target = self.topics.target_of(entry.topic) or "default"
        reply = ReplyTo(entry.response_topic, entry.correlation_data)
        text = ""
        try:
            parsed = parse_say(target, entry.payload, self._settings.limits)
            request_id: str | int | None = parsed.id if parsed.id_given else None
            text = parsed.text
        except ProtocolError as exc:
            request_id = exc.request_id
        _log_poisoned(request_id, target, entry.entry_id, text, attempts)
        message = (
            f"the bridge stopped while synthesizing this request, {attempts} times; it is not "
            "served again (the bridge's log says what stopped it)"
        )
        self._pipeline.count_error(POISON_CODE)
        body = error_response(request_id, POISON_CODE, message)
        self._outbox.say_answer(target, body, reply)
        self._finish(_Closing(entry.entry_id), body)

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
        closing = _Closing(entry_id)
        try:
            request = parse_say(target, payload, self._settings.limits)
            _LOGGER.debug("Request %s text: %s", request.id, short(request.text))
            speech = speech_request(request, received, self._settings.targets.get(target))
            plan = self._pipeline.check(speech)
            _LOGGER.info(
                "Request %s for %s: %s, %s, %d sentence(s)",
                request.id,
                target,
                plan.voice.name,
                size(request.text),
                len(plan.sentences),
            )
            # Again with the speed the voice renders at (its own default may be slow).
            check_audio_seconds(
                " ".join(plan.sentences), plan.options.speed, self._settings.limits, request.id
            )
            refusal = self._outbox.response_topic_refusal(reply.response_topic)
            if refusal is not None:
                # Answered on the shared response topic only: the bridge's own broker rights
                # must not be lent to whoever names a topic.
                raise ProtocolError(
                    "invalid_response_topic",
                    f"response topic {short(reply.response_topic or '')} refused: {refusal}",
                    request.id,
                )
        except ProtocolError as exc:
            self._refuse(exc.request_id, exc.code, str(exc), _no_reply(reply, exc), target, closing)
            if message is not None:
                self._outbox.ack(message)
            return
        except SpeechError as exc:
            self._refuse(request.id, exc.code, str(exc), reply, target, closing)
            if message is not None:
                self._outbox.ack(message)
            return
        if message is not None:
            accepted = self._journal_accept(message, request, reply)
            if accepted is None:
                return  # a duplicate (answered again)
            closing = accepted
        job = self._pipeline.route(speech, plan)
        admission = self._pipeline.submit(
            job,
            lambda job: self._serve_closed(job, request, reply, closing),
            force=message is None,
        )
        if not admission:
            self._refuse(request.id, "busy", admission.message, reply, target, closing)

    def _journal_accept(
        self, message: IncomingMessage, request: SayRequest, reply: ReplyTo
    ) -> _Closing | None:
        """Journal the request durably, then ack it; None when it must not be served (a
        duplicate). Without a journal (or one that cannot be written now) the request is
        served and acked after its answer."""
        if self._journal is None:
            return _Closing(None, ack=message)
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
        except JournalError as exc:  # closed: the service is stopping
            _LOGGER.warning("Request %s served without the journal: %s", request.id, exc)
            return _Closing(None, ack=message)
        if not result.ack_now:
            return _Closing(None, ack=message)
        self._outbox.ack(message)
        if result.status is AcceptStatus.NEW:
            return _Closing(result.entry_id)
        if result.status is AcceptStatus.DONE and result.outcome is not None:
            _LOGGER.info("Request %s is a duplicate; answering from the journal", request.id)
            # The answer again, for whoever missed it; not a second event (nothing new happened).
            # It says it is a repeat: an "ok" that spoke nothing now must not pass for a new one.
            again = {**result.outcome, "duplicate": True}
            self._outbox.answer("say", encode_json(again), reply)
        else:
            _LOGGER.info("Request %s is already being served; duplicate ignored", request.id)
        return None

    # worker thread

    def _serve_closed(
        self, job: SpeechJob, request: SayRequest, reply: ReplyTo, closing: _Closing
    ) -> None:
        # The attempt is counted, durably, before an engine starts on it (not for cache hits).
        started = None
        if self._journal is not None and closing.entry_id:
            started = functools.partial(self._journal.started, closing.entry_id)
        try:
            with on_engine_start(started):
                self._serve(job, request, reply, closing)
        finally:  # answered, or failed past every answer: the resume order must go on
            if closing.entry_id:
                self._order.closed(closing.entry_id)

    def _serve(
        self, job: SpeechJob, request: SayRequest, reply: ReplyTo, closing: _Closing
    ) -> None:
        flags = [("id", str(request.id)), ("tier", job.route.tier)]
        pieces: list[SentenceAudio] = []
        delivery = Delivery()

        target = self._settings.targets.get(request.target)
        gain_db = target.gain_db if target is not None else 0.0

        on_part = self._part_sender(job, request.target, flags, delivery, gain_db)
        try:
            rendering = self._pipeline.render(
                job,
                on_sentence=lambda piece: pieces.append(
                    dataclasses.replace(piece, pcm=apply_gain(piece.pcm, gain_db))
                ),
                on_part=on_part if request.stream else None,
            )
        except SpeechError as exc:
            self._refuse(request.id, exc.code, str(exc), reply, request.target, closing)
            return
        rendering = self._delivery.with_lead(request.target, rendering)
        flags[1] = ("tier", rendering.tier)  # the other tier's, if it answered instead
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
                self._outbox.audio_link(request.target, link, link_flags, delivery)
            elif not request.stream:
                chunked = self._outbox.audio(
                    request.target,
                    audio,
                    flags,
                    lambda: self._pipeline.sentence_parts(pieces, rendering),
                    rendering.sample_rate,
                    delivery=delivery,
                    content_type=content_type,
                )
                self._pipeline.first_byte_sent(job)
            if delivered is None:  # WAV on the topic first; the answer's URL after it
                delivered = self._delivery.deliver(how, rendering)
        except DeliveryError as exc:
            self._refuse(request.id, exc.code, str(exc), reply, request.target, closing)
            return
        except AudioTooLargeError as exc:
            self._refuse(request.id, "audio_too_large", str(exc), reply, request.target, closing)
            return
        self._outbox.reply_audio(
            request.id, audio, flags, reply, delivery, content_type=content_type
        )
        if self._refused_by_broker(request, delivery, reply, closing):
            return
        latency_ms = round((time.monotonic() - job.received) * 1000, 1)
        data = {
            "target": request.target,
            "tier": rendering.tier,
            "engine": rendering.engine,
            "voice": rendering.voice,
            "requested_voice": job.plan.voice.name,
            "cached": rendering.cached,
            "priority": job.priority,
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
        answer = _Answer(request, closing, data, rendering, latency_ms)
        if not self._play_first(answer, job.priority, delivered):
            self._answer(answer)

    def _play_first(self, answer: _Answer, priority: str, delivered: Delivered) -> bool:
        """Hand the answer to the target's media players, if it has any (True): it goes out
        with each player's outcome once they all have one; this worker does not wait."""
        request = answer.request
        if self._players is None or not self._players.plays(request.target):
            return False
        order = play_order(
            request.id, request.target, delivered, answer.rendering.duration_ms, priority
        )

        def done(outcomes: Outcomes) -> None:
            data = {**answer.data, "players": outcomes}
            self._answer(dataclasses.replace(answer, data=data))

        self._players.play(order, done)
        return True

    def _answer(self, answer: _Answer) -> None:
        """Publish the ok answer, record it, log it (after the media players, if any)."""
        request, rendering, latency_ms = answer.request, answer.rendering, answer.latency_ms
        body = ok_response(request.id, answer.data)
        # Counted first: a client that reads health after its answer finds it counted.
        self._pipeline.count_answer(rendering.tier, latency_ms, voice=rendering.voice)
        self._outbox.say_answer(request.target, body)
        self._finish(answer.closing, body)
        _LOGGER.info(
            "Request %s done: %s tier, %s/%s, %d ms of audio, cached %d/%d, %.0f ms",
            request.id,
            rendering.tier,
            rendering.voice,
            rendering.engine,
            rendering.duration_ms,
            rendering.cached_sentences,
            rendering.sentences,
            latency_ms,
        )

    def _part_sender(
        self,
        job: SpeechJob,
        target: str,
        flags: list[tuple[str, str]],
        delivery: Delivery,
        gain_db: float,
    ) -> Callable[[AudioPart], None]:
        def on_part(part: AudioPart) -> None:  # out as soon as it is made
            if gain_db:
                part = dataclasses.replace(part, pcm=apply_gain(part.pcm, gain_db))
            self._outbox.stream_part(target, flags, part, job.sample_rate, delivery)
            self._pipeline.first_byte_sent(job)  # the first part's counts

        return on_part

    def _refused_by_broker(
        self, request: SayRequest, delivery: Delivery, reply: ReplyTo, closing: _Closing
    ) -> bool:
        """Wait for the broker's answers to the audio; a refusal turns the answer into
        not_authorized (True: answered)."""
        refused = delivery.wait()
        if not refused:
            return False
        self.refused_deliveries += 1
        first = refused[0]
        _LOGGER.error(
            "Request %s: the broker refused its audio on %s (%s, reason code %d)",
            request.id,
            first.topic,
            first.reason,
            first.reason_code,
        )
        message = (
            f"the broker refused the audio on {first.topic}: {first.reason} (reason code "
            f"{first.reason_code}); the broker's ACL must let the bridge publish there"
        )
        self._refuse(request.id, "not_authorized", message, reply, request.target, closing)
        return True

    def _refuse(  # noqa: PLR0917  (the outbox's refusal and the request it closes)
        self,
        request_id: str | int | None,
        code: str,
        message: str,
        reply: ReplyTo,
        target: str,
        closing: _Closing,
    ) -> None:
        self._pipeline.count_error(code)
        body = self._outbox.refuse(request_id, code, message, reply, target)
        self._finish(closing, body)

    def _finish(self, closing: _Closing, body: bytes) -> None:
        """After the answer is out: record it in the journal, ack a message it could not take."""
        journal = self._journal
        if closing.entry_id and journal is not None:
            try:
                journal.finish(closing.entry_id, json.loads(body))
            except JournalError as exc:
                _LOGGER.error("Cannot record the answer in the journal: %s", exc)
        if closing.entry_id:
            self._order.closed(closing.entry_id)
        if closing.ack is not None:
            self._outbox.ack(closing.ack)


def _log_poisoned(
    request_id: str | int | None, target: str, entry_id: int, text: str, attempts: int
) -> None:
    """The one error line that names a request refused as poison (its text only at DEBUG)."""
    _LOGGER.error(
        "Request %s for %s (journal entry %d, %s) was in synthesis at %d stops of the "
        "bridge in a row; answering it %s instead of serving it again",
        request_id,
        target,
        entry_id,
        size(text),
        attempts,
        POISON_CODE,
    )
    _LOGGER.debug("Request %s (journal entry %d) text: %s", request_id, entry_id, short(text))


def _no_reply(reply: ReplyTo, exc: ProtocolError) -> ReplyTo:
    """Where a refusal goes: not to a response topic that was itself refused."""
    return ReplyTo(None, None) if exc.code == "invalid_response_topic" else reply
