"""Prometheus metrics of the speech path, in a registry of the service's own.

Events are counted where they happen (a request answered or refused, a cache lookup, a sentence
synthesized with its stages, an idle batch, a model loaded or unloaded); what is a level rather
than an event (queue depth per lane, resident memory, broker connection, models in memory, cache
size) is read when Prometheus scrapes, from the `State` the service hands in. Labels are door,
status code, tier, voice, engine, stage and lane names: never a request's text.

One `Metrics` per service, with its own `CollectorRegistry`: nothing is registered in
prometheus_client's global registry, so two services (or two tests) never share counters.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from tts_bridge.engines.base import Stages

_LOGGER = logging.getLogger(__name__)

PREFIX = "tts_bridge"
CONTENT_TYPE = CONTENT_TYPE_LATEST
# From a cached sentence's milliseconds to a long ChatTTS generation on a small CPU.
_SECONDS_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0
)  # fmt: skip
# A request's stages, from a cache read's tenth of a millisecond to a long sentence's engine.
_STAGE_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
)  # fmt: skip
REQUEST_STAGES = (
    "queue",
    "cache_read",
    "front",
    "engine",
    "engine_first",
    "loudness",
    "first_audio",
    "first_byte",
    "encode",
    "cache_write",
)
"""A request's stages, in the order they happen: `queue` (submitted to a worker starting it),
`cache_read`, `front` (front end and the engine's text preparation), `engine`, `engine_first`
(the engine's time until the request's first audio: all of `engine` for a sentence made whole,
a window's worth for one made in pieces), `loudness`;
`first_audio` and `first_byte` are points, not spans: seconds from the request's arrival to its
first audio handed to the door, and to the door's first byte of audio written; then `encode`
(the whole answer's WAV) and `cache_write`. Spans are summed over a request's sentences."""
RECENT_REQUESTS = 512
"""Requests whose stages `Metrics.recent_stages` keeps (for the bench)."""
_RTF_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class State:
    """The levels read at each scrape."""

    queue_depth: Mapping[str, int] = field(default_factory=dict)
    """Jobs waiting, per scheduler lane."""
    resident_bytes: int = 0
    broker_connected: bool | None = None
    """None when the service has no broker connection to report."""
    loaded_models: tuple[str, ...] = ()
    model_resident_bytes: Mapping[str, float] = field(default_factory=dict)
    cache_entries: int = 0
    cache_bytes: int = 0


class _Levels(Collector):
    """Gauges computed from `State` at scrape time."""

    def __init__(self, read: Callable[[], State]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        try:
            state = self._read()
        except Exception:  # a scrape must not fail the service, nor the other metrics
            _LOGGER.exception("Reading the service's state for metrics failed")
            return
        depth = GaugeMetricFamily(
            f"{PREFIX}_queue_depth", "Jobs waiting for synthesis, per lane", labels=["lane"]
        )
        for lane, jobs in sorted(state.queue_depth.items()):
            depth.add_metric([lane], jobs)
        yield depth
        yield GaugeMetricFamily(
            f"{PREFIX}_resident_memory_bytes",
            "Resident memory of the bridge process",
            value=state.resident_bytes,
        )
        if state.broker_connected is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_broker_connected",
                "1 while the MQTT broker connection is up",
                value=1 if state.broker_connected else 0,
            )
        loaded = GaugeMetricFamily(
            f"{PREFIX}_model_loaded", "1 for each model in memory", labels=["engine"]
        )
        for identity in state.loaded_models:
            loaded.add_metric([identity], 1)
        yield loaded
        model_memory = GaugeMetricFamily(
            f"{PREFIX}_model_resident_bytes",
            "Measured resident memory of each loaded model",
            labels=["engine"],
        )
        for identity, size in sorted(state.model_resident_bytes.items()):
            model_memory.add_metric([identity], size)
        yield model_memory
        yield GaugeMetricFamily(
            f"{PREFIX}_cache_entries", "Sentences in the cache", value=state.cache_entries
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_cache_bytes", "Bytes of audio in the cache", value=state.cache_bytes
        )


class Metrics:
    """The service's metrics; every method may be called from any thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Speech requests answered or refused, by door, status (ok or the error code) and tier",
            ["door", "status", "tier"],
            registry=registry,
        )
        self.cache_lookups = Counter(
            f"{PREFIX}_cache_lookups",
            "Sentence cache lookups of live and idle work, by result (hit or miss)",
            ["result"],
            registry=registry,
        )
        self.synthesis_seconds = Histogram(
            f"{PREFIX}_synthesis_seconds",
            "Time to synthesize one sentence, by voice and stage (total: the whole sentence)",
            ["voice", "stage"],
            buckets=_SECONDS_BUCKETS,
            registry=registry,
        )
        self.synthesis_steps = Counter(
            f"{PREFIX}_synthesis_steps",
            "Runs of each stage, by voice (ChatTTS codes: one per code generated)",
            ["voice", "stage"],
            registry=registry,
        )
        self.request_stage_seconds = Histogram(
            f"{PREFIX}_request_stage_seconds",
            "Where each request's time went, by door and stage (queue, cache_read, front, "
            "engine, loudness, encode, cache_write: spans; first_audio, first_byte: from the "
            "request's arrival)",
            ["door", "stage"],
            buckets=_STAGE_BUCKETS,
            registry=registry,
        )
        self._recent_lock = threading.Lock()
        self._recent: deque[tuple[str, dict[str, float]]] = deque(maxlen=RECENT_REQUESTS)
        self.real_time_factor = Histogram(
            f"{PREFIX}_real_time_factor",
            "Synthesis time over audio time of each synthesized sentence, by voice",
            ["voice"],
            buckets=_RTF_BUCKETS,
            registry=registry,
        )
        self.audio_seconds = Counter(
            f"{PREFIX}_synthesized_audio_seconds",
            "Seconds of audio synthesized (not from the cache), by voice",
            ["voice"],
            registry=registry,
        )
        self.idle_batch_size = Histogram(
            f"{PREFIX}_idle_batch_size",
            "Sentences synthesized together by idle work (engines that batch)",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.model_loads = Counter(
            f"{PREFIX}_model_loads", "Models loaded, by engine", ["engine"], registry=registry
        )
        self.model_unloads = Counter(
            f"{PREFIX}_model_unloads", "Models unloaded, by engine", ["engine"], registry=registry
        )
        self.model_load_seconds = Histogram(
            f"{PREFIX}_model_load_seconds",
            "Time to load a model, by engine",
            ["engine"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )

    def watch(self, read: Callable[[], State]) -> None:
        """Report the levels `read()` gives at every scrape."""
        self.registry.register(_Levels(read))

    # events

    def request(self, door: str, status: str, tier: str | None) -> None:
        self.requests.labels(door, status, tier or "none").inc()

    def cache_lookup(self, hit: bool) -> None:
        self.cache_lookups.labels("hit" if hit else "miss").inc()

    def synthesized(self, voice: str, seconds: float, audio_seconds: float, stages: Stages) -> None:
        """One sentence synthesized: its total time, its engine's stages and its RTF."""
        self.synthesis_seconds.labels(voice, "total").observe(seconds)
        for stage, stage_seconds in stages.seconds.items():
            self.synthesis_seconds.labels(voice, stage).observe(stage_seconds)
        for stage, steps in stages.steps.items():
            self.synthesis_steps.labels(voice, stage).inc(steps)
        if audio_seconds > 0:
            self.real_time_factor.labels(voice).observe(seconds / audio_seconds)
            self.audio_seconds.labels(voice).inc(audio_seconds)

    def request_stages(self, door: str, seconds: dict[str, float]) -> None:
        """A request's stages once its work is done. `seconds` is the request's own record: a
        door that writes its first byte later still adds it (`first_byte`)."""
        for stage in REQUEST_STAGES:
            if stage != "first_byte" and stage in seconds:
                self.request_stage_seconds.labels(door, stage).observe(seconds[stage])
        with self._recent_lock:
            self._recent.append((door, seconds))

    def first_byte(self, door: str, seconds: dict[str, float], value: float) -> None:
        """The door wrote a request's first byte of audio `value` seconds after it arrived."""
        seconds["first_byte"] = value
        self.request_stage_seconds.labels(door, "first_byte").observe(value)

    def recent_stages(self) -> list[tuple[str, dict[str, float]]]:
        """The latest requests' stages (door, stage -> seconds), oldest first."""
        with self._recent_lock:
            recent = list(self._recent)
        return [(door, {k: v for k, v in s.items() if k in REQUEST_STAGES}) for door, s in recent]

    def idle_batch(self, size: int) -> None:
        self.idle_batch_size.observe(size)

    def model_loaded(self, engine: str, seconds: float) -> None:
        self.model_loads.labels(engine).inc()
        self.model_load_seconds.labels(engine).observe(seconds)

    def model_unloaded(self, engine: str) -> None:
        self.model_unloads.labels(engine).inc()

    # exposition

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
