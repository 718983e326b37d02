"""The one path from text to audio that every front end uses (MQTT say, Hermes, Wyoming, HTTP).

Going through it is what makes a front end share the sentence cache, tier routing to the fast
voice, the scheduler's queue and lanes, idle upgrades and the health counters. `prepare` is
cheap and runs on any thread (a network thread included); `render` runs only on the
scheduler's worker threads, which `submit` hands the job to.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tts_bridge.config import Settings
from tts_bridge.engines.base import EngineError, Stages, timing_stages
from tts_bridge.engines.registry import UnknownVoiceError, Voice
from tts_bridge.speech.activity import ActivityLog
from tts_bridge.speech.idle import IdleWork
from tts_bridge.speech.metrics import Metrics
from tts_bridge.speech.request import SpeechRequest
from tts_bridge.speech.routing import Route, TierRouter
from tts_bridge.speech.scheduler import Admission, Priority, Scheduler
from tts_bridge.speech.synthesis import (
    AudioPart,
    Plan,
    Rendering,
    RequestError,
    SentenceAudio,
    Synthesizer,
)

_LOGGER = logging.getLogger(__name__)


class SpeechError(Exception):
    """A request the pipeline cannot serve; each front end turns it into its own error reply.

    `code` is the machine-readable reason (the codes of the MQTT answers: "empty_text",
    "text_too_long", "unknown_voice", "unsupported_language", "invalid_options", "busy",
    "synthesis_failed", ...); `str(exc)` is the message for people.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SpeechJob:
    """A validated and routed request."""

    request: SpeechRequest
    plan: Plan
    route: Route
    estimate_s: float
    """The chosen voice's estimated cost: the job's share of the scheduler's backlog."""
    stages: Stages = field(default_factory=Stages, compare=False, repr=False)
    """Where the request's time went (see metrics.REQUEST_STAGES), filled as it is served."""

    @property
    def id(self) -> str | int:
        return self.request.id

    @property
    def target(self) -> str:
        """Where the answer goes: the MQTT say target, the Hermes site, or the door's name."""
        return self.request.target

    @property
    def use_cache(self) -> bool:
        return self.request.use_cache

    @property
    def received(self) -> float:
        """time.monotonic() when the request arrived."""
        return self.request.received

    @property
    def priority(self) -> Priority:
        return self.request.priority

    @property
    def door(self) -> str:
        """The front end it came through (mqtt, hermes, wyoming, http): its share of the queue."""
        return self.request.door

    @property
    def peer(self) -> str | None:
        """The client's address where the door knows it (Wyoming, HTTP): its share of the queue."""
        return self.request.peer

    @property
    def cached(self) -> bool:
        """Every sentence is in the cache for the voice that answers: milliseconds of work."""
        return self.use_cache and self.estimate_s == 0.0

    @property
    def sample_rate(self) -> int:
        return self.route.voice.engine.sample_rate

    @property
    def rerouted(self) -> bool:
        """True when a voice other than the requested one answers (its fast tier)."""
        return self.route.voice is not self.plan.voice


@dataclass(frozen=True)
class VoiceInfo:
    """A configured voice as front ends describe it to their clients."""

    name: str
    languages: tuple[str, ...]
    engine: str
    tier: str
    description: str | None
    sample_rate: int
    backend: str | None
    fast_voice: str | None


@dataclass(frozen=True)
class VoiceCatalog:
    voices: tuple[VoiceInfo, ...]
    default_voice: str
    presets: tuple[VoiceInfo, ...] = ()
    """Voices with chimes (presets), described as their voice with their own name."""


