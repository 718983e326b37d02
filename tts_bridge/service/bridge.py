"""Wires MQTT to synthesis: parse requests, route them to a tier, queue them, publish results.

No model code lives here: the Synthesizer renders, the TierRouter picks quality or fast, the
Scheduler runs jobs on worker threads (and idle work on its own thread), MqttConnection talks to
the broker. Every say request gets exactly one response on <base>/bridge/response/say (and on
its MQTT 5 response topic, if it gave one).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psutil

from tts_bridge import __version__
from tts_bridge.audio import encode_wav
from tts_bridge.config import Settings
from tts_bridge.engines.base import EngineError
from tts_bridge.engines.registry import UnknownVoiceError
from tts_bridge.mqtt import discovery, hermes
from tts_bridge.mqtt.client import IncomingMessage, MqttConnection, OutgoingMessage
from tts_bridge.mqtt.protocol import (
    ProtocolError,
    SayRequest,
    Topics,
    api_response,
    error_response,
    new_id,
    ok_response,
    parse_api_request,
    parse_say,
)
from tts_bridge.service.journal import AcceptStatus, Journal, JournalError, request_key
from tts_bridge.speech.idle import IdleWork
from tts_bridge.speech.routing import Route, TierRouter
from tts_bridge.speech.scheduler import Scheduler
from tts_bridge.speech.synthesis import (
    AudioPart,
    Plan,
    Rendering,
    RequestError,
    SentenceAudio,
    Synthesizer,
)
from tts_bridge.textlog import short

_LOGGER = logging.getLogger(__name__)

ONLINE = json.dumps({"state": "online"}).encode()
OFFLINE = json.dumps({"state": "offline"}).encode()


@dataclass(frozen=True)
class ReplyTo:
    """Where a request's answer goes besides the shared response topic."""

    response_topic: str | None
    correlation_data: bytes | None


def open_journal(settings: Settings) -> Journal:
    """Open the request journal; a damaged one is moved aside (its entries are lost, logged)."""
    path = settings.journal.path
    try:
        return Journal(path, keep_done_s=settings.journal.keep_done_s)
    except JournalError as exc:
        if "in use" in str(exc):
            raise
        aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
        _LOGGER.error("%s; moving it to %s and starting a new journal", exc, aside)
        path.rename(aside)
        return Journal(path, keep_done_s=settings.journal.keep_done_s)


@dataclass(frozen=True)
class Accepted:
    """A request that passed validation and the journal, with its chosen route."""

    request: SayRequest
    plan: Plan
    route: Route
    reply: ReplyTo
    received: float
    entry_id: int | None


