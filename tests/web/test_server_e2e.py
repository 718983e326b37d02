"""End-to-end: an answer's URL from the real bridge subprocess, fetched with a real HTTP client.

The bridge (its audio server on a free loopback port, see the harness) speaks through a private
mosquitto; the test reads the URL from the MQTT answer and the link message, then GETs, HEADs
and asks for a byte range as Sonos and Cast do, and decodes what it got.
"""

from __future__ import annotations

import io
import json

import pytest
import soundfile

from tests.support.harness import BridgeFactory, MqttProbe, ProbeFactory, ReceivedMessage
from tests.support.web import fetch

pytestmark = pytest.mark.slow

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
WAIT_S = 60.0
TEXT = "The washing machine has finished, and the laundry is ready to hang up."


def _answer(probe: MqttProbe, target: str, request_id: str) -> tuple[dict[str, object], bytes]:
    """Say TEXT to target; the answer's data and what came on the target's audio topic."""
    since = probe.mark()
    probe.publish(f"{BASE}/say/{target}", json.dumps({"text": TEXT, "id": request_id}))

    def answer(m: ReceivedMessage) -> bool:
        return m.topic == RESPONSE and m.json()["id"] == request_id

    response = probe.wait_for(answer, WAIT_S, since=since, what=f"the answer to {request_id}")
    body = response.json()
    assert body["status"] == "ok", body
    audio = probe.wait_for(
        lambda m: m.topic == f"{BASE}/audio/{target}" and m.user_properties["id"] == request_id,
        WAIT_S,
        since=since,
        what=f"audio for {request_id}",
    )
    return body["data"], audio.payload if audio.content_type != "application/json" else b""


def test_an_answers_url_plays_with_get_head_and_ranges(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(targets={"esp": {"payload": "url", "format": "mp3"}})
    probe = probe_factory(RESPONSE, f"{BASE}/audio/#")
    probe.diagnostics = bridge.log_tail

    # A plain target: WAV bytes on its topic as before, and a URL in the answer.
    data, wav = _answer(probe, "kitchen", "k1")
    assert soundfile.info(io.BytesIO(wav)).format == "WAV"
    url = str(data["url"])
    status, headers, whole = fetch(url)
    assert status == 200, bridge.log_tail()
    assert headers["Content-Type"] == "audio/mpeg"
    assert headers["Accept-Ranges"] == "bytes"
    assert int(headers["Content-Length"]) == len(whole)
    audio, rate = soundfile.read(io.BytesIO(whole), always_2d=True)
    assert (rate, audio.shape[1]) == (44100, 1)
    assert abs(audio.shape[0] / rate * 1000 - float(str(data["duration_ms"]))) <= 1

    status, headers, body = fetch(url, "HEAD")
    assert (status, body) == (200, b"")
    assert int(headers["Content-Length"]) == len(whole)
    assert headers["Content-Type"] == "audio/mpeg"

    status, headers, body = fetch(url, headers={"Range": "bytes=100-1099"})
    assert status == 206
    assert body == whole[100:1100]
    assert headers["Content-Range"] == f"bytes 100-1099/{len(whole)}"

    # The repeat is a cache hit with the same URL.
    again, _ = _answer(probe, "kitchen", "k2")
    assert again["cached"] is True and again["url"] == url

    # A target that fetches gets a small link message on its topic (an MQTT 5 JSON message).
    since = probe.mark()
    data, _ = _answer(probe, "esp", "e1")
    link = probe.wait_for(
        lambda m: m.topic == f"{BASE}/audio/esp", WAIT_S, since=since, what="the link message"
    )
    assert link.content_type == "application/json"
    assert link.user_properties["format"] == "mp3"
    message = link.json()
    assert message["url"] == data["url"] and message["id"] == "e1"
    assert len(link.payload) < 1024
    status, _, body = fetch(message["url"])
    assert status == 200
    assert soundfile.info(io.BytesIO(body)).format == "MP3"
    assert bridge.running
