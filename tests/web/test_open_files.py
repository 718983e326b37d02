"""The real bridge under a low open-file limit: its doors' caps are fitted under the limit, a
flood of idle connections is refused without taking the descriptors the broker, the cache and
the audio store need, and when accept() does run out of descriptors the log gets one line, not
one traceback per retry.

The bridge runs as a subprocess started with RLIMIT_NOFILE 256 (soft and hard: it cannot raise
it); the flood comes from several loopback addresses, as from several LAN hosts.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest

from tests.support.harness import (
    BridgeFactory,
    MqttProbe,
    ProbeFactory,
    ReceivedMessage,
    RunningBridge,
    bridge_api,
)
from tests.support.web import fetch

pytestmark = pytest.mark.slow

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
WAIT_S = 60.0
OPEN_FILES = 256
HOSTS = [f"127.0.0.{n}" for n in range(2, 14)]


def _say(probe: MqttProbe, request_id: str, text: str) -> dict[str, object]:
    since = probe.mark()
    probe.publish(f"{BASE}/say/kitchen", json.dumps({"text": text, "id": request_id}))

    def answer(m: ReceivedMessage) -> bool:
        return m.topic == RESPONSE and m.json()["id"] == request_id

    body: dict[str, object] = probe.wait_for(answer, WAIT_S, since=since).json()
    return body


@contextmanager
def _flood(port: int, per_host: int) -> Iterator[list[socket.socket]]:
    """Connections from every host in HOSTS, held open until the block ends. Non-blocking, so a
    listener that cannot accept (its backlog full) does not hold the test up a timeout each;
    the block starts once each is connected or a few seconds have passed."""
    held: list[socket.socket] = []
    with selectors.DefaultSelector() as selector:
        try:
            for host in HOSTS:
                for _ in range(per_host):
                    sock = socket.socket()
                    sock.bind((host, 0))
                    sock.setblocking(False)
                    sock.connect_ex(("127.0.0.1", port))
                    selector.register(sock, selectors.EVENT_WRITE)
                    held.append(sock)
            pending = len(held)
            deadline = time.monotonic() + 5.0
            while pending and time.monotonic() < deadline:
                for key, _ in selector.select(0.2):
                    selector.unregister(key.fileobj)
                    pending -= 1
            yield held
        finally:
            for sock in held:
                sock.close()


def _open_files(bridge: RunningBridge) -> int:
    return len(os.listdir(f"/proc/{bridge.proc.pid}/fd"))


def test_a_low_open_file_limit_keeps_the_bridge_serving_and_the_log_small(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(_open_files=OPEN_FILES)
    probe = probe_factory(RESPONSE, f"{BASE}/bridge/response/#")
    probe.diagnostics = bridge.log_tail
    first = _say(probe, "before", "The front door is open.")
    assert first["status"] == "ok", first
    url = str(first["data"]["url"])  # type: ignore[index]
    http_port = urlsplit(url).port
    assert http_port is not None
    wyoming_port = int(bridge.config["wyoming"]["port"])

    health = bridge_api(probe, "health_check", timeout=WAIT_S)["data"]
    assert health["open_files"]["limit"] == OPEN_FILES
    http_cap = health["connections"]["http"]["max"]
    wyoming_cap = health["connections"]["wyoming"]["max"]
    assert http_cap + wyoming_cap < OPEN_FILES, health["connections"]

    # More connections than both caps together, from many hosts: the caps hold, the
    # descriptors stay within the limit, and the house's announcements are still answered.
    with _flood(http_port, 32), _flood(wyoming_port, 8):
        during = _say(probe, "during", "The washing machine has finished.")
        assert during["status"] == "ok", during
        assert "url" in during["data"], during  # type: ignore[operator]
        health = bridge_api(probe, "health_check", timeout=WAIT_S)["data"]
        assert health["connections"]["http"]["open"] <= http_cap
        assert health["connections"]["http"]["refused"], health["connections"]
        assert health["open_files"]["open"] < OPEN_FILES

    # Then the descriptors do run out (the limit lowered under the bridge's feet): accept()
    # fails, and goes on failing, while the flood lasts.
    lowered = _open_files(bridge) + 4
    resource.prlimit(bridge.proc.pid, resource.RLIMIT_NOFILE, (lowered, OPEN_FILES))
    try:
        with _flood(http_port, 16):
            time.sleep(3)  # asyncio retries accept() every second: several failures to log
    finally:
        resource.prlimit(bridge.proc.pid, resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))

    after = _say(probe, "after", "Dinner is ready.")
    assert after["status"] == "ok", after
    status, _, _ = fetch(str(after["data"]["url"]))  # type: ignore[index]
    assert status == 200
    health = bridge_api(probe, "health_check", timeout=WAIT_S)["data"]
    failures = health["connections"]["http"]["accept_errors"]
    assert sum(failures.values()) >= 1, health["connections"]
    log = bridge.log_path.read_text(encoding="utf-8", errors="replace")
    lines = log.splitlines()
    resource_lines = [line for line in lines if "out of system resource" in line]
    assert 1 <= len(resource_lines) <= 2, resource_lines
    # No traceback from the doors (other parts may report a failure once while the
    # descriptors are out: at most a few lines, not one per retry).
    assert not any("asyncio" in line or "accept" in line for line in lines if "File" in line)
    assert sum("Traceback" in line for line in lines) <= 2, bridge.log_tail(200)
