"""The Activity page lists every door's requests: a say over a real mosquitto, a Wyoming
synthesize over loopback TCP and a refused say arrive on the page's event stream and in the
page, with door, voice, tier and status, never the text."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from tests.web.ui_browser import UiBridge, send, ui_bridge
from tts_bridge.bench.localbroker import free_port

WAIT_S = 30.0


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiBridge]:
    wyoming = {"enabled": True, "host": "127.0.0.1", "port": free_port(), "zeroconf": False}
    yield from ui_bridge(tmp_path_factory.mktemp("activity"), {"wyoming": wyoming}, ui="on")


def _say_over_mqtt(bridge: UiBridge, target: str, payload: dict[str, Any]) -> None:
    command = [
        "mosquitto_pub",
        "-h", bridge.broker.host,
        "-p", str(bridge.broker.port),
        "-t", f"tts_bridge/say/{target}",
        "-m", json.dumps(payload),
        "-q", "1",
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=WAIT_S)


async def _synthesize(port: int, text: str) -> None:
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    try:
        await client.write_event(Synthesize(text=text).event())
        while (event := await asyncio.wait_for(client.read_event(), WAIT_S)) is not None:
            if event.type in ("audio-stop", "error"):
                return
    finally:
        await client.disconnect()


def _events(stream: http.client.HTTPResponse, wanted: int) -> list[dict[str, Any]]:
    """The stream's next `wanted` request events."""
    seen = ""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + WAIT_S  # state events keep coming: a missing one is a hang
    while len(found) < wanted:
        assert time.monotonic() < deadline, f"no request event in {WAIT_S} s"
        chunk = stream.read1(4096).decode()
        assert chunk, "the stream ended"
        seen += chunk
        *whole, seen = seen.split("\n\n")
        for message in whole:
            if message.startswith("event: request\n"):
                found.append(json.loads(message.split("data: ", 1)[1]))
    return found


def test_every_doors_requests_are_on_the_activity_page(bridge: UiBridge) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", bridge.port, timeout=WAIT_S)
    try:
        conn.request("GET", "/ui/events")
        stream = conn.getresponse()
        assert stream.status == 200
        secret = "Quince marmalade"
        _say_over_mqtt(bridge, "kitchen", {"text": f"{secret} is ready.", "voice": "joe"})
        by_mqtt = _events(stream, 1)[0]
        wyoming_port = bridge.service.settings.wyoming.port
        asyncio.run(_synthesize(wyoming_port, f"{secret} is in the pantry."))
        by_wyoming = _events(stream, 1)[0]
        _say_over_mqtt(bridge, "kitchen", {"text": "Hello.", "voice": "nobody"})
        refused = _events(stream, 1)[0]
    finally:
        conn.close()

    assert by_mqtt["door"] == "mqtt" and by_mqtt["status"] == "ok", by_mqtt
    assert by_mqtt["voice"] == "joe" and by_mqtt["tier"] in ("quality", "fast")
    assert by_mqtt["latency_ms"] > 0
    default = bridge.service.pipeline.voices().default_voice
    assert by_wyoming["door"] == "wyoming" and by_wyoming["status"] == "ok", by_wyoming
    assert by_wyoming["voice"] == default and by_wyoming["latency_ms"] > 0
    assert refused["door"] == "mqtt" and refused["status"] == "unknown_voice", refused

    status, _, page = send(bridge.port, "GET", "/activity")
    assert status == 200
    rows = page.decode().split('<tbody id="recent">', 1)[1].split("</tbody>", 1)[0]
    cells = [row.split("</td><td>") for row in rows.split("</tr>") if row]
    assert [c[1] for c in cells[:3]] == ["mqtt", "wyoming", "mqtt"]  # newest first
    assert "unknown_voice" in cells[0][-1] and "ok" in cells[1][-1]
    assert secret not in page.decode()
