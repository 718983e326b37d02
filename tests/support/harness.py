"""Shared fixtures: a private mosquitto, an MQTT 5 test client and the real bridge as a subprocess.

Nothing here is mocked: the tests speak MQTT to a mosquitto on a free loopback port (never the
system broker on 1883) and, for the end-to-end tests, to ``python -m tts_bridge run``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import paho.mqtt.client as mqtt
import pytest
import yaml
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from tts_bridge.bench.localbroker import LocalBroker, free_port
from tts_bridge.mqtt.client import new_client

_LOGGER = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_TOPIC = "tts_bridge"
# Loading the voices on a small CPU takes a few seconds; a minute means something is wrong.
BRIDGE_START_TIMEOUT_S = 60.0
BRIDGE_STOP_TIMEOUT_S = 10.0
MQTT_TIMEOUT_S = 10.0


# -- the broker ------------------------------------------------------------------------------


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A private mosquitto in ``tmp_path/broker``, stopped after the test."""
    local = LocalBroker(tmp_path / "broker")
    local.start()
    try:
        yield local
    finally:
        local.stop()


# -- an MQTT 5 test client -------------------------------------------------------------------


@dataclass(frozen=True)
class ReceivedMessage:
    """One message as the probe received it."""

    topic: str
    payload: bytes
    properties: Properties | None
    retain: bool
    qos: int
    seq: int
    """Arrival order within the probe (0, 1, 2, ...)."""
    received_at: float = 0.0
    """time.monotonic() when the probe received it."""

    def json(self) -> Any:
        return json.loads(self.payload)

    @property
    def user_properties(self) -> dict[str, str]:
        pairs: list[tuple[str, str]] = getattr(self.properties, "UserProperty", None) or []
        return dict(pairs)

    @property
    def content_type(self) -> str | None:
        value: str | None = getattr(self.properties, "ContentType", None)
        return value

    @property
    def correlation_data(self) -> bytes | None:
        value: bytes | None = getattr(self.properties, "CorrelationData", None)
        return value

    @property
    def message_expiry_interval(self) -> int | None:
        value: int | None = getattr(self.properties, "MessageExpiryInterval", None)
        return value

    def __str__(self) -> str:
        shown = self.payload[:160]
        more = f"... ({len(self.payload)} bytes)" if len(self.payload) > len(shown) else ""
        flags = " retained" if self.retain else ""
        return f"#{self.seq} {self.topic}{flags}: {shown!r}{more} {self.user_properties or ''}"


