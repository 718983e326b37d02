"""Home Assistant discovery, Rhasspy Hermes, streaming, the bridge API and the player, through a
real broker and the real bridge process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import soundfile

from tests.support.harness import BridgeFactory, MqttProbe, ProbeFactory

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
DISCOVERY = "homeassistant/device/tts_bridge/config"
WAIT_S = 60.0

pytestmark = pytest.mark.slow


def api(probe: MqttProbe, name: str, payload: bytes | str = b"") -> dict[str, Any]:
    since = probe.mark()
    probe.publish(f"{BASE}/bridge/request/{name}", payload)
    answer = probe.wait_for(
        lambda m: (
            m.topic.startswith(f"{BASE}/bridge/response/")
            and m.topic not in {RESPONSE, f"{BASE}/bridge/response/health"}
        ),
        WAIT_S,
        since=since,
        what=f"the answer to {name}",
    )
    body: dict[str, Any] = answer.json()
    body["_topic"] = answer.topic
    return body


def test_home_assistant_discovery(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(homeassistant={"targets": ["kitchen", "hall"]})
    probe = probe_factory("homeassistant/#", f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    config = probe.wait_for(lambda m: m.topic == DISCOVERY and m.retain, WAIT_S).json()
    assert config["dev"]["name"] == "TTS Bridge" and config["o"]["name"] == "tts_bridge"
    components = config["cmps"]
    notify = {k: v for k, v in components.items() if v["p"] == "notify"}
    assert {v["cmd_t"] for v in notify.values()} == {f"{BASE}/say/kitchen", f"{BASE}/say/hall"}
    ids = [v["uniq_id"] for v in components.values()]
    assert len(ids) == len(set(ids))
    platforms = sorted(v["p"] for v in components.values())
    assert platforms.count("sensor") >= 4 and "select" in platforms
    # The notify command template's output is what the bridge receives: it must be spoken.
    since = probe.mark()
    probe.publish(f"{BASE}/say/kitchen", json.dumps({"text": 'He said "hi" \\ bye'}))
    ok = probe.wait_for(lambda m: m.topic == RESPONSE, WAIT_S, since=since).json()
    assert ok["status"] == "ok", ok
    # Home Assistant restarts: its birth message makes the bridge publish discovery again.
    since = probe.mark()
    probe.publish("homeassistant/status", "online")
    again = probe.wait_for(lambda m: m.topic == DISCOVERY, WAIT_S, since=since).json()
    assert again == config
    # The select changes the default voice; info follows.
    since = probe.mark()
    probe.publish(f"{BASE}/bridge/request/default_voice", json.dumps({"voice": "heart"}))
    info = probe.wait_for(
        lambda m: m.topic == f"{BASE}/bridge/info" and m.json()["default_voice"] == "heart",
        WAIT_S,
        since=since,
    ).json()
    assert info["default_voice"] == "heart"
    bridge.stop()
    # Turned off: the retained config is removed with an empty payload.
    bridge_factory(homeassistant={"discovery": False})
    watcher = probe_factory("homeassistant/#")
    time.sleep(1.0)
    assert not [m for m in watcher.messages if m.topic == DISCOVERY and m.payload]


def test_hermes_round_trip(bridge_factory: BridgeFactory, probe_factory: ProbeFactory) -> None:
    bridge = bridge_factory(hermes={"enabled": True, "finish_margin_s": 0.5})
    probe = probe_factory("hermes/#")
    probe.diagnostics = bridge.log_tail
    say = {"text": "Turning on the lights.", "siteId": "livingroom", "id": "h1", "sessionId": "s1"}
    probe.publish("hermes/tts/say", json.dumps(say))
    played = probe.wait_for(
        lambda m: m.topic == "hermes/audioServer/livingroom/playBytes/h1", WAIT_S
    )
    assert played.payload[:4] == b"RIFF"
    time.sleep(0.3)
    assert not probe.find(lambda m: m.topic == "hermes/tts/sayFinished")
    probe.publish("hermes/audioServer/livingroom/playFinished", json.dumps({"id": "h1"}))
    finished = probe.wait_for(lambda m: m.topic == "hermes/tts/sayFinished", WAIT_S).json()
    assert (finished["id"], finished["siteId"], finished["sessionId"]) == ("h1", "livingroom", "s1")
    # No playFinished: sayFinished after the audio's duration plus the margin.
    since = probe.mark()
    started = time.monotonic()
    probe.publish(
        "hermes/tts/say", json.dumps({"text": "Good night.", "siteId": "bed", "id": "h2"})
    )
    probe.wait_for(lambda m: m.topic == "hermes/audioServer/bed/playBytes/h2", WAIT_S, since=since)
    done = probe.wait_for(
        lambda m: m.topic == "hermes/tts/sayFinished" and m.json()["id"] == "h2",
        WAIT_S,
        since=since,
    )
    assert time.monotonic() - started > 0.5 and done.json()["siteId"] == "bed"
    # Bad input: an error on hermes/error/tts, and the bridge keeps serving.
    since = probe.mark()
    probe.publish("hermes/tts/say", b"{not json")
    error = probe.wait_for(lambda m: m.topic == "hermes/error/tts", WAIT_S, since=since).json()
    assert error["error"]
    probe.publish("hermes/tts/say", json.dumps({"text": "🎉", "siteId": "bed", "id": "h3"}))
    error = probe.wait_for(
        lambda m: m.topic == "hermes/error/tts" and m.json().get("context") == "h3",
        WAIT_S,
        since=since,
    ).json()
    assert error["siteId"] == "bed"
    probe.publish(
        "hermes/tts/say", json.dumps({"text": "Still here.", "siteId": "bed", "id": "h4"})
    )
    probe.wait_for(lambda m: m.topic == "hermes/audioServer/bed/playBytes/h4", WAIT_S, since=since)


def test_streaming_sends_each_sentence_in_order(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(scheduler={"idle_enabled": False})
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    text = " ".join(f"This is sentence number {n} of the announcement." for n in range(1, 7))
    since = probe.mark()
    probe.publish(
        f"{BASE}/say/hall", json.dumps({"text": text, "id": "s1", "stream": True, "cache": False})
    )
    answer = probe.wait_for(lambda m: m.topic == RESPONSE, WAIT_S, since=since).json()
    assert answer["status"] == "ok" and answer["data"]["stream"] is True
    chunks = [m for m in probe.messages[since:] if m.topic == f"{BASE}/audio/hall/stream"]
    assert [c.user_properties["seq"] for c in chunks] == [str(i) for i in range(6)]
    assert [c.user_properties["last"] for c in chunks] == ["false"] * 5 + ["true"]
    assert all(c.user_properties["id"] == "s1" and c.payload[:4] == b"RIFF" for c in chunks)
    assert not [m for m in probe.messages[since:] if m.topic == f"{BASE}/audio/hall"]
    # Each sentence went out when it was ready, not all at the end: the first chunk arrived
    # well before the last one (six Piper sentences take about a second here).
    spread = chunks[-1].received_at - chunks[0].received_at
    assert spread > 0.2, f"chunks arrived within {spread:.3f} s: not streamed"


def test_bridge_api(bridge_factory: BridgeFactory, probe_factory: ProbeFactory) -> None:
    bridge = bridge_factory(scheduler={"idle_enabled": False})
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    health = api(probe, "health_check", json.dumps({"transaction": 17}))
    assert health["status"] == "ok" and health["transaction"] == 17
    assert health["data"]["healthy"] is True and "queue_depth" in health["data"]
    voices = api(probe, "voices")
    assert set(voices["data"]) == {"joe", "heart"}
    since = probe.mark()
    probe.publish(f"{BASE}/say/api", "Fill the cache.")
    probe.wait_for(lambda m: m.topic == RESPONSE, WAIT_S, since=since)
    stats = api(probe, "cache/stats", json.dumps({"transaction": "a"}))
    assert stats["data"]["entries"] == 1 and stats["transaction"] == "a"
    cleared = api(probe, "cache/clear")
    assert cleared["status"] == "ok" and cleared["_topic"] == f"{BASE}/bridge/response/cache/clear"
    assert api(probe, "cache/stats")["data"]["entries"] == 0
    queued = api(probe, "prerender", json.dumps({"phrases": ["One. Two."], "transaction": 1}))
    assert queued["data"]["queued_sentences"] == 2
    unknown = api(probe, "reboot_the_house", json.dumps({"transaction": "x"}))
    assert unknown["status"] == "error" and unknown["transaction"] == "x"
    assert unknown["code"] == "unknown_request" and "health_check" in unknown["error"]
    bad = api(probe, "cache/stats", b"{oops")
    assert bad["status"] == "error" and bad["code"] == "invalid_json"
    periodic = probe.find(lambda m: m.topic == f"{BASE}/bridge/health")
    assert periodic is not None and "tier_in_use" in periodic.json()


def test_player_writes_what_arrives(
    tmp_path: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory()
    out = tmp_path / "played"
    config = bridge.config_path
    player = subprocess.Popen(
        [
            *(sys.executable, "-m", "tts_bridge", "play", "--config", str(config)),
            *("--target", "porch", "--out", str(out), "--count", "1"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    probe = probe_factory(f"{BASE}/#")
    deadline = time.monotonic() + WAIT_S
    while not out.exists() and time.monotonic() < deadline:  # the player made its folder
        time.sleep(0.1)
    time.sleep(0.5)
    probe.publish(f"{BASE}/say/porch", json.dumps({"text": "Someone is at the door.", "id": "p1"}))
    output, _ = player.communicate(timeout=WAIT_S)
    assert player.returncode == 0, output
    (wav,) = out.glob("*.wav")
    assert "p1" in wav.name
    audio, rate = soundfile.read(wav)
    assert rate == 22050 and 0.8 < len(audio) / rate < 4