class Counters:
    """Answers per tier and errors, and the last answer's tier and latency (health reports)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers = {"quality": 0, "fast": 0, "error": 0}
        self._last_latency_ms: float | None = None
        self._last_tier: str | None = None

    def answer(self, tier: str, latency_ms: float | None = None) -> None:
        with self._lock:
            self._answers[tier] = self._answers.get(tier, 0) + 1
            if latency_ms is not None:
                self._last_latency_ms = latency_ms
                self._last_tier = tier

    def error(self) -> None:
        with self._lock:
            self._answers["error"] += 1

    def snapshot(self) -> tuple[dict[str, int], float | None, str | None]:
        """(answers per tier and "error", last latency in ms, last tier)."""
        with self._lock:
            return dict(self._answers), self._last_latency_ms, self._last_tier


class Pipeline:
    """Validate, route, queue and render speech for any front end."""

    def __init__(
        self,
        settings: Settings,
        synthesizer: Synthesizer,
        scheduler: Scheduler,
        router: TierRouter,
        idle: IdleWork,
        *,
        metrics: Metrics | None = None,
        activity: ActivityLog | None = None,
    ) -> None:
        self.settings = settings
        self.synthesizer = synthesizer
        self.scheduler = scheduler
        self.router = router
        self.idle = idle
        self.counters = Counters()
        """Its own answers and errors, for health."""
        self.metrics = metrics
        """Requests by door, status and tier, when the service has metrics."""
        self.activity = activity
        """The last requests of every door, without their text (the web UI's Activity)."""

    def start(self) -> None:
        self.scheduler.start()

    def stop(self, timeout_s: float) -> bool:
        """Finish queued live work (bounded); False when synthesis was still running."""
        return self.scheduler.stop(timeout_s)

    # any thread

    def prepare(self, request: SpeechRequest) -> SpeechJob:
        """Validate and route a request; raises SpeechError (an unknown voice included).

        Its priority, door and peer decide its place in the queue (see scheduler.py)."""
        return self.route(request, self.check(request))

    def check(self, request: SpeechRequest) -> Plan:
        """Validation alone (the first half of `prepare`), for a front end that must record a
        request durably between validating and routing it."""
        try:
            return self.synthesizer.plan(request)
        except RequestError as exc:
            raise SpeechError(exc.code, str(exc)) from exc
        except UnknownVoiceError as exc:
            raise SpeechError("unknown_voice", str(exc.args[0])) from exc

    def route(self, request: SpeechRequest, plan: Plan) -> SpeechJob:
        """Pick the tier for a validated plan (the second half of `prepare`)."""
        synth = self.synthesizer
        use_cache = request.use_cache
        fast = synth.engines.fast_voice_for(plan.voice, plan.language)
        cost = synth.uncached_cost_s(plan.voice, plan.sentences, plan.options, use_cache=use_cache)
        route = self.router.choose(
            plan.voice,
            fast,
            request,
            language=plan.language,
            uncached_cost_s=cost,
            backlog_s=self.scheduler.backlog_s(),
        )
        if route.voice is not plan.voice:
            # The fast voice's cost, with the options and cache use it will render with.
            options = synth.options_for_plan(route.voice, plan)
            cost = synth.uncached_cost_s(route.voice, plan.sentences, options, use_cache=use_cache)
        _LOGGER.debug(
            "Request %s: %s tier (%s, quality estimate %.2f s)",
            request.id,
            route.tier,
            route.reason,
            route.estimate_s,
        )
        return SpeechJob(request=request, plan=plan, route=route, estimate_s=cost)

    def submit(
        self,
        job: SpeechJob,
        serve: Callable[[SpeechJob], None],
        *,
        force: bool = False,
        urgent: bool | None = None,
    ) -> Admission:
        """Queue `serve(job)` on a worker, or the refusal ("busy": `.message` names the limit).

        `urgent` defaults to whether the job was sent to the fast voice: those run in the fast
        lane, so a quick answer never waits for a quality job already rendering; so do cache
        hits. `force` (a resumed request, already acknowledged) skips the queue's limits."""
        if urgent is None:
            urgent = job.route.tier == "fast" and job.rerouted
        submitted = time.monotonic()
        admission = self.scheduler.submit_live(
            lambda: self._serve_timed(job, serve, submitted), job, force=force, urgent=urgent
        )
        if not admission:  # each door logs its refusal; this says which limit
            _LOGGER.debug(
                "Request %s (%s, %s priority) refused busy: %s",
                job.id,
                job.door,
                job.priority,
                admission.limit,
            )
        return admission

    # worker threads

    def _serve_timed(
        self, job: SpeechJob, serve: Callable[[SpeechJob], None], submitted: float
    ) -> None:
        """`serve(job)`, its wait in the queue noted in the request's stages."""
        job.stages.seconds["queue"] = time.monotonic() - submitted
        serve(job)

    def first_byte_sent(self, job: SpeechJob) -> None:
        """The door wrote the job's first byte of audio (any thread; later calls are no-ops)."""
        if self.metrics is not None and "first_byte" not in job.stages.seconds:
            self.metrics.first_byte(job.door, job.stages.seconds, time.monotonic() - job.received)

    def render(
        self,
        job: SpeechJob,
        *,
        on_part: Callable[[AudioPart], None] | None = None,
        on_sentence: Callable[[SentenceAudio], None] | None = None,
    ) -> Rendering:
        """Render from the cache or the engine (at the request's volume), and note the request
        for idle work.

        `on_part` gets each sentence (or streamed piece of one) as soon as it is ready;
        `on_sentence` each complete sentence of the rendering that answers, once it is done.
        When the voice fails (synthesis_failed) before any part went out, the request's other
        tier answers it, if it has one. Raises SpeechError ("synthesis_failed" for engine
        failures)."""
        plan = job.plan
        emitted = False

        def part(piece: AudioPart) -> None:
            nonlocal emitted
            if not emitted:  # into the request's own stages, not a sentence's timed now
                job.stages.seconds.setdefault("first_audio", time.monotonic() - job.received)
            emitted = True
            assert on_part is not None
            on_part(piece)

        pieces: list[SentenceAudio] = []
        # The request's stages, collected on this thread and counted once its audio is done
        # (before the door has its last part: a client that reads the metrics then finds them).
        with timing_stages(into=job.stages):
            try:
                rendering = self._render_or_other(
                    job, part if on_part else None, pieces, lambda: emitted
                )
            finally:
                if self.metrics is not None:
                    self.metrics.request_stages(job.door, job.stages.seconds)
        if on_sentence is not None:
            for piece in pieces:
                on_sentence(piece)
        if job.rerouted and job.use_cache:
            self.idle.note_fast_answer(plan.voice.name, plan.sentences)
        self.idle.note_request(plan.voice.name, plan.sentences)
        return rendering

    def _render_or_other(
        self,
        job: SpeechJob,
        on_part: Callable[[AudioPart], None] | None,
        pieces: list[SentenceAudio],
        emitted: Callable[[], bool],
    ) -> Rendering:
        """The route's voice renders the job, or its other tier when it fails before any part
        went out (`emitted`)."""
        route = job.route
        try:
            return self._render(job, route.voice, route.tier, on_part, pieces.append)
        except SpeechError as exc:
            other = self._other_tier(job)
            if exc.code != "synthesis_failed" or other is None or emitted():
                raise
            # The other tier answers this request (a failing fast voice must not leave the
            # request unanswered while the quality voice could speak it, and the reverse).
            _LOGGER.warning(
                "Request %s: voice %s failed (%s); answering with voice %s",
                job.id,
                route.voice.name,
                exc,
                other.name,
            )
            pieces.clear()
            return self._render(job, other, other.tier, on_part, pieces.append)

    def _render(
        self,
        job: SpeechJob,
        voice: Voice,
        tier: str,
        on_part: Callable[[AudioPart], None] | None,
        on_sentence: Callable[[SentenceAudio], None],
    ) -> Rendering:
        try:
            rendering = self.synthesizer.render_plan(
                job.plan,
                voice,
                use_cache=job.use_cache,
                on_sentence=on_sentence,
                on_part=on_part,
                volume=job.request.volume,
                # A door that streams hears a sentence as it is made (the engine's own stream,
                # or a long sentence clause by clause).
                streaming=on_part is not None and job.request.stream,
            )
        except RequestError as exc:
            raise SpeechError(exc.code, str(exc)) from exc
        except EngineError as exc:
            raise SpeechError("synthesis_failed", str(exc)) from exc
        except Exception as exc:
            _LOGGER.exception("Request %s failed", job.id)
            raise SpeechError("synthesis_failed", f"internal error: {type(exc).__name__}") from exc
        # The tier it answers as is the route's: a voice may be one request's quality voice and
        # another's fast voice.
        rendering.tier = tier
        return rendering

    def _other_tier(self, job: SpeechJob) -> Voice | None:
        """The voice of the other tier for this request, if it has one that speaks its
        language: the requested voice for a job sent to its fast voice, else its fast voice."""
        if job.rerouted:
            return job.plan.voice
        language = job.plan.language
        fast = self.synthesizer.engines.fast_voice_for(job.plan.voice, language)
        if fast is None or fast is job.plan.voice:
            return None
        if language and language not in fast.engine.languages:
            return None
        return fast

    def sentence_parts(
        self, pieces: Sequence[SentenceAudio], rendering: Rendering
    ) -> list[AudioPart]:
        """Whole sentences as the per-sentence stream messages (for audio too big as one)."""
        return self.synthesizer.sentence_parts(pieces, rendering.sample_rate, rendering.layout)

    # counters and descriptions

    def count_answer(
        self,
        tier: str,
        latency_ms: float | None = None,
        *,
        door: str = "mqtt",
        voice: str | None = None,
    ) -> None:
        self.counters.answer(tier, latency_ms)
        if self.metrics is not None:
            self.metrics.request(door, "ok", tier)
        if self.activity is not None:
            self.activity.record(door, "ok", voice=voice, tier=tier, latency_ms=latency_ms)

    def count_error(self, code: str = "error", *, door: str = "mqtt") -> None:
        """A refused or failed request; `code` is its error code."""
        self.counters.error()
        if self.metrics is not None:
            self.metrics.request(door, code, None)
        if self.activity is not None:
            self.activity.record(door, code)

    def voices(self) -> VoiceCatalog:
        engines = self.synthesizer.engines
        voices = {
            v.name: VoiceInfo(
                name=v.name,
                languages=tuple(sorted(v.engine.languages)),
                engine=v.engine.name,
                tier=v.tier,
                description=v.settings.description,
                sample_rate=v.engine.sample_rate,
                backend=v.backend,
                fast_voice=v.settings.fast_voice,
            )
            for v in engines
        }
        presets = []
        for name, preset in self.settings.presets.items():
            base = voices.get(preset.voice)
            if base is None:
                continue
            chimes = " and ".join(c for c in (preset.chime, preset.chime_after) if c)
            described = preset.description or (
                f"{base.name} with {chimes}" if chimes else base.name
            )
            presets.append(dataclasses.replace(base, name=name, description=described))
        return VoiceCatalog(
            voices=tuple(voices.values()),
            default_voice=engines.default_voice,
            presets=tuple(presets),
        )

    def engine_identities(self) -> list[str]:
        return sorted({e.identity for e in self.synthesizer.engines.engines()})

    def describe(self) -> dict[str, Any]:
        """What the speech path is doing now, for health reports."""
        synth = self.synthesizer
        answers, last_latency, last_tier = self.counters.snapshot()
        return {
            "queue_depth": self.scheduler.depth,
            "queue_lanes": self.scheduler.lanes(),
            "queue_doors": self.scheduler.doors(),
            "busy_refusals": self.scheduler.refusals(),
            "active": self.scheduler.active,
            "background_pending": self.idle.pending(),
            "background_running": self.scheduler.background_running,
            "background_done": dict(self.idle.done),
            "background_interrupted": self.idle.interrupted,
            "estimated_backlog_s": round(self.scheduler.backlog_s(), 3),
            "answers": answers,
            "tier_in_use": "fast" if self.router.fast_mode else "quality",
            "last_tier": last_tier,
            "last_latency_ms": last_latency,
            "rtf": synth.stats.rtf(),
            "seconds_per_char": {k: round(v, 5) for k, v in synth.estimator.snapshot().items()},
        }
