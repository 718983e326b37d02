"""The private test broker itself: start, connect, restart on the same port, persistence."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.support.harness import MqttProbe
from tts_bridge.bench.localbroker import LocalBroker, LocalBrokerError, free_port


def _retained(broker: LocalBroker, topic: str, timeout: float = 5.0) -> bytes:
    with MqttProbe(broker.host, broker.port) as probe:
        probe.subscribe(topic)
        return probe.wait_for(lambda m: m.topic == topic and m.retain, timeout).payload


def test_start_connect_and_stop(tmp_path: Path) -> None:
    with LocalBroker(tmp_path) as broker:
        assert broker.running
        assert broker.host == "127.0.0.1"
        assert broker.port != 1883, "must never use the system broker's port"
        conf = (tmp_path / "mosquitto.conf").read_text()
        assert f"listener {broker.port} 127.0.0.1" in conf
        assert "allow_anonymous true" in conf
        with MqttProbe(broker.host, broker.port) as probe:
            probe.subscribe("t/#")
            probe.publish("t/x", b"ping")
            message = probe.wait_for(lambda m: m.topic == "t/x", 5)
            assert message.payload == b"ping"
            assert not message.retain
    assert not broker.running
    assert broker.log_path.exists()
    assert "running" in broker.log_path.read_text()


def test_restart_keeps_port_and_config(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path, max_packet_size=4096)
    broker.start()
    try:
        port = broker.port
        conf_before = broker.conf_path.read_text()
        assert "max_packet_size 4096" in conf_before
        broker.restart()
        assert broker.running
        assert broker.port == port
        assert broker.conf_path.read_text() == conf_before
        with MqttProbe(broker.host, broker.port) as probe:
            probe.subscribe("t/#")
            probe.publish("t/y", b"after restart")
            assert probe.wait_for(lambda m: m.topic == "t/y", 5).payload == b"after restart"
    finally:
        broker.stop()


def test_explicit_port(tmp_path: Path) -> None:
    port = free_port()
    with LocalBroker(tmp_path, port=port) as broker:
        assert broker.port == port
        with MqttProbe(broker.host, port):
            pass


@pytest.mark.parametrize("how", ["restart", "kill"])
def test_persistence_keeps_retained_message(tmp_path: Path, how: str) -> None:
    broker = LocalBroker(tmp_path, persistence=True)
    broker.start()
    try:
        with MqttProbe(broker.host, broker.port) as probe:
            probe.publish("keep/me", b"still here", retain=True)
        if how == "restart":
            broker.restart()
        else:
            # kill() skips mosquitto's final save: only the autosave after each change helps.
            # The autosave runs in mosquitto's main loop, so wait for the file to appear.
            _wait_for_file(broker.persistence_path)
            broker.kill()
            broker.start()
        assert _retained(broker, "keep/me") == b"still here"
    finally:
        broker.stop()


def test_without_persistence_retained_messages_are_gone(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path)
    broker.start()
    try:
        with MqttProbe(broker.host, broker.port) as probe:
            probe.publish("keep/me", b"gone", retain=True)
        broker.restart()
        with MqttProbe(broker.host, broker.port) as probe:
            probe.subscribe("keep/#")
            probe.publish("keep/marker", b"m")
            probe.wait_for(lambda m: m.topic == "keep/marker", 5)
            assert [m.topic for m in probe.messages] == ["keep/marker"]
    finally:
        broker.stop()


def test_stop_with_signal_and_double_stop(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path)
    broker.start()
    assert broker.pid is not None
    broker.stop(signal.SIGINT)
    assert not broker.running
    assert broker.stop() is None


def test_bad_config_fails_with_log_tail(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path, extra_config=["no_such_option 1"])
    with pytest.raises(LocalBrokerError, match="no_such_option"):
        broker.start()
    assert not broker.running


def test_extra_config_can_forbid_anonymous(tmp_path: Path) -> None:
    passwords = tmp_path / "passwords"
    passwords.write_text("")
    os.chmod(passwords, 0o600)
    broker = LocalBroker(
        tmp_path, extra_config=["allow_anonymous false", f"password_file {passwords}"]
    )
    with broker:
        conf = broker.conf_path.read_text()
        assert "allow_anonymous true" not in conf
        probe = MqttProbe(broker.host, broker.port)
        with pytest.raises(AssertionError, match="refused"):
            probe.connect(timeout=5)
        probe.close()


def test_port_held_by_another_program_is_an_error(tmp_path: Path) -> None:
    # Something else listens on the port: start() must notice that mosquitto failed, not take
    # the other program's accepted connection as a sign of success.
    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]
        broker = LocalBroker(tmp_path, port=port)
        with pytest.raises(LocalBrokerError, match="Address already in use"):
            broker.start()
        assert not broker.running


def _wait_for_file(path: Path, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_size > 0):
        assert time.monotonic() < deadline, f"{path} was not written within {timeout} s"
        time.sleep(0.05)