class MqttProbe:
    """A paho-mqtt 2.x MQTT 5 client that records every message it receives.

    The paho network loop runs in its own thread; received messages go into a list guarded by a
    condition, so ``wait_for`` can block the test until a matching message has arrived.
    """

    def __init__(self, host: str, port: int, *, client_id: str | None = None) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id or f"probe-{uuid.uuid4().hex[:10]}"
        self.diagnostics: Callable[[], str] | None = None
        """Called when a wait times out; its text (e.g. the bridge's log) joins the error."""
        self._cond = threading.Condition()
        self._messages: list[ReceivedMessage] = []
        self._acked_mids: dict[int, list[ReasonCode]] = {}
        self._connected = threading.Event()
        self._connect_error: str | None = None
        self._client = new_client(client_id=self.client_id)
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._client.on_message = self._on_message

    # paho callbacks (network thread) ----------------------------------------------------------

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:
            self._connect_error = str(reason_code)
        self._connected.set()

    def _on_subscribe(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        with self._cond:
            self._acked_mids[mid] = reason_codes
            self._cond.notify_all()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._cond:
            self._messages.append(
                ReceivedMessage(
                    topic=message.topic,
                    payload=bytes(message.payload),
                    properties=message.properties,
                    retain=bool(message.retain),
                    qos=message.qos,
                    seq=len(self._messages),
                    received_at=time.monotonic(),
                )
            )
            self._cond.notify_all()

    # the test's side ------------------------------------------------------------------------

    def connect(self, timeout: float = MQTT_TIMEOUT_S) -> Self:
        # A second connect drops the first socket under the running loop: a publish in
        # between fails with "connection lost".
        assert not self._connected.is_set(), "already connected (`with` connects on entry)"
        self._client.connect(self.host, self.port, keepalive=30)
        self._client.loop_start()
        if not self._connected.wait(timeout):
            raise AssertionError(f"no CONNACK from {self.host}:{self.port} within {timeout} s")
        if self._connect_error:
            raise AssertionError(f"broker refused the probe: {self._connect_error}")
        return self

    def subscribe(self, *topics: str, qos: int = 1, timeout: float = MQTT_TIMEOUT_S) -> None:
        """Subscribe and wait for the SUBACK, so nothing published afterwards is missed."""
        result, mid = self._client.subscribe([(t, SubscribeOptions(qos=qos)) for t in topics])
        assert result == mqtt.MQTT_ERR_SUCCESS, f"subscribe failed: {mqtt.error_string(result)}"
        assert mid is not None
        with self._cond:
            if not self._cond.wait_for(lambda: mid in self._acked_mids, timeout):
                raise AssertionError(f"no SUBACK for {topics} within {timeout} s")
            codes = self._acked_mids[mid]
        refused = [str(c) for c in codes if c.is_failure]
        assert not refused, f"subscription to {topics} refused: {refused}"

    def publish(
        self,
        topic: str,
        payload: bytes | str,
        qos: int = 1,
        properties: Properties | None = None,
        *,
        retain: bool = False,
        timeout: float = MQTT_TIMEOUT_S,
    ) -> None:
        """Publish and wait until the broker has it (PUBACK for QoS 1)."""
        info = self._client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, f"publish failed: {mqtt.error_string(info.rc)}"
        info.wait_for_publish(timeout)
        assert info.is_published(), f"publish to {topic} not acknowledged within {timeout} s"

    @property
    def messages(self) -> list[ReceivedMessage]:
        with self._cond:
            return list(self._messages)

    def mark(self) -> int:
        """A position in the message list; pass it as ``since`` to ignore older messages."""
        with self._cond:
            return len(self._messages)

    def find(
        self, predicate: Callable[[ReceivedMessage], bool], *, since: int = 0
    ) -> ReceivedMessage | None:
        """The first message from ``since`` on that matches, or None (does not wait)."""
        with self._cond:
            return self._find_locked(predicate, since)

    def wait_for(
        self,
        predicate: Callable[[ReceivedMessage], bool],
        timeout: float = 30.0,
        *,
        since: int = 0,
        what: str = "a matching message",
    ) -> ReceivedMessage:
        """Block until a message from ``since`` on matches ``predicate``; return the first one.

        A predicate that raises ValueError/KeyError/TypeError/AttributeError (e.g. from parsing
        a payload that is not JSON) counts as "no match", so predicates can stay short.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = self._find_locked(predicate, since)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            seen = "\n  ".join(str(m) for m in self._messages[since:][-30:]) or "(none)"
        extra = f"\n{self.diagnostics()}" if self.diagnostics else ""
        raise AssertionError(
            f"timed out after {timeout} s waiting for {what}; messages since #{since}:\n  "
            f"{seen}{extra}"
        )

    def clear(self) -> None:
        with self._cond:
            self._messages.clear()

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def __enter__(self) -> Self:
        # `with MqttProbe(...).connect(timeout=...)` is connected already.
        return self if self._connected.is_set() else self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _find_locked(
        self, predicate: Callable[[ReceivedMessage], bool], since: int
    ) -> ReceivedMessage | None:
        for message in self._messages[since:]:
            try:
                if predicate(message):
                    return message
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        return None


def thread_nice() -> dict[int, int]:
    """Thread id -> nice value, for every thread of this process (Linux)."""
    values = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        # Fields after the command name (which may hold spaces) start at field 3; nice is 19.
        values[int(task.name)] = int(stat.rsplit(")", 1)[1].split()[16])
    return values


def threads_started_niced(work: Callable[[], None], timeout_s: float = 120.0) -> dict[int, int]:
    """Run ``work`` on a thread 5 nice levels down (as the idle thread is); the nice value of
    every thread of this process that appeared meanwhile, that worker excepted (it may still be
    listed for a moment after join() returns: the OS thread exits after Python's bookkeeping)."""
    before = thread_nice()
    niced = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + 5
    failures: list[BaseException] = []

    def run() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niced)
        try:
            work()
        except BaseException as exc:  # re-raised on the calling thread
            failures.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(timeout_s)
    assert not worker.is_alive(), f"work did not finish in {timeout_s} s"
    if failures:
        raise failures[0]
    return {
        tid: nice
        for tid, nice in thread_nice().items()
        if tid not in before and tid != worker.native_id
    }


def request_properties(
    *, response_topic: str | None = None, correlation_data: bytes | None = None
) -> Properties:
    """MQTT 5 PUBLISH properties for a request."""
    # paho's Properties constructor has no annotations.
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if response_topic is not None:
        props.ResponseTopic = response_topic
    if correlation_data is not None:
        props.CorrelationData = correlation_data
    return props


def bridge_api(
    probe: MqttProbe,
    name: str,
    payload: dict[str, Any] | None = None,
    *,
    timeout: float,
    base: str = BASE_TOPIC,
) -> dict[str, Any]:
    """Send ``payload`` to ``<base>/bridge/request/<name>`` with a fresh transaction id; returns
    the JSON body of the response that carries it (waits up to ``timeout`` s)."""
    since = probe.mark()
    transaction = f"t-{since}"
    probe.publish(
        f"{base}/bridge/request/{name}", json.dumps({**(payload or {}), "transaction": transaction})
    )

    def is_answer(m: ReceivedMessage) -> bool:
        return (
            m.topic == f"{base}/bridge/response/{name}"
            and m.json().get("transaction") == transaction
        )

    body: dict[str, Any] = probe.wait_for(is_answer, timeout, since=since).json()
    return body


ProbeFactory = Callable[..., MqttProbe]


@pytest.fixture
def probe_factory(broker: LocalBroker) -> Iterator[ProbeFactory]:
    """``probe_factory(*topics)``: a connected MqttProbe subscribed to ``topics``, closed later."""
    probes: list[MqttProbe] = []

    def make(*topics: str, qos: int = 1) -> MqttProbe:
        probe = MqttProbe(broker.host, broker.port).connect()
        probes.append(probe)
        if topics:
            probe.subscribe(*topics, qos=qos)
        return probe

    yield make
    for probe in probes:
        probe.close()


# -- the bridge as a subprocess ----------------------------------------------------------------


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in; nested mappings merge, everything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class RunningBridge:
    """A ``python -m tts_bridge run`` subprocess started by ``bridge_factory``."""

    proc: subprocess.Popen[bytes]
    config: dict[str, Any]
    config_path: Path
    log_path: Path
    base_topic: str
    _log_file: Any = field(repr=False, default=None)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return f"(no bridge log at {self.log_path})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"--- bridge log {self.log_path} (last {lines} lines):\n{tail}"

    def stop(self, timeout: float = BRIDGE_STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                warnings.warn(
                    f"the bridge ignored SIGTERM for {timeout} s and was killed",
                    stacklevel=2,
                )
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self._close_log()
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL: the bridge gets no chance to say goodbye (the broker sends its Last Will)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=BRIDGE_STOP_TIMEOUT_S)
        self._close_log()
        return self.proc.returncode

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


class BridgeFactory:
    """Start real bridges against the test's broker; each call writes a config and waits online.

    ``factory(**overrides)`` deep-merges the overrides into the default config, e.g.
    ``factory(limits={"max_text_chars": 200})``. Calls without a ``cache`` override share
    ``tmp_path/cache``, so a second bridge after ``stop()`` sees the first one's cache.
    """

    module = "tts_bridge"
    """What ``python -m`` runs: a test's own entry point may register test-only engines first."""

    def __init__(self, broker: LocalBroker, tmp_path: Path) -> None:
        self.broker = broker
        self.tmp_path = tmp_path
        self.bridges: list[RunningBridge] = []

    def default_config(self) -> dict[str, Any]:
        return {
            "mqtt": {
                "host": self.broker.host,
                "port": self.broker.port,
                "base_topic": BASE_TOPIC,
                "client_id": "tts_bridge_test",
            },
            "cache": {"dir": str(self.tmp_path / "cache"), "max_mb": 64},
            "models": {"dir": str(self.tmp_path / "models")},
            "journal": {"path": str(self.tmp_path / "journal.sqlite3")},
            # Loopback only and never announced: a test bridge must not appear on the LAN.
            "wyoming": {"host": "127.0.0.1", "port": free_port(), "zeroconf": False},
            # Loopback only, any free port (the answers' URLs name it): never on the LAN.
            "http": {"host": "127.0.0.1", "port": 0},
        }

    def __call__(
        self, _wait_online: bool = True, _open_files: int | None = None, **overrides: Any
    ) -> RunningBridge:
        """Start a bridge with ``overrides`` merged into the config; by default wait until it
        is online (``_wait_online=False`` for a bridge that is expected never to get there).
        ``_open_files`` starts it with that RLIMIT_NOFILE (soft and hard)."""
        config = deep_merge(self.default_config(), overrides)
        base_topic = str(config["mqtt"]["base_topic"])
        n = len(self.bridges) + 1
        config_path = self.tmp_path / f"bridge-{n}.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        log_path = self.tmp_path / f"bridge-{n}.log"

        # Subscribed before the process starts: the bridge's own "online" then arrives as a live
        # message (retain flag 0), while a stale retained state from an earlier bridge arrives
        # with the retain flag set and is ignored.
        watcher = MqttProbe(self.broker.host, self.broker.port).connect() if _wait_online else None
        try:
            if watcher is not None:
                watcher.subscribe(f"{base_topic}/bridge/state")
            log_file = log_path.open("wb")
            command = [sys.executable, "-m", self.module, "run", "--config", str(config_path)]
            if _open_files is not None:
                command = _with_open_files_limit(_open_files, command)
            proc = subprocess.Popen(
                [*command, "--debug"],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.tmp_path,
                env=_bridge_environment(),
            )
            bridge = RunningBridge(proc, config, config_path, log_path, base_topic, log_file)
            self.bridges.append(bridge)
            if watcher is not None:
                self._wait_online(bridge, watcher)
        finally:
            if watcher is not None:
                watcher.close()
        return bridge

    def _wait_online(self, bridge: RunningBridge, watcher: MqttProbe) -> None:
        def is_online(m: ReceivedMessage) -> bool:
            return not m.retain and m.json() == {"state": "online"}

        deadline = time.monotonic() + BRIDGE_START_TIMEOUT_S
        while watcher.find(is_online) is None:
            if not bridge.running:
                pytest.fail(
                    f"the bridge exited with code {bridge.proc.returncode} before it was online\n"
                    f"{bridge.log_tail()}"
                )
            if time.monotonic() > deadline:
                bridge.kill()
                seen = [str(m) for m in watcher.messages] or ["(none)"]
                pytest.fail(
                    f"the bridge did not publish {{'state': 'online'}} on "
                    f"{bridge.base_topic}/bridge/state within {BRIDGE_START_TIMEOUT_S:.0f} s; "
                    f"state messages: {seen}\n{bridge.log_tail()}"
                )
            time.sleep(0.05)
        _LOGGER.debug("bridge pid %d online", bridge.proc.pid)

    def close(self) -> None:
        for bridge in self.bridges:
            bridge.stop()


def _with_open_files_limit(limit: int, command: list[str]) -> list[str]:
    """`command` started by a Python that first sets RLIMIT_NOFILE (soft and hard) to `limit`
    (exec keeps it; preexec_fn is unsafe in a test process with threads)."""
    script = (
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", script, *command]


def _bridge_environment() -> dict[str, str]:
    # A developer's TTS_BRIDGE_* variables would silently change the config under test.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTS_BRIDGE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def pytest_configure(config: pytest.Config) -> None:
    """Private XDG data and cache folders for the whole session (each xdist worker its own),
    before any fixture runs: module- and session-scoped fixtures build settings before the
    per-test folders below exist, and a developer's voices file, lexicon or journal must not
    reach them."""
    home = Path(tempfile.mkdtemp(prefix="tts-bridge-tests-xdg-"))
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    os.environ["XDG_DATA_HOME"] = str(home / "data")
    os.environ["XDG_CACHE_HOME"] = str(home / "cache")


@pytest.fixture(autouse=True)
def _private_user_dirs(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test (and every bridge it starts) gets its own XDG data and cache folders, so a
    developer's voices file, journal or cache never leaks into a test, nor the reverse."""
    home = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))


@pytest.fixture
def bridge_factory(broker: LocalBroker, tmp_path: Path) -> Iterator[BridgeFactory]:
    """Start the real bridge (``python -m tts_bridge run``); every bridge is stopped afterwards."""
    factory = BridgeFactory(broker, tmp_path)
    try:
        yield factory
    finally:
        factory.close()