class ApiError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Bridge:
    """The running service. `start` connects; `stop` drains work and says goodbye."""

    def __init__(
        self, settings: Settings, synthesizer: Synthesizer, workers: int = 1, idle_nice: int = 10
    ) -> None:
        self._settings = settings
        self._synth = synthesizer
        # bridge/info is retained: a voice that fell back to torch must not stay listed as ONNX.
        synthesizer.engines.on_change = self._publish_info
        self.topics = Topics(settings.mqtt.base_topic)
        sched = settings.scheduler
        self.idle = IdleWork(settings, synthesizer)
        self._router = TierRouter(sched.latency_budget_ms, sched.hysteresis)
        self._scheduler = Scheduler(
            workers,
            settings.limits.max_queue,
            background=self.idle if sched.idle_enabled else None,
            idle_delay_s=sched.idle_delay_s,
            idle_max_load=sched.idle_max_load,
            idle_nice=idle_nice,
        )
        self.journal = open_journal(settings)
        subscriptions = [self.topics.say, self.topics.say_targets, self.topics.requests]
        if settings.mqtt.share_group:
            subscriptions = [f"$share/{settings.mqtt.share_group}/{t}" for t in subscriptions]
        ha = settings.homeassistant
        self._birth_topic = discovery.birth_topic(ha.prefix)
        if ha.discovery:
            subscriptions.append(self._birth_topic)
        if settings.hermes.enabled:
            subscriptions += [hermes.SAY, hermes.PLAY_FINISHED_ALL]
        self._hermes_tracker = hermes.FinishTracker(
            self._hermes_finished, margin_s=settings.hermes.finish_margin_s
        )
        self._connection = MqttConnection(
            settings.mqtt,
            subscriptions=subscriptions,
            will=OutgoingMessage(self.topics.state, OFFLINE, qos=1, retain=True),
            on_message=self._on_message,
            on_connected=self._on_connected,
        )
        self._api_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api")
        self._api: dict[str, Callable[[dict[str, Any]], Any]] = {
            "health_check": lambda _: {"healthy": True, **self.health()},
            "voices": lambda _: self.info()["voices"],
            "cache/stats": lambda _: self._synth.cache.stats(),
            "cache/clear": lambda _: {"removed": self._synth.cache.clear()},
            "prerender": self._api_prerender,
            "default_voice": self._api_default_voice,
        }
        self._stopped = threading.Event()
        self._started = time.monotonic()
        self._counts_lock = threading.Lock()
        self._answers = {"quality": 0, "fast": 0, "error": 0}
        self._last_latency_ms: float | None = None
        self._last_tier: str | None = None
        self._health_thread = threading.Thread(
            target=self._maintenance_loop, name="maintenance", daemon=True
        )

    # lifecycle

    def start(self) -> None:
        self._scheduler.start()
        self._resume()
        self._connection.start()
        self._health_thread.start()

    def _resume(self) -> None:
        """Serve what was accepted (and acked) but not answered before the last stop."""
        self.journal.prune()
        entries = self.journal.unfinished()
        if entries:
            _LOGGER.info("Resuming %d unfinished request(s) from the journal", len(entries))
        for entry in entries:
            target = self.topics.target_of(entry.topic) or "default"
            reply = ReplyTo(entry.response_topic, entry.correlation_data)
            self._accept_say(target, entry.payload, reply, time.monotonic(), entry.entry_id)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Finish queued live work (bounded), publish the offline state, disconnect."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        _LOGGER.info("Stopping: finishing %d queued request(s)", self._scheduler.depth)
        if not self._scheduler.stop(timeout_s):
            _LOGGER.warning("Synthesis still running after %.0f s; exiting anyway", timeout_s)
        self._api_pool.shutdown(wait=True, cancel_futures=True)
        self._hermes_tracker.close()
        self._connection.stop(OutgoingMessage(self.topics.state, OFFLINE, qos=1, retain=True))
        self._synth.cache.close()
        self.journal.close()
        _LOGGER.info("Stopped")

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connection.connected.wait(timeout_s)

    # reports

    def info(self) -> dict[str, Any]:
        limits = self._settings.limits
        return {
            "version": __version__,
            "default_voice": self._synth.engines.default_voice,
            "voices": {
                v.name: {
                    "engine": v.engine.name,
                    "backend": v.backend,
                    "tier": v.tier,
                    "fast_voice": v.settings.fast_voice,
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
            "latency_budget_ms": self._settings.scheduler.latency_budget_ms,
            "topics": {
                "say": self.topics.say_targets,
                "audio": self.topics.audio("+"),
                "response": self.topics.response("say"),
            },
        }

    def health(self) -> dict[str, Any]:
        cache = self._synth.cache.stats()
        with self._counts_lock:
            answers = dict(self._answers)
            last_latency, last_tier = self._last_latency_ms, self._last_tier
        return {
            "uptime_s": round(time.monotonic() - self._started),
            "queue_depth": self._scheduler.depth,
            "active": self._scheduler.active,
            "background_pending": self.idle.pending(),
            "background_running": self._scheduler.background_running,
            "background_done": dict(self.idle.done),
            "background_interrupted": self.idle.interrupted,
            "estimated_backlog_s": round(self._scheduler.backlog_s(), 3),
            "answers": answers,
            "cache_hit_rate": cache["hit_rate"],
            "cache_entries": cache["entries"],
            "cache_bytes": cache["bytes"],
            "tier_in_use": "fast" if self._router.fast_mode else "quality",
            "last_tier": last_tier,
            "last_latency_ms": last_latency,
            "rtf": self._synth.stats.rtf(),
            "seconds_per_char": {
                k: round(v, 5) for k, v in self._synth.estimator.snapshot().items()
            },
            "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
            "loaded_models": self._synth.engines.loaded(),
            "model_memory_mb": {k: round(v) for k, v in self._synth.engines.resident_mb().items()},
            "memory_budget_mb": self._synth.engines.memory_budget_mb,
        }

    def _maintenance_loop(self) -> None:
        """Periodic chores: health reports, unloading idle models, pruning the journal."""
        health_every = self._settings.scheduler.health_interval_s
        idle_unload = self._settings.models.idle_unload_s
        next_health = next_prune = time.monotonic() + health_every
        while not self._stopped.wait(1.0):
            now = time.monotonic()
            try:
                if now >= next_health:
                    next_health = now + health_every
                    if self._connection.connected.is_set():
                        self._publish_health()
                if idle_unload and not self._scheduler.active:
                    self._synth.engines.unload_idle(idle_unload)
                if now >= next_prune:
                    next_prune = now + 3600
                    self.journal.prune()
            except Exception:
                _LOGGER.exception("Maintenance failed")

    def _publish_health(self) -> None:
        body = json.dumps(self.health()).encode()
        self._connection.publish(OutgoingMessage(self.topics.health, body, retain=True))

    # MQTT network thread: parse, validate, route, enqueue; nothing slow.

    def _on_connected(self) -> None:
        self._connection.publish(OutgoingMessage(self.topics.state, ONLINE, retain=True))
        self._publish_info()
        self._publish_discovery()
        self._publish_health()

    def _publish_discovery(self) -> None:
        """Home Assistant device discovery (retained), or its removal when turned off."""
        ha = self._settings.homeassistant
        topic = discovery.discovery_topic(ha.prefix, ha.node_id)
        if not ha.discovery:
            self._connection.publish(
                OutgoingMessage(topic, discovery.removal_payload(), retain=True)
            )
            return
        config = discovery.device_config(
            base_topic=self.topics.base,
            node_id=ha.node_id,
            version=__version__,
            targets=ha.targets,
            voices=[v.name for v in self._synth.engines],
            default_voice=self._synth.engines.default_voice,
        )
        payload = discovery.config_payload(config)
        self._connection.publish(OutgoingMessage(topic, payload, retain=True))

    def _publish_info(self) -> None:
        body = json.dumps(self.info()).encode()
        self._connection.publish(OutgoingMessage(self.topics.info, body, retain=True))

    def _on_message(self, message: IncomingMessage) -> None:
        name = self.topics.request_name(message.topic)
        if name is not None:
            self._connection.ack(message.mid, message.qos)  # API requests are not journaled
            self._api_pool.submit(self._serve_api, name, message)
            return
        target = self.topics.target_of(message.topic)
        if target is None:
            # Hermes and Home Assistant messages are not journaled: acked at once.
            self._connection.ack(message.mid, message.qos)
            if message.topic == self._birth_topic:
                if discovery.is_birth(message.payload):
                    _LOGGER.info("Home Assistant is online: publishing discovery again")
                    self._publish_discovery()
            elif message.topic == hermes.SAY:
                self._accept_hermes(message)
            elif (site := hermes.site_of_play_finished(message.topic)) is not None:
                self._hermes_tracker.on_play_finished(site, message.payload)
            else:
                _LOGGER.debug("Ignoring message on %s", message.topic)
            return
        reply = ReplyTo(message.response_topic, message.correlation_data)
        self._accept_say(target, message.payload, reply, time.monotonic(), message=message)

    def _accept_say(
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
        ack = (lambda: self._connection.ack(message.mid, message.qos)) if message else None
        try:
            request = parse_say(target, payload, self._settings.limits)
            _LOGGER.info("Request %s for %s: %s", request.id, target, short(request.text))
            plan = self._synth.validate(request.text, request.voice, request.lang, request.options)
        except (ProtocolError, RequestError) as exc:
            rid = exc.request_id if isinstance(exc, ProtocolError) else request.id
            self._refuse(rid, exc.code, str(exc), reply, target, entry_id=entry_id)
            if ack:
                ack()
            return
        except UnknownVoiceError as exc:
            self._refuse(
                request.id, "unknown_voice", str(exc.args[0]), reply, target, entry_id=entry_id
            )
            if ack:
                ack()
            return
        if message is not None:
            entry_id = self._journal_accept(message, request, reply)
            if entry_id is None:
                return  # a duplicate (answered again) or the journal failed (not acked)
        route, estimate = self._route(request, plan)
        _LOGGER.debug(
            "Request %s: %s tier (%s, quality estimate %.2f s)",
            request.id,
            route.tier,
            route.reason,
            route.estimate_s,
        )
        if not self._scheduler.submit_live(
            lambda: self._serve(Accepted(request, plan, route, reply, received, entry_id)),
            estimate,
            force=message is None,
            urgent=route.tier == "fast" and route.voice is not plan.voice,
        ):
            self._refuse(
                request.id,
                "busy",
                f"the bridge is busy ({self._settings.limits.max_queue} requests queued); "
                "retry later",
                reply,
                target,
                entry_id=entry_id,
            )

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
            result = self.journal.accept(
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
        self._connection.ack(message.mid, message.qos)
        if result.status is AcceptStatus.NEW:
            return result.entry_id
        if result.status is AcceptStatus.DONE and result.outcome is not None:
            _LOGGER.info("Request %s is a duplicate; answering from the journal", request.id)
            self._answer_json(json.dumps(result.outcome).encode(), reply)
        else:
            _LOGGER.info("Request %s is already being served; duplicate ignored", request.id)
        return None

    def _route(self, request: SayRequest, plan: Plan) -> tuple[Route, float]:
        """The route, and the chosen voice's estimated cost for this request (the job's
        estimate in the scheduler's backlog)."""
        fast_name = plan.voice.settings.fast_voice
        fast = self._synth.engines.voice(fast_name) if fast_name else None
        cost = self._synth.uncached_cost_s(
            plan.voice, plan.sentences, plan.options, use_cache=request.use_cache
        )
        route = self._router.choose(
            plan.voice,
            fast,
            language=plan.language,
            uncached_cost_s=cost,
            backlog_s=self._scheduler.backlog_s(),
            forced=request.tier,
            budget_ms=request.latency_budget_ms,
        )
        if route.voice is not plan.voice:
            # The fast voice's cost, with the options and cache use it will render with.
            options = self._synth.options_for_plan(route.voice, plan)
            cost = self._synth.uncached_cost_s(
                route.voice, plan.sentences, options, use_cache=request.use_cache
            )
        return route, cost

    # synthesis threads

    def _serve(self, job: Accepted) -> None:
        request, plan, route, reply = job.request, job.plan, job.route, job.reply
        received, entry_id = job.received, job.entry_id
        flags = [("id", str(request.id)), ("tier", route.tier)]
        sample_rate = route.voice.engine.sample_rate
        pieces: list[SentenceAudio] = []

        def on_part(part: AudioPart) -> None:  # out as soon as it is made
            self._publish_part(request, flags, part, sample_rate)

        try:
            rendering = self._synth.render_plan(
                plan,
                route.voice,
                tier=route.tier,
                use_cache=request.use_cache,
                on_sentence=pieces.append,
                on_part=on_part if request.stream else None,
            )
        except RequestError as exc:
            self._refuse(request.id, exc.code, str(exc), reply, request.target, entry_id=entry_id)
            return
        except EngineError as exc:
            self._refuse(
                request.id, "synthesis_failed", str(exc), reply, request.target, entry_id=entry_id
            )
            return
        except Exception as exc:
            _LOGGER.exception("Request %s failed", request.id)
            message = f"internal error: {type(exc).__name__}"
            self._refuse(
                request.id, "synthesis_failed", message, reply, request.target, entry_id=entry_id
            )
            return
        if route.voice is not plan.voice and request.use_cache:
            self.idle.note_fast_answer(plan.voice.name, plan.sentences)
        self.idle.note_request(plan.voice.name, plan.sentences)
        flags.append(("cached", "true" if rendering.cached else "false"))
        chunked = self._deliver(job, rendering, pieces, flags)
        if chunked is None:
            return
        latency_ms = round((time.monotonic() - received) * 1000, 1)
        data = {
            "target": request.target,
            "tier": rendering.tier,
            "engine": rendering.engine,
            "voice": rendering.voice,
            "requested_voice": plan.voice.name,
            "cached": rendering.cached,
            "stream": request.stream or chunked,
            "sentences": rendering.sentences,
            "cached_sentences": rendering.cached_sentences,
            "duration_ms": rendering.duration_ms,
            "latency_ms": latency_ms,
            "bytes": len(rendering.wav),
        }
        body = ok_response(request.id, data)
        self._connection.publish(OutgoingMessage(self.topics.response("say"), body))
        self._finish(entry_id, body)
        with self._counts_lock:
            self._answers[route.tier] += 1
            self._last_latency_ms = latency_ms
            self._last_tier = route.tier
        _LOGGER.info(
            "Request %s done: %s tier, %s/%s, %d ms of audio, cached %d/%d, %.0f ms",
            request.id,
            route.tier,
            rendering.voice,
            rendering.engine,
            rendering.duration_ms,
            rendering.cached_sentences,
            rendering.sentences,
            latency_ms,
        )

    def _deliver(
        self,
        job: Accepted,
        rendering: Rendering,
        pieces: list[SentenceAudio],
        flags: list[tuple[str, str]],
    ) -> bool | None:
        """Publish the audio; True if it went out per sentence, None if it was refused."""
        sample_rate = rendering.sample_rate
        expiry = self._settings.mqtt.audio_expiry_s or None
        chunked = False
        if not job.request.stream:
            topic = self.topics.audio(job.request.target)
            limit = self._connection.max_payload(topic)
            if limit is not None and len(rendering.wav) > limit:
                # Too big for the broker: one WAV per sentence on the stream topic, or an error.
                # Never publish it whole: paho would reconnect forever on the broker's refusal.
                parts = self._synth.sentence_parts(pieces, sample_rate)
                if any(len(encode_wav(p.pcm, sample_rate)) > limit for p in parts):
                    self._refuse(
                        job.request.id,
                        "audio_too_large",
                        f"a sentence's audio exceeds the broker's limit of {limit} bytes; "
                        "split the text into shorter sentences",
                        job.reply,
                        job.request.target,
                        entry_id=job.entry_id,
                    )
                    return None
                chunked = True
                for part in parts:
                    self._publish_part(job.request, flags, part, sample_rate)
            else:
                self._connection.publish(
                    OutgoingMessage(
                        topic,
                        rendering.wav,
                        content_type="audio/wav",
                        user_properties=flags,
                        expiry_s=expiry,
                    )
                )
        if job.reply.response_topic:
            limit = self._connection.max_payload(job.reply.response_topic)
            if limit is None or len(rendering.wav) <= limit:
                self._connection.publish(
                    OutgoingMessage(
                        job.reply.response_topic,
                        rendering.wav,
                        content_type="audio/wav",
                        correlation_data=job.reply.correlation_data,
                        user_properties=flags,
                        expiry_s=expiry,
                    )
                )
            else:
                _LOGGER.warning("Request %s: audio too big for its response topic", job.request.id)
        return chunked

    def _publish_part(
        self,
        request: SayRequest,
        flags: list[tuple[str, str]],
        part: AudioPart,
        sample_rate: int,
    ) -> None:
        """One self-contained WAV on <base>/audio/<target>/stream, in order: a sentence, or a
        piece of one from an engine that streams within a sentence."""
        props = [
            *flags[:2],
            ("seq", str(part.seq)),
            ("sentence", str(part.sentence)),
            ("last", "true" if part.last else "false"),
            ("cached", "true" if part.cached else "false"),
        ]
        self._connection.publish(
            OutgoingMessage(
                self.topics.audio_stream(request.target),
                encode_wav(part.pcm, sample_rate),
                content_type="audio/wav",
                user_properties=props,
                expiry_s=self._settings.mqtt.audio_expiry_s or None,
            )
        )

    def _answer_json(self, body: bytes, reply: ReplyTo) -> None:
        """A JSON answer on <base>/bridge/response/say and on the request's response topic."""
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

    def _finish(self, entry_id: int | None, body: bytes) -> None:
        if entry_id is None:
            return
        try:
            self.journal.finish(entry_id, json.loads(body))
        except JournalError as exc:
            _LOGGER.error("Cannot record the answer in the journal: %s", exc)

    def _refuse(
        self,
        request_id: str | int | None,
        code: str,
        message: str,
        reply: ReplyTo,
        target: str,
        *,
        entry_id: int | None = None,
    ) -> None:
        request_id = request_id if request_id is not None else new_id()
        _LOGGER.warning("Request %s for %s refused (%s): %s", request_id, target, code, message)
        with self._counts_lock:
            self._answers["error"] += 1
        body = error_response(request_id, code, message)
        self._answer_json(body, reply)
        self._finish(entry_id, body)

    # Rhasspy Hermes

    def _accept_hermes(self, message: IncomingMessage) -> None:
        try:
            say = hermes.parse_hermes_say(
                message.payload, max_payload_bytes=self._settings.limits.max_payload_bytes
            )
            plan = self._synth.validate(say.text, self._settings.hermes.voice, say.language)
        except hermes.HermesError as exc:
            self._hermes_error(exc, str(exc))
            return
        except RequestError as exc:
            self._hermes_error(say, str(exc))
            return
        except UnknownVoiceError as exc:
            self._hermes_error(say, str(exc.args[0]))
            return
        _LOGGER.info("Hermes request %s for site %s: %s", say.id, say.site_id, short(say.text))
        request = SayRequest(say.id, say.text, say.site_id, None, say.language, True)
        route, estimate = self._route(request, plan)
        if not self._scheduler.submit_live(lambda: self._serve_hermes(say, plan, route), estimate):
            self._hermes_error(say, "the bridge is busy; retry later")

    def _serve_hermes(self, say: hermes.HermesSay, plan: Plan, route: Route) -> None:
        try:
            rendering = self._synth.render_plan(
                plan, route.voice, tier=route.tier, volume=say.volume
            )
        except Exception as exc:
            _LOGGER.warning("Hermes request %s failed: %s", say.id, exc)
            self._hermes_error(say, f"synthesis failed: {exc}")
            return
        self._connection.publish(
            OutgoingMessage(hermes.play_bytes_topic(say.site_id, say.id), rendering.wav)
        )
        self._hermes_tracker.track(say, rendering.duration_ms / 1000)
        with self._counts_lock:
            self._answers[route.tier] += 1
        _LOGGER.info("Hermes request %s played on %s (%s tier)", say.id, say.site_id, route.tier)

    def _hermes_finished(self, say: hermes.HermesSay, reason: str) -> None:
        _LOGGER.debug("Hermes request %s finished (%s)", say.id, reason)
        payload = hermes.say_finished_payload(say)
        self._connection.publish(OutgoingMessage(hermes.SAY_FINISHED, payload))

    def _hermes_error(self, source: hermes.HermesSay | hermes.HermesError, message: str) -> None:
        _LOGGER.warning("Hermes request refused: %s", message)
        with self._counts_lock:
            self._answers["error"] += 1
        payload = hermes.error_payload(source, message)
        self._connection.publish(OutgoingMessage(hermes.ERROR, payload))

    # bridge API (its own thread: cache/clear may take a while)

    def _serve_api(self, name: str, message: IncomingMessage) -> None:
        transaction: Any = None
        topic = self.topics.response(name if name in self._api else "error")
        try:
            args = parse_api_request(message.payload, self._settings.limits)
            transaction = args.pop("transaction", None)
            if not isinstance(transaction, str | int | type(None)) or isinstance(transaction, bool):
                transaction = None
                raise ApiError("invalid_request", "'transaction' must be a string or an integer")
            handler = self._api.get(name)
            if handler is None:
                raise ApiError(
                    "unknown_request",
                    f"unknown bridge request {name[:64]!r}; known: {', '.join(sorted(self._api))}",
                )
            body = api_response("ok", handler(args), transaction)
        except (ApiError, ProtocolError, RequestError) as exc:
            _LOGGER.warning("Bridge request %s refused: %s", name[:64], exc)
            body = api_response("error", {}, transaction, str(exc), getattr(exc, "code", None))
        except UnknownVoiceError as exc:
            body = api_response("error", {}, transaction, str(exc.args[0]), "unknown_voice")
        except Exception as exc:
            _LOGGER.exception("Bridge request %s failed", name[:64])
            body = api_response("error", {}, transaction, type(exc).__name__, "internal_error")
        self._connection.publish(OutgoingMessage(topic, body))
        if message.response_topic:
            self._connection.publish(
                OutgoingMessage(
                    message.response_topic,
                    body,
                    content_type="application/json",
                    correlation_data=message.correlation_data,
                )
            )

    def _api_prerender(self, args: dict[str, Any]) -> dict[str, Any]:
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
        queued = self.idle.request_prerender(phrases, voice)
        self._scheduler.wake_background()
        return {"queued_sentences": queued, "pending": self.idle.pending()}

    def _api_default_voice(self, args: dict[str, Any]) -> dict[str, Any]:
        name = args.get("voice", args.get("value"))
        if not isinstance(name, str):
            raise ApiError("invalid_request", 'give the voice name (plain text or {"voice": …})')
        self._synth.engines.set_default_voice(name)
        self._publish_info()
        return {"default_voice": name}
