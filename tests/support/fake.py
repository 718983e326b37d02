"""The service in process: a fake MQTT connection and fixtures that build the real service on it.

Everything but the network is real: `service.app.build` with the real synthesizer (the bundled
`joe` and `heart` voices, loaded once per session), the real sentence cache and journal in the
test's tmp_path, the real scheduler threads. `FakeConnection` records what the service publishes
and acknowledges, and simulates the broker's size limit; tests hand it messages as the network
thread would. It also plays the broker's refusals: `refuse(topic_filter)` answers publishes
there as an ACL would (PUBACK 135), and `deliver(..., retained=True)` a message from the
retained store.
"""

from __future__ import annotations

import io
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import soundfile

from tts_bridge import app
from tts_bridge.config import Settings, load_settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.mqtt.client import IncomingMessage, OutgoingMessage, PublishResult
from tts_bridge.mqtt.journal import Journal
from tts_bridge.mqtt.protocol import topic_matches
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.metrics import Metrics
from tts_bridge.speech.synthesis import Synthesizer
from tts_bridge.system.threads import ThreadPlan

BASE = "tts_bridge"
WAIT_S = 30.0


class FakeConnection:
    """Satisfies the service's `Connection` protocol without a broker.

    `packet_limit` plays the broker's maximum packet size: `max_payload` then subtracts the
    same overhead as `MqttConnection`, and a publish over it fails the test (a real broker
    would drop the connection)."""

    def __init__(self, packet_limit: int | None = None) -> None:
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.packet_limit = packet_limit
        self.published: list[OutgoingMessage] = []
        self.published_at: list[float] = []
        """time.monotonic() of each publish, in the order of `published`."""
        self.acks: list[tuple[int, int]] = []
        self.sequence: list[OutgoingMessage | tuple[int, int]] = []
        """Publishes and acks (mid, qos) in the order they happened."""
        self.subscriptions: list[str] = []
        self.final: OutgoingMessage | None = None
        self.started = self.stopped = False
        self.oversized: list[OutgoingMessage] = []
        self._on_message: Callable[[IncomingMessage], None] | None = None
        self._on_connected: Callable[[], None] | None = None
        self._changed = threading.Condition()
        self._mids = itertools.count(1)
        self._out_mids = itertools.count(1)
        self._refused: dict[str, tuple[int, str]] = {}
        self.refusals: Counter[str] = Counter()
        """Refused publishes by reason (as MqttConnection counts them)."""
        self.refused: list[OutgoingMessage] = []
        """What the broker refused (not in `published`: nobody received it)."""
        self.takeovers = 0

    # the Connection protocol

    def start(
        self,
        subscriptions: Sequence[str],
        on_message: Callable[[IncomingMessage], None],
        on_connected: Callable[[], None],
    ) -> None:
        self.subscriptions = list(subscriptions)
        self._on_message = on_message
        self._on_connected = on_connected
        self.started = True
        self.connect()

    def stop(self, final: OutgoingMessage | None = None, timeout_s: float = 5.0) -> None:
        if final is not None and self.connected.is_set():
            self.publish(final)
        self.final = final
        self.connected.clear()
        self.subscribed.clear()
        self.stopped = True

    def publish(
        self,
        message: OutgoingMessage,
        on_result: Callable[[PublishResult], None] | None = None,
    ) -> None:
        limit = self.max_payload(message.topic)
        refusal = next(
            (r for f, r in self._refused.items() if topic_matches(f, message.topic)), None
        )
        code, reason = refusal if refusal is not None else (0, "Success")
        with self._changed:
            if refusal is not None:
                self.refusals[reason] += 1
                self.refused.append(message)
            else:
                if limit is not None and len(message.payload) > limit:
                    self.oversized.append(message)
                self.published.append(message)
                self.published_at.append(time.monotonic())
                self.sequence.append(message)
            self._changed.notify_all()
        if on_result is not None:
            on_result(PublishResult(message.topic, next(self._out_mids), code, reason))

    def ack(self, mid: int, qos: int) -> None:
        with self._changed:
            self.acks.append((mid, qos))
            self.sequence.append((mid, qos))
            self._changed.notify_all()

    def max_payload(self, topic: str) -> int | None:
        if self.packet_limit is None:
            return None
        return self.packet_limit - len(topic.encode()) - 512

    # driving it

    def refuse(self, topic_filter: str, code: int = 135, reason: str = "Not authorized") -> None:
        """Refuse publishes on `topic_filter` from now on, as a broker's ACL does."""
        self._refused[topic_filter] = (code, reason)

    def connect(self) -> None:
        """A (re)connect: the service's on_connected runs as after a CONNACK."""
        self.connected.set()
        self.subscribed.set()
        assert self._on_connected is not None, "the service did not start the connection"
        self._on_connected()

    def deliver(
        self,
        topic: str,
        payload: bytes | str,
        *,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        duplicate: bool = False,
        mid: int | None = None,
        qos: int = 1,
        retained: bool = False,
    ) -> IncomingMessage:
        """Hand the service a message as paho's network thread would."""
        assert self._on_message is not None, "the service did not start the connection"
        message = IncomingMessage(
            topic=topic,
            payload=payload.encode() if isinstance(payload, str) else payload,
            response_topic=response_topic,
            correlation_data=correlation_data,
            duplicate=duplicate,
            mid=mid if mid is not None else next(self._mids),
            qos=qos,
            retained=retained,
        )
        self._on_message(message)
        return message

    def time_of(self, message: OutgoingMessage) -> float:
        """When `message` was published (time.monotonic())."""
        with self._changed:
            return self.published_at[next(i for i, m in enumerate(self.published) if m is message)]

    def order(self, item: OutgoingMessage | tuple[int, int]) -> int:
        """Where a publish or an ack (mid, qos) is in `sequence`."""
        with self._changed:
            return next(i for i, x in enumerate(self.sequence) if x is item or x == item)

    def mark(self) -> int:
        with self._changed:
            return len(self.published)

    def on(self, topic: str, since: int = 0) -> list[OutgoingMessage]:
        with self._changed:
            return [m for m in self.published[since:] if m.topic == topic]

    def wait_for(
        self,
        match: Callable[[OutgoingMessage], bool],
        timeout: float = WAIT_S,
        *,
        since: int = 0,
        what: str = "a message",
    ) -> OutgoingMessage:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for message in self.published[since:]:
                    if match(message):
                        return message
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [f"{m.topic} ({len(m.payload)} B)" for m in self.published[since:]]
                    raise AssertionError(f"no {what} within {timeout:.0f} s; published: {seen}")
                self._changed.wait(left)

    def wait_acked(self, mid: int, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not any(m == mid for m, _ in self.acks):
                left = deadline - time.monotonic()
                assert left > 0, f"message {mid} was never acknowledged"
                self._changed.wait(left)


def hold_worker(service: app.Service) -> threading.Event:
    """Occupy the service's synthesis slot until the returned event is set (a full queue for
    certain, however fast the machine)."""
    gate = threading.Event()

    def wait() -> None:
        gate.wait(WAIT_S)

    assert service.pipeline.scheduler.submit_live(wait)
    return gate


def journal_of(service: app.Service) -> Journal:
    """The service's journal (it has one unless its storage failed at start)."""
    journal = service.journal
    assert journal is not None, "the service runs without its journal"
    return journal


def props(message: OutgoingMessage) -> dict[str, str]:
    return dict(message.user_properties)


def body(message: OutgoingMessage) -> Any:
    return json.loads(message.payload)


def wav_info(data: bytes) -> soundfile._SoundFileInfo:
    return soundfile.info(io.BytesIO(data))


def settings_for(tmp_path: Path, overrides: dict[str, Any] | None = None) -> Settings:
    from tests.support.harness import deep_merge

    base: dict[str, Any] = {
        "mqtt": {"base_topic": BASE, "client_id": "tts_bridge_test"},
        "cache": {"dir": str(tmp_path / "cache"), "max_mb": 64},
        "models": {"dir": str(tmp_path / "models")},
        "journal": {"path": str(tmp_path / "journal.sqlite3")},
        "synthesis": {"onnx_threads": 1},
        # On fake connections nothing listens: no Wyoming server (tests/wyoming/test_server.py).
        "wyoming": {"enabled": False},
        # On loopback and any free port: a test's audio server must not appear on the LAN.
        "http": {"host": "127.0.0.1", "port": 0},
    }
    return load_settings(None, deep_merge(base, overrides or {}), environ={})


class Services:
    """Build, start and (afterwards) stop in-process services on fake connections."""

    def __init__(self, tmp_path: Path, pool: EnginePool, plan: ThreadPlan) -> None:
        self.tmp_path = tmp_path
        self._pool = pool
        self._plan = plan
        self.running: list[app.Service] = []
        self._default_voice = pool.default_voice

    def __call__(
        self,
        *,
        packet_limit: int | None = None,
        start: bool = True,
        **overrides: Any,
    ) -> tuple[app.Service, FakeConnection]:
        settings = settings_for(self.tmp_path, overrides)
        # The bundled voices, loaded once, are shared by every test that keeps them; the cache
        # and journal are always the test's own.
        pool = EnginePool(settings, plan=self._plan) if "voices" in overrides else self._pool
        metrics = Metrics()
        synth = Synthesizer(settings, pool, SentenceCache(settings.cache), metrics=metrics)
        connection = FakeConnection(packet_limit)
        service = app.build(
            settings, plan=self._plan, synthesizer=synth, connection=connection, metrics=metrics
        )
        if start:
            service.start()
            self.running.append(service)
        return service, connection

    def close(self) -> None:
        for service in self.running:
            service.stop()
        if self._pool.default_voice != self._default_voice:  # a test changed it over the API
            self._pool.set_default_voice(self._default_voice)


@pytest.fixture(scope="session")
def shared_pool(tmp_path_factory: pytest.TempPathFactory) -> EnginePool:
    """The bundled voices, loaded once for every in-process service of the session."""
    settings = settings_for(tmp_path_factory.mktemp("pool"))
    return EnginePool(settings, plan=app.thread_plan(settings))


@pytest.fixture
def services(tmp_path: Path, shared_pool: EnginePool) -> Iterator[Services]:
    factory = Services(tmp_path, shared_pool, app.thread_plan(settings_for(tmp_path)))
    try:
        yield factory
    finally:
        factory.close()
