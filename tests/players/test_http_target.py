"""The HTTP API's `target`: `POST /api/speak` to a target with media players plays on them as an
MQTT say does (the bridge in process with a real mosquitto, Home Assistant as the loopback
stub), and its JSON answer names each player's outcome; a player that is off costs the others
nothing."""

from __future__ import annotations

import io
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from tests.players.stub import TOKEN, HomeAssistantStub, Player
from tests.web.ui_browser import send, start_bridge
from tts_bridge import app
from tts_bridge.bench.localbroker import LocalBroker
from tts_bridge.web.server import AudioServer

KITCHEN = "media_player.kitchen"
HALL = "media_player.hall"
LEAD_IN_MS = 400


@pytest.fixture
def stub() -> Iterator[HomeAssistantStub]:
    ha = HomeAssistantStub(
        players={KITCHEN: Player(volume_level=0.3), HALL: Player(state="unavailable")}
    )
    ha.start()
    yield ha
    ha.stop()


@pytest.fixture
def bridge(stub: HomeAssistantStub, tmp_path: Path) -> Iterator[tuple[app.Service, int]]:
    more = {
        "targets": {
            "kitchen": {"media_players": [KITCHEN], "lead_in_ms": LEAD_IN_MS},
            "downstairs": {"media_players": [KITCHEN, HALL]},
            "porch": {"chime": "ding", "format": "flac"},
            "quiet": {"gain_db": -6.0, "format": "wav"},
        },
        "homeassistant": {"url": stub.url, "token": TOKEN},
    }
    service: app.Service
    broker: LocalBroker
    service, broker = start_bridge(tmp_path, more)
    try:
        server = next(s for s in service.servers if isinstance(s, AudioServer))
        yield service, server.port
    finally:
        service.stop()
        broker.stop()


def speak(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    status, _, answer = send(port, "POST", "/api/speak", headers, json.dumps(body).encode())
    return status, json.loads(answer)


def test_a_speak_request_with_a_target_plays_on_its_media_players(
    bridge: tuple[app.Service, int], stub: HomeAssistantStub
) -> None:
    _, port = bridge
    status, data = speak(port, {"text": "Dinner is ready", "target": "kitchen", "voice": "joe"})
    assert status == 200, data
    assert data["players"] == {KITCHEN: "ok"}
    assert data["target"] == "kitchen" and data["voice"] == "joe"
    (play,) = stub.service_calls("play_media", KITCHEN)
    assert play.data == {
        "entity_id": KITCHEN,
        "media_content_id": data["url"],
        "media_content_type": "music",
        "announce": True,
    }
    # The target's audio behind the URL, with its lead-in (the cache keeps the sentence as is).
    with urllib.request.urlopen(data["url"], timeout=10) as response:
        samples, rate = soundfile.read(io.BytesIO(response.read()), dtype="float32")
    assert int(np.argmax(np.abs(samples) > 1e-4)) >= rate * LEAD_IN_MS // 1000
    assert abs(len(samples) / rate * 1000 - data["duration_ms"]) <= 1


def test_a_player_that_is_off_costs_the_others_nothing(
    bridge: tuple[app.Service, int], stub: HomeAssistantStub
) -> None:
    _, port = bridge
    status, data = speak(port, {"text": "The post has arrived.", "target": "downstairs"})
    assert status == 200, data
    assert data["players"] == {KITCHEN: "ok", HALL: "player_unavailable"}
    assert len(stub.service_calls("play_media", KITCHEN)) == 1
    assert stub.service_calls("play_media", HALL) == []


def test_without_a_target_the_answer_is_the_audio_and_a_bad_target_is_refused(
    bridge: tuple[app.Service, int], stub: HomeAssistantStub
) -> None:
    _, port = bridge
    headers = {"Content-Type": "application/json"}
    status, got, body = send(port, "POST", "/api/speak", headers, b'{"text": "Hello."}')
    assert status == 200 and got["Content-Type"] == "audio/wav" and body[:4] == b"RIFF"
    status, data = speak(port, {"text": "Hello.", "target": "no/slashes"})
    assert status == 400 and data["error"]["code"] == "invalid_target"
    assert stub.service_calls("play_media") == []


def fetch(url: str) -> tuple[np.ndarray, int]:
    with urllib.request.urlopen(url, timeout=10) as response:
        samples, rate = soundfile.read(io.BytesIO(response.read()), dtype="int16")
    return samples, rate


def test_a_target_gives_the_http_request_its_chime_gain_and_format_as_it_does_a_say(
    bridge: tuple[app.Service, int],
) -> None:
    _, port = bridge
    text = "The back door is open."
    status, plain = speak(port, {"text": text, "target": "nowhere", "format": "wav"})
    assert status == 200, plain
    assert plain["format"] == "wav"
    # The target's chime before the words, in the target's format.
    status, porch = speak(port, {"text": text, "target": "porch"})
    assert status == 200, porch
    assert porch["format"] == "flac" and porch["url"].endswith(".flac")
    assert porch["duration_ms"] >= plain["duration_ms"] + 500, (porch, plain)
    # The request's own format wins over the target's, as in a say.
    status, named = speak(port, {"text": text, "target": "porch", "format": "wav"})
    assert status == 200 and named["format"] == "wav", named
    # The target's gain on the same samples (the cache keeps them at full scale).
    status, quiet = speak(port, {"text": text, "target": "quiet"})
    assert status == 200 and quiet["cached"] is True, quiet
    loud, rate = fetch(plain["url"])
    soft, soft_rate = fetch(quiet["url"])
    assert rate == soft_rate and loud.shape == soft.shape
    expected = np.round(loud.astype(np.float64) * 10 ** (-6 / 20))
    assert np.max(np.abs(soft - expected)) <= 1
    assert np.max(np.abs(soft)) < 0.6 * np.max(np.abs(loud))


def test_a_target_audio_is_a_file_so_pcm_is_refused(bridge: tuple[app.Service, int]) -> None:
    _, port = bridge
    status, data = speak(port, {"text": "Hello.", "target": "quiet", "format": "pcm"})
    assert status == 400 and data["error"]["code"] == "unsupported_format", data
