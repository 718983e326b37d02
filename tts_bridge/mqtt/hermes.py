"""The Rhasspy Hermes front end: hermes/tts/say in; playBytes, sayFinished and errors out.

Hermes messages are not journaled (a satellite asks again); they are acked at once.
"""

from __future__ import annotations

import logging
import time

from tts_bridge.config import Settings
from tts_bridge.mqtt import hermes_protocol
from tts_bridge.mqtt.client import IncomingMessage, OutgoingMessage
from tts_bridge.mqtt.frontend import MqttFrontEnd
from tts_bridge.mqtt.outbox import Outbox
from tts_bridge.speech.pipeline import Pipeline, SpeechError, SpeechJob
from tts_bridge.textlog import short, size

_LOGGER = logging.getLogger(__name__)


class HermesFrontEnd(MqttFrontEnd):
    def __init__(self, settings: Settings, outbox: Outbox, pipeline: Pipeline) -> None:
        self._settings = settings
        self._outbox = outbox
        self._pipeline = pipeline
        self._enabled = settings.hermes.enabled
        self._tracker = hermes_protocol.FinishTracker(
            self._finished, margin_s=settings.hermes.finish_margin_s
        )

    def subscriptions(self) -> list[str]:
        return [hermes_protocol.SAY, hermes_protocol.PLAY_FINISHED_ALL] if self._enabled else []

    def owns(self, topic: str) -> bool:
        return self._enabled and (
            topic == hermes_protocol.SAY or hermes_protocol.site_of_play_finished(topic) is not None
        )

    def on_message(self, message: IncomingMessage) -> None:
        self._outbox.ack(message)
        if message.topic == hermes_protocol.SAY:
            self._accept(message)
        elif (site := hermes_protocol.site_of_play_finished(message.topic)) is not None:
            self._tracker.on_play_finished(site, message.payload)

    def stop(self) -> None:
        self._tracker.close()

    def _accept(self, message: IncomingMessage) -> None:
        try:
            say = hermes_protocol.parse_hermes_say(
                message.payload,
                max_payload_bytes=self._settings.limits.max_payload_bytes,
                max_json_depth=self._settings.limits.max_json_depth,
            )
        except hermes_protocol.HermesError as exc:
            self._error(exc, str(exc))
            return
        try:
            speech = hermes_protocol.speech_request(
                say, self._settings.hermes.voice, time.monotonic()
            )
            job = self._pipeline.prepare(speech)
        except SpeechError as exc:
            self._error(say, str(exc))
            return
        _LOGGER.info(
            "Hermes request %s for site %s: %s, %s, %d sentence(s)",
            say.id,
            say.site_id,
            job.route.voice.name,
            size(say.text),
            len(job.plan.sentences),
        )
        _LOGGER.debug("Hermes request %s text: %s", say.id, short(say.text))
        admission = self._pipeline.submit(job, lambda job: self._serve(job, say))
        if not admission:
            self._error(say, admission.message)

    def _serve(self, job: SpeechJob, say: hermes_protocol.HermesSay) -> None:
        try:
            rendering = self._pipeline.render(job)
        except SpeechError as exc:
            _LOGGER.warning("Hermes request %s failed: %s", say.id, exc)
            self._error(say, f"synthesis failed: {exc}")
            return
        self._pipeline.count_answer(job.route.tier, door="hermes", voice=rendering.voice)
        self._outbox.publish(
            OutgoingMessage(hermes_protocol.play_bytes_topic(say.site_id, say.id), rendering.wav)
        )
        self._tracker.track(say, rendering.duration_ms / 1000)
        _LOGGER.info(
            "Hermes request %s played on %s (%s tier)", say.id, say.site_id, job.route.tier
        )

    def _finished(self, say: hermes_protocol.HermesSay, reason: str) -> None:
        _LOGGER.debug("Hermes request %s finished (%s)", say.id, reason)
        self._outbox.publish(
            OutgoingMessage(hermes_protocol.SAY_FINISHED, hermes_protocol.say_finished_payload(say))
        )

    def _error(
        self, source: hermes_protocol.HermesSay | hermes_protocol.HermesError, message: str
    ) -> None:
        _LOGGER.warning("Hermes request refused: %s", message)
        self._pipeline.count_error(door="hermes")
        self._outbox.publish(
            OutgoingMessage(hermes_protocol.ERROR, hermes_protocol.error_payload(source, message))
        )
