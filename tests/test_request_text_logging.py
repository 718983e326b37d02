"""What the owner's words leave in the log: through every door (MQTT say, Hermes, HTTP
/api/speak, Wyoming) and the idle work (a learned phrase, a pre-render), no record at INFO or
above holds the request's text; at DEBUG (`--debug`) each door names it, shortened.

The service runs in process (real voices, pipeline, scheduler, HTTP and Wyoming servers on free
loopback ports) on the fake MQTT connection; the records are the real ones its loggers make.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
from typing import Any

import pytest
from wyoming.tts import Synthesize

from tests.support.fake import BASE, FakeConnection, Services, body
from tts_bridge import app
from tts_bridge.textlog import short
from tts_bridge.web.server import AudioServer
from tts_bridge.wyoming.events import encode_event

WAIT_S = 60.0
RESPONSE = f"{BASE}/bridge/response/say"
# One sentence per door (none is a cache hit of another), each with the word looked for.
TEXTS = {
    "mqtt": "Call Mr Quokka now.",
    "hermes": "The Quokka family is at the gate.",
    "http": "Quokka marmalade is in the fridge.",
    "wyoming": "The washing machine of Mrs Quokka has finished.",
    "prerender": "Quokka reminder: the bins go out tonight.",
    "long": "Quokka " + "and a very long announcement about the garden " * 3 + "ends here.",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _say(conn: FakeConnection, request: dict[str, Any]) -> dict[str, Any]:
    since = conn.mark()
    conn.deliver(f"{BASE}/say/kitchen", json.dumps(request))
    answer = conn.wait_for(
        lambda m: m.topic == RESPONSE and body(m)["id"] == request["id"],
        WAIT_S,
        since=since,
        what=f"the answer to {request['id']}",
    )
    data: dict[str, Any] = body(answer)
    return data


def _http_speak(service: app.Service, text: str) -> int:
    port = next(s for s in service.servers if isinstance(s, AudioServer)).port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        payload = json.dumps({"text": text, "voice": "joe"})
        conn.request(
            "POST", "/api/speak", body=payload, headers={"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _wyoming_synthesize(port: int, text: str) -> list[str]:
    """The event types the server answers with, up to audio-stop (or an error)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(encode_event(Synthesize(text=text).event()))
        stream = sock.makefile("rb")
        kinds: list[str] = []
        while line := stream.readline():
            header = json.loads(line)
            for key in ("data_length", "payload_length"):
                if header.get(key):
                    stream.read(header[key])
            kinds.append(header["type"])
            if header["type"] in {"audio-stop", "error"}:
                break
        return kinds


def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {WAIT_S:.0f} s"
        time.sleep(0.05)


def test_request_text_is_logged_at_debug_only(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    wyoming_port = _free_port()
    service, conn = services(
        hermes={"enabled": True},
        wyoming={"enabled": True, "host": "127.0.0.1", "port": wyoming_port, "zeroconf": False},
        # A sentence asked twice is learned; idle work starts at once, whatever the machine's load.
        scheduler={"learn_min_count": 2, "idle_delay_s": 0, "idle_max_load": 1000},
    )
    with caplog.at_level(logging.DEBUG):
        for n in range(2):  # the second one makes it a learned phrase
            answer = _say(conn, {"text": TEXTS["mqtt"], "id": f"m{n}", "voice": "joe"})
            assert answer["status"] == "ok", answer
        refused = _say(conn, {"text": TEXTS["mqtt"], "id": "bad", "voice": "nobody"})
        assert refused["status"] == "error", refused
        answer = _say(conn, {"text": TEXTS["long"], "id": "long", "voice": "joe"})
        assert answer["status"] == "ok", answer

        since = conn.mark()
        say = {"text": TEXTS["hermes"], "siteId": "porch", "id": "h1"}
        conn.deliver("hermes/tts/say", json.dumps(say))
        conn.wait_for(lambda m: m.topic == "hermes/audioServer/porch/playBytes/h1", since=since)

        assert _http_speak(service, TEXTS["http"]) == 200
        assert _wyoming_synthesize(wyoming_port, TEXTS["wyoming"])[-1] == "audio-stop"

        service.api.control.prerender({"phrases": [TEXTS["prerender"]], "voice": "joe"})
        _wait(lambda: service.pipeline.idle.done["prerender"] >= 1, "the pre-render")

    records = [r for r in caplog.records if r.name.startswith("tts_bridge")]
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    # Not by the bridge nor by any library at the usual level (Piper's own debug line names the
    # text it phonemizes: a debug log is the owner's choice).
    leaked = [
        f"{r.levelname} {r.name}: {r.getMessage()}" for r in loud if "Quokka" in r.getMessage()
    ]
    assert not leaked
    info = [r.getMessage() for r in loud if r.name.startswith("tts_bridge")]
    # The INFO lines still say which request, where, in which voice and how long it was.
    size = f"{len(TEXTS['mqtt'])} characters"
    assert f"Request m0 for kitchen: joe, {size}, 1 sentence(s)" in info, info
    assert any(line.startswith("Learned a phrase for joe: " + size) for line in info), info
    assert any(line.startswith("Hermes request h1 for site porch: ") for line in info), info
    assert any(
        "HTTP speech request" in line and " characters, 1 sentence(s)" in line for line in info
    )
    wyoming = f"{len(TEXTS['wyoming'])} characters"
    assert any(line.startswith("Wyoming request from") and wyoming in line for line in info), info
    assert any(line.startswith("Idle: prerender of a sentence") for line in info), info
    assert any(line.startswith("Request bad for kitchen refused (unknown_voice)") for line in info)

    # At DEBUG each door names the text, shortened to one line of 60 characters at most.
    debug = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    for door in ("mqtt", "hermes", "http", "wyoming", "prerender", "long"):
        assert any(short(TEXTS[door]) in line for line in debug), door
    assert len(short(TEXTS["long"])) <= 62 and not any(TEXTS["long"] in line for line in debug)
