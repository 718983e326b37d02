"""Doors that hold, through real sockets on loopback: connection caps answered 503 or busy, the
keep-alive, a Wyoming client that never reads, a Wyoming flood that cannot fill the queue, and
alerts before normal requests.

The service runs in process (real voices, pipeline, scheduler, HTTP and Wyoming servers on free
loopback ports) on the fake MQTT connection. Clients connect from several loopback addresses
(127.0.0.2, 127.0.0.3, ...: every 127/8 address is this machine) to stand for several LAN hosts.
The synthesis slot is held where a test needs a full queue, so nothing here depends on timing.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import pytest
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.tts import Synthesize

from tests.support.fake import BASE, FakeConnection, Services, body, hold_worker
from tts_bridge import app
from tts_bridge.mqtt.client import OutgoingMessage
from tts_bridge.web.server import AudioServer
from tts_bridge.wyoming.events import encode_event
from tts_bridge.wyoming.server import WyomingServer

WAIT_S = 30.0
RESPONSE = f"{BASE}/bridge/response/say"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def connect(port: int, source: str = "127.0.0.1", rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect: the window is agreed then
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.settimeout(WAIT_S)
    sock.connect(("127.0.0.1", port))
    return sock


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.02)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_event(stream: BinaryIO) -> Event | None:
    line = stream.readline()
    if not line:
        return None
    header = json.loads(line)
    data = header.get("data") or {}
    if header.get("data_length"):
        data.update(json.loads(stream.read(header["data_length"])))
    payload = stream.read(header["payload_length"]) if header.get("payload_length") else None
    return Event(header["type"], data, payload)


def events_until_close(sock: socket.socket) -> list[Event]:
    stream = sock.makefile("rb")
    events = []
    while (event := read_event(stream)) is not None:
        events.append(event)
    return events


def say(conn: FakeConnection, request: dict[str, Any], target: str = "kitchen") -> None:
    conn.deliver(f"{BASE}/say/{target}", json.dumps(request))


def answer(conn: FakeConnection, request_id: str) -> OutgoingMessage:
    return conn.wait_for(
        lambda m: m.topic == RESPONSE and body(m)["id"] == request_id,
        WAIT_S,
        what=f"the answer to {request_id}",
    )


def servers(service: app.Service) -> tuple[AudioServer, WyomingServer]:
    audio = next(s for s in service.servers if isinstance(s, AudioServer))
    wyoming = next(s for s in service.servers if isinstance(s, WyomingServer))
    return audio, wyoming


def _service(services: Services, cap: int, per_peer: int) -> tuple[app.Service, FakeConnection]:
    return services(
        http={"max_connections": cap, "max_connections_per_peer": per_peer, "keepalive_s": 1},
        wyoming={
            "enabled": True,
            "host": "127.0.0.1",
            "port": free_port(),
            "zeroconf": False,
            "max_connections": cap,
            "max_connections_per_peer": per_peer,
            "write_timeout_s": 1,
        },
        limits={"max_queue": 8, "door_share": 0.5, "peer_share": 0.25},
        scheduler={"idle_enabled": False},
    )


@pytest.fixture
def doors(services: Services) -> tuple[app.Service, FakeConnection]:
    """Caps small enough to reach: 3 connections per door, 2 per host."""
    return _service(services, 3, 2)


@pytest.fixture
def roomy(services: Services) -> tuple[app.Service, FakeConnection]:
    """Connections enough for a flood; the queue is what holds."""
    return _service(services, 16, 4)


# -- HTTP ------------------------------------------------------------------------------------


def test_http_caps_answer_503_and_the_server_keeps_serving(
    doors: tuple[app.Service, FakeConnection],
) -> None:
    service, _ = doors
    audio, _ = servers(service)
    held = [connect(audio.port), connect(audio.port)]
    wait_until(lambda: audio.gate.open == 2, "two idle connections counted")
    # A third from the same host passes its per-peer cap.
    refused = read_all(connect(audio.port))
    assert refused.startswith(b"HTTP/1.1 503 "), refused
    assert b"Retry-After: " in refused
    assert b"http.max_connections_per_peer" in refused
    # Another host still gets in, until the total cap.
    held.append(connect(audio.port, "127.0.0.2"))
    wait_until(lambda: audio.gate.open == 3, "a third host's connection counted")
    refused = read_all(connect(audio.port, "127.0.0.3"))
    assert refused.startswith(b"HTTP/1.1 503 ") and b"http.max_connections " in refused, refused
    for sock in held:
        sock.close()
    wait_until(lambda: audio.gate.open == 0, "closed connections released")
    # Served again, without a version banner.
    sock = connect(audio.port)
    sock.sendall(b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    reply = read_all(sock)
    assert reply.startswith(b"HTTP/1.1 404 "), reply
    assert b"Server: tts_bridge\r\n" in reply
    assert b"X-Content-Type-Options: nosniff" in reply
    refusals = audio.describe()["refused"]
    assert refusals == {"http.max_connections_per_peer": 1, "http.max_connections": 1}


def test_http_idle_and_unfinished_requests_are_closed_at_the_keepalive(
    doors: tuple[app.Service, FakeConnection],
) -> None:
    service, _ = doors
    audio, _ = servers(service)
    idle = connect(audio.port)
    slow = connect(audio.port, "127.0.0.2")
    slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    assert read_all(idle) == b""
    assert read_all(slow) == b""
    wait_until(lambda: audio.gate.open == 0, "both connections released")


# -- Wyoming ---------------------------------------------------------------------------------


def test_wyoming_caps_answer_busy_and_the_server_keeps_serving(
    doors: tuple[app.Service, FakeConnection],
) -> None:
    service, _ = doors
    _, wyoming = servers(service)
    port = service.settings.wyoming.port
    held = [connect(port), connect(port)]
    wait_until(lambda: wyoming.gate.open == 2, "two connections counted")
    events = events_until_close(connect(port))
    assert [e.type for e in events] == ["error"]
    assert events[0].data["code"] == "busy"
    assert "wyoming.max_connections_per_peer" in events[0].data["text"]
    held.append(connect(port, "127.0.0.2"))
    wait_until(lambda: wyoming.gate.open == 3, "a third host's connection counted")
    events = events_until_close(connect(port, "127.0.0.3"))
    assert events[0].data["code"] == "busy" and "wyoming.max_connections " in events[0].data["text"]
    for sock in held:
        sock.close()
    wait_until(lambda: wyoming.gate.open == 0, "closed connections released")
    sock = connect(port)
    sock.sendall(encode_event(Describe().event()))
    assert read_event(sock.makefile("rb")) is not None


def test_a_wyoming_client_that_never_reads_is_dropped(
    doors: tuple[app.Service, FakeConnection],
) -> None:
    service, conn = doors
    _, wyoming = servers(service)
    port = service.settings.wyoming.port
    # Minutes of audio: far more than the kernel buffers on either side hold.
    text = " ".join(["The washing machine has finished its long cycle."] * 18)
    stalled = connect(port, rcvbuf=4096)
    stalled.sendall(encode_event(Synthesize(text=text).event()))
    wait_until(lambda: wyoming.dropped_writers == 1, "the stalled client dropped")
    wait_until(lambda: wyoming.gate.open == 0, "its connection released")
    try:  # what the kernel held, then the end: never the whole answer
        received = read_all(stalled)
    except ConnectionResetError:
        received = b""
    assert b'"audio-stop"' not in received
    # The bridge goes on answering.
    say(conn, {"text": "Still here.", "id": "after-drop"})
    assert body(answer(conn, "after-drop"))["status"] == "ok"


def test_a_wyoming_flood_cannot_fill_the_queue_and_alerts_go_first(
    roomy: tuple[app.Service, FakeConnection],
) -> None:
    service, conn = roomy
    port = service.settings.wyoming.port
    # A cache hit to come: rendered once now.
    say(conn, {"text": "The front door is open.", "id": "warm"})
    assert body(answer(conn, "warm"))["status"] == "ok"
    release = hold_worker(service)
    fast_release = threading_gate(service)
    # Two hosts, two connections each: one host's share is 2 of 8, the door's 4 of 8.
    flood = []
    for source in ("127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"):
        sock = connect(port, source)
        sock.sendall(encode_event(Synthesize(text=f"Flood from {source}.").event()))
        flood.append(sock)
    wait_until(lambda: service.pipeline.scheduler.doors().get("wyoming") == 4, "4 queued")
    # A third connection from one host passes its share; a third host, the door's.
    refused = events_until_close(_synthesize(port, "127.0.0.2", "More."))
    assert refused[-1].data["code"] == "busy" and "limits.peer_share" in refused[-1].data["text"]
    refused = events_until_close(_synthesize(port, "127.0.0.4", "More."))
    assert refused[-1].data["code"] == "busy" and "limits.door_share" in refused[-1].data["text"]
    # The house's announcements still get in: normal, alert, and a cache hit.
    say(conn, {"text": "The weather is mild today.", "id": "normal", "tier": "quality"})
    say(
        conn,
        {"text": "Smoke in the kitchen!", "id": "alert", "priority": "alert", "tier": "quality"},
    )
    say(conn, {"text": "The front door is open.", "id": "hit", "priority": "low"})
    wait_until(lambda: service.pipeline.scheduler.doors().get("mqtt") == 3, "3 MQTT queued")
    fast_release.set()
    release.set()
    answers = {rid: answer(conn, rid) for rid in ("normal", "alert", "hit")}
    for rid, message in answers.items():
        assert body(message)["status"] == "ok", (rid, body(message))
    assert body(answers["hit"])["data"]["cached"] is True
    assert body(answers["alert"])["data"]["priority"] == "alert"
    assert conn.order(answers["alert"]) < conn.order(answers["normal"])
    for sock in flood:
        events = events_until_close_or_stop(sock)
        assert "audio-stop" in [e.type for e in events]
    refusals = service.pipeline.scheduler.refusals()
    assert refusals == {"limits.peer_share": 1, "limits.door_share": 1}


def _synthesize(port: int, source: str, text: str) -> socket.socket:
    sock = connect(port, source)
    sock.sendall(encode_event(Synthesize(text=text).event()))
    return sock


def events_until_close_or_stop(sock: socket.socket) -> list[Event]:
    stream = sock.makefile("rb")
    events = []
    while (event := read_event(stream)) is not None:
        events.append(event)
        if event.type == "audio-stop":
            break
    sock.close()
    return events


def threading_gate(service: app.Service) -> threading.Event:
    """Hold the fast lane too (cache hits and fast-voice jobs run there), until set."""
    gate = threading.Event()

    def wait() -> None:
        gate.wait(WAIT_S)

    assert service.pipeline.scheduler.submit_live(wait, urgent=True)
    return gate
