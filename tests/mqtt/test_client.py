"""The MQTT connection against a real mosquitto: refused publishes, client id collisions,
retained requests."""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from paho.mqtt.client import DisconnectFlags, MQTTv5
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from tests.support.harness import MqttProbe
from tts_bridge.bench.localbroker import LocalBroker
from tts_bridge.mqtt.client import (
    IncomingMessage,
    MqttConnection,
    OutgoingMessage,
    PublishResult,
    new_client,
)
from tts_bridge.mqtt.settings import MqttSettings

WAIT_S = 10.0


def _connection(broker: LocalBroker, client_id: str) -> MqttConnection:
    settings = MqttSettings(host=broker.host, port=broker.port, client_id=client_id)
    return MqttConnection(settings, OutgoingMessage("t/state", b"offline", retain=False))


def _start(
    connection: MqttConnection,
    subscriptions: tuple[str, ...] = (),
    inbox: queue.Queue[IncomingMessage] | None = None,
) -> None:
    received: queue.Queue[IncomingMessage] = inbox if inbox is not None else queue.Queue()
    connection.start(subscriptions, received.put, lambda: None)


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A broker whose ACL lets anonymous clients write anything but ``tts_bridge/audio/denied``."""
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite #\ntopic deny tts_bridge/audio/denied\n", encoding="utf-8")
    local = LocalBroker(tmp_path / "broker", extra_config=[f"acl_file {acl}"])
    local.start()
    try:
        yield local
    finally:
        local.stop()


def test_refused_publishes_are_reported_with_topic_and_reason(
    acl_broker: LocalBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tts_bridge.mqtt.client")
    connection = _connection(acl_broker, f"bridge-{uuid.uuid4().hex[:8]}")
    _start(connection)
    try:
        assert connection.connected.wait(WAIT_S)
        results: queue.Queue[PublishResult] = queue.Queue()
        for topic in ["tts_bridge/audio/denied"] * 3 + ["tts_bridge/audio/kitchen"]:
            connection.publish(OutgoingMessage(topic, b"RIFF...."), on_result=results.put)
        answers = [results.get(timeout=WAIT_S) for _ in range(4)]
    finally:
        connection.stop()
    by_topic = {(a.topic, a.ok, a.reason_code) for a in answers}
    assert by_topic == {
        ("tts_bridge/audio/denied", False, 135),
        ("tts_bridge/audio/kitchen", True, 16),  # accepted, nobody subscribed
    }
    assert connection.refusals == {"Not authorized": 3}
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and "refused a publish" in r.getMessage()
    ]
    # One error line per topic and reason (the repeats go to debug), naming both.
    assert len(errors) == 1
    assert "tts_bridge/audio/denied" in errors[0] and "Not authorized" in errors[0]


def test_a_client_id_collision_is_diagnosed_and_backs_off(
    broker: LocalBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tts_bridge.mqtt.client")
    shared = f"tts_bridge-{uuid.uuid4().hex[:8]}"
    first = _connection(broker, shared)
    second = _connection(broker, shared)
    _start(first)
    try:
        assert first.connected.wait(WAIT_S)
        _start(second)
        deadline = time.monotonic() + WAIT_S
        while first.takeovers + second.takeovers == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Without backoff the two swap the session about once a second, forever.
        time.sleep(4.0)
        takeovers = first.takeovers + second.takeovers
        delays = (first.reconnect_delay_s, second.reconnect_delay_s)
    finally:
        second.stop()
        first.stop()
    assert 1 <= takeovers <= 3
    assert max(delays) >= 5
    diagnosed = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and "mqtt.client_id" in r.getMessage()
    ]
    # One line per bridge (both run in this process here), naming the id and the setting.
    assert 1 <= len(diagnosed) <= 2
    assert all(shared in line and "took its session" in line for line in diagnosed)


def test_retained_requests_are_marked_retained(broker: LocalBroker) -> None:
    with MqttProbe(broker.host, broker.port) as probe:  # connected on entry
        probe.publish("tts_bridge/say/kitchen", b"stale retained announcement", retain=True)
        inbox: queue.Queue[IncomingMessage] = queue.Queue()
        connection = _connection(broker, f"bridge-{uuid.uuid4().hex[:8]}")
        _start(connection, ("tts_bridge/say/+",), inbox)
        try:
            stale = inbox.get(timeout=WAIT_S)
            probe.publish("tts_bridge/say/kitchen", b"live announcement")
            live = inbox.get(timeout=WAIT_S)
        finally:
            connection.stop()
            probe.publish("tts_bridge/say/kitchen", b"", retain=True)  # clear it again
    assert (stale.payload, stale.retained) == (b"stale retained announcement", True)
    assert (live.payload, live.retained) == (b"live announcement", False)


def test_subscribed_waits_for_the_suback_and_a_qos0_request_then_arrives(
    broker: LocalBroker,
) -> None:
    inbox: queue.Queue[IncomingMessage] = queue.Queue()
    connection = _connection(broker, f"bridge-{uuid.uuid4().hex[:8]}")
    at_connect: list[bool] = []
    # Read on paho's thread right after the CONNACK, before it can have read the SUBACK.
    connection.start(
        ("tts_bridge/say/+", "tts_bridge/bridge/request/#"),
        inbox.put,
        lambda: at_connect.append(connection.subscribed.is_set()),
    )
    try:
        assert connection.subscribed.wait(WAIT_S)
        assert at_connect == [False], "subscribed before the broker acknowledged anything"
        with MqttProbe(broker.host, broker.port) as probe:  # connected on entry
            probe.publish("tts_bridge/bridge/request/phrases", b"{}", qos=0)
            assert inbox.get(timeout=WAIT_S).topic == "tts_bridge/bridge/request/phrases"
    finally:
        connection.stop()
    assert not connection.subscribed.is_set()


def test_early_acknowledgements_reach_their_publisher(broker: LocalBroker) -> None:
    """Answers may arrive before publish() returns (paho calls back on its own thread); every
    one still reaches its callback exactly once."""
    connection = _connection(broker, f"bridge-{uuid.uuid4().hex[:8]}")
    _start(connection)
    seen: list[int] = []
    lock = threading.Lock()

    def note(result: PublishResult) -> None:
        with lock:
            seen.append(result.mid)

    try:
        assert connection.connected.wait(WAIT_S)
        infos = [
            connection.publish(OutgoingMessage(f"x/{i}", b"p", qos=i % 2), on_result=note)
            for i in range(200)
        ]
        deadline = time.monotonic() + WAIT_S
        while len(seen) < 200 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        connection.stop()
    assert sorted(seen) == sorted(i.mid for i in infos if i is not None)


def test_reason_142_is_diagnosed_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """A broker that sends MQTT 5 'Session taken over' (mosquitto 2.0 just closes the socket)."""
    settings = MqttSettings(host="127.0.0.1", port=1, client_id="kitchen")
    connection = MqttConnection(settings, OutgoingMessage("t", b""))
    taken = ReasonCode(PacketTypes.DISCONNECT, identifier=142)
    # What paho calls on its network thread (the handler as set by callbacks.attach).
    on_disconnect: Callable[..., None] | None = connection._client.on_disconnect
    assert on_disconnect is not None
    on_disconnect(connection._client, None, DisconnectFlags(False), taken, None)
    assert connection.takeovers == 1 and connection.reconnect_delay_s == 5
    on_disconnect(connection._client, None, DisconnectFlags(False), taken, None)
    assert connection.reconnect_delay_s == 10
    lines = [r.getMessage() for r in caplog.records if "mqtt.client_id" in r.getMessage()]
    assert len(lines) == 1 and "'kitchen'" in lines[0] and "Session taken over" in lines[0]


def test_every_client_is_mqtt5_and_sends_small_packets_at_once(broker: LocalBroker) -> None:
    # The bridge, doctor, play, the benches and the test probe all connect through new_client:
    # without TCP_NODELAY a small answer after a large WAV waits ~40 ms per hop.
    client = new_client(
        MqttSettings(host=broker.host, port=broker.port, username="u", password="p"),
        client_id=f"factory-{uuid.uuid4().hex[:8]}",
    )
    try:
        client.connect(broker.host, broker.port)
        sock = client.socket()
        assert isinstance(sock, socket.socket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert client.protocol == MQTTv5
        assert client.username == "u"
    finally:
        client.disconnect()
