"""Home Assistant through a real broker and the real bridge process: the default voice chosen in
the select survives a restart, every say answer is an event (a refused one too), and the
discovery payload declares the event entity and the enum tier sensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.harness import BridgeFactory, ProbeFactory, ReceivedMessage, bridge_api

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
EVENT = f"{BASE}/bridge/event"
INFO = f"{BASE}/bridge/info"
DISCOVERY = "homeassistant/device/tts_bridge/config"
WAIT_S = 60.0
QUIET = {"idle_enabled": False}

pytestmark = pytest.mark.slow


def _live_info(message: ReceivedMessage) -> bool:
    # A fresh bridge's own info, not the retained one a stopped bridge left on the broker.
    return message.topic == INFO and not message.retain


def test_the_default_voice_survives_a_restart(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory, tmp_path: Path
) -> None:
    bridge = bridge_factory(scheduler=QUIET)
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    answer = bridge_api(probe, "default_voice", {"voice": "heart"}, timeout=WAIT_S)
    assert answer["status"] == "ok", answer
    assert answer["data"] == {"default_voice": "heart", "saved": True}
    assert bridge.stop() == 0
    # In the state folder: the folder of journal.path.
    saved = json.loads((tmp_path / "preferences.json").read_text(encoding="utf-8"))
    assert saved["default_voice"] == "heart"

    watcher = probe_factory(INFO)
    restarted = bridge_factory(scheduler=QUIET)
    watcher.diagnostics = restarted.log_tail
    info = watcher.wait_for(_live_info, WAIT_S, what="the restarted bridge's info").json()
    assert info["default_voice"] == "heart"
    # And it is the voice a request without one gets.
    since = probe.mark()
    probe.publish(f"{BASE}/say/kitchen", json.dumps({"text": "Good evening.", "id": "eve"}))
    spoken = probe.wait_for(lambda m: m.topic == RESPONSE, WAIT_S, since=since).json()
    assert spoken["status"] == "ok", spoken
    assert spoken["data"]["requested_voice"] == "heart" and spoken["data"]["voice"] == "heart"
    assert restarted.stop() == 0

    # The saved voice is no longer configured: a warning, and the configured default applies.
    watcher.clear()
    only_joe = bridge_factory(
        voices={"joe": {"engine": "piper"}}, default_voice="joe", scheduler=QUIET
    )
    watcher.diagnostics = only_joe.log_tail
    info = watcher.wait_for(_live_info, WAIT_S, what="the info without heart").json()
    assert info["default_voice"] == "joe" and set(info["voices"]) == {"joe"}
    assert "no longer configured" in only_joe.log_tail(400)


def test_every_answer_is_an_event_and_discovery_declares_it(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(homeassistant={"targets": ["kitchen"]}, scheduler=QUIET)
    probe = probe_factory(f"{BASE}/#", "homeassistant/#")
    probe.diagnostics = bridge.log_tail
    config = probe.wait_for(lambda m: m.topic == DISCOVERY and m.retain, WAIT_S).json()
    components = config["cmps"]
    events = [c for c in components.values() if c["p"] == "event"]
    assert len(events) == 1
    assert events[0]["stat_t"] == EVENT and events[0]["evt_typ"] == ["ok", "error"]
    tier = components["tier_in_use"]
    assert tier["dev_cla"] == "enum" and tier["ops"] == ["quality", "fast"]
    health = probe.wait_for(lambda m: m.topic == f"{BASE}/bridge/health", WAIT_S).json()
    assert health["tier_in_use"] in tier["ops"]

    # Only emoji, as Home Assistant's notify sends it: refused, and the refusal is an event.
    since = probe.mark()
    probe.publish(f"{BASE}/say/kitchen", json.dumps({"text": "🎉🍲", "id": "party"}))
    refused = probe.wait_for(lambda m: m.topic == EVENT, WAIT_S, since=since, what="the event")
    assert not refused.retain  # Home Assistant would drop a retained event
    answer = probe.wait_for(lambda m: m.topic == RESPONSE, WAIT_S, since=since).json()
    assert answer["status"] == "error" and answer["code"] == "nothing_speakable"
    assert refused.json() == {
        "event_type": "error",
        "id": "party",
        "target": "kitchen",
        "code": "nothing_speakable",
        "error": answer["error"],
        "voice": None,
        "tier": None,
        "duration_ms": None,
        "url": None,
    }

    # A spoken announcement is an ok event with what was spoken.
    since = probe.mark()
    probe.publish(f"{BASE}/say/kitchen", json.dumps({"text": "Dinner is ready.", "id": "dinner"}))
    ok = probe.wait_for(lambda m: m.topic == EVENT, WAIT_S, since=since, what="the event").json()
    answer = probe.wait_for(lambda m: m.topic == RESPONSE, WAIT_S, since=since).json()
    assert answer["status"] == "ok", answer
    assert ok == {
        "event_type": "ok",
        "id": "dinner",
        "target": "kitchen",
        "code": None,
        "error": None,
        "voice": answer["data"]["voice"],
        "tier": answer["data"]["tier"],
        "duration_ms": answer["data"]["duration_ms"],
        "url": answer["data"]["url"],  # the bridge's HTTP server is on
    }
    assert ok["duration_ms"] > 0 and ok["tier"] in tier["ops"]
