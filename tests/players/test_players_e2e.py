"""End-to-end: the real bridge and a real mosquitto, Home Assistant as a loopback stub.

A say request to a target with media players plays the answer's URL on them with announce, at
the target's volume, with the player's own volume back afterwards; the target's WAV has its
lead-in while the cache keeps the sentence as it was; the answer names each player's outcome;
with Home Assistant away the audio and the URL still go out; the token shows nowhere.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.players.stub import TOKEN, HomeAssistantStub, Player
from tests.support.answers import parse_wav
from tests.support.harness import BridgeFactory, MqttProbe, ProbeFactory, ReceivedMessage

pytestmark = pytest.mark.slow

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
KITCHEN = "media_player.kitchen"
WAIT_S = 60.0
LEAD_IN_MS = 400


@pytest.fixture
def stub() -> Iterator[HomeAssistantStub]:
    ha = HomeAssistantStub(players={KITCHEN: Player(volume_level=0.3)})
    ha.start()
    yield ha
    ha.stop()


def say(probe: MqttProbe, target: str, text: str) -> tuple[dict[str, Any], ReceivedMessage]:
    since = probe.mark()
    probe.publish(f"{BASE}/say/{target}", text)
    response = probe.wait_for(lambda m: m.topic == RESPONSE, WAIT_S, since=since).json()
    audio = probe.wait_for(lambda m: m.topic == f"{BASE}/audio/{target}", WAIT_S, since=since)
    return response, audio


def leading_silence(samples: npt.NDArray[np.float32]) -> int:
    return int(np.argmax(np.abs(samples) > 1e-4))


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read()).decode("utf-8", errors="replace")


def test_dinner_is_ready_on_the_kitchen_media_player(
    stub: HomeAssistantStub, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(
        targets={"kitchen": {"media_players": [KITCHEN], "volume": 0.5, "lead_in_ms": LEAD_IN_MS}},
        homeassistant={"url": stub.url, "token": TOKEN},
        scheduler={"health_interval_s": 1},
    )
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail

    response, audio = say(probe, "kitchen", "Dinner is ready")
    assert response["status"] == "ok", response
    data = response["data"]
    assert data["players"] == {KITCHEN: "ok"}, bridge.log_tail()
    (play,) = stub.service_calls("play_media", KITCHEN)
    assert play.data == {
        "entity_id": KITCHEN,
        "media_content_id": data["url"],
        "media_content_type": "music",
        "announce": True,
    }
    volumes = stub.wait_for("volume_set", KITCHEN, count=2, timeout_s=WAIT_S)
    assert [c.data["volume_level"] for c in volumes] == [0.5, 0.3]
    assert volumes[0].at <= play.at <= volumes[1].at
    assert volumes[1].at - play.at >= data["duration_ms"] / 1000
    assert stub.players[KITCHEN].volume_level == 0.3

    # The same sentence to a target without a lead-in: the cache's audio, as it was.
    plain, plain_audio = say(probe, "plain", "Dinner is ready")
    assert plain["data"]["cached"] is True and "players" not in plain["data"]
    wav, cached = parse_wav(audio.payload), parse_wav(plain_audio.payload)
    lead = wav.sample_rate * LEAD_IN_MS // 1000
    assert len(wav.samples) - len(cached.samples) == lead
    assert leading_silence(wav.samples) - leading_silence(cached.samples) == lead
    np.testing.assert_array_equal(wav.samples[lead:], cached.samples)
    assert data["duration_ms"] - plain["data"]["duration_ms"] == LEAD_IN_MS

    # Home Assistant away: the players say so, the WAV and the URL still go out.
    stub.stop()
    away, away_audio = say(probe, "kitchen", "The bus is late")
    assert away["status"] == "ok", away
    assert away["data"]["players"] == {KITCHEN: "homeassistant_unreachable"}
    assert away["data"]["url"].startswith("http://127.0.0.1:")
    assert parse_wav(away_audio.payload).duration_s > LEAD_IN_MS / 1000

    # The token is in no message, page or log line of the bridge.
    base_url = data["url"].split("/audio/")[0]
    pages = [fetch(base_url + "/"), fetch(base_url + "/metrics")]
    seen = [m.payload.decode("utf-8", errors="replace") for m in probe.messages]
    for topic in ("info", "health"):
        assert any(m.topic == f"{BASE}/bridge/{topic}" for m in probe.messages), topic
    bridge.stop()
    log = bridge.log_path.read_text(encoding="utf-8", errors="replace")
    assert "playing on media_player.kitchen" in log, "the log was read"
    for where, text in [("pages", "\n".join(pages)), ("mqtt", "\n".join(seen)), ("log", log)]:
        assert TOKEN not in text, f"the token is in the {where}"
