"""Faults against a real mosquitto and bridge subprocesses: a journal on a full filesystem, a
poison request, a confused-deputy response topic, an ACL that denies an audio topic.

The same wiring in process (every refusal code, the health fields) is in test_faults.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fullfs import small_tmpfs
from tests.support.harness import (
    BridgeFactory,
    MqttProbe,
    ProbeFactory,
    bridge_api,
    request_properties,
)
from tts_bridge.bench.localbroker import LocalBroker
from tts_bridge.mqtt.journal import DEFAULT_MAX_ATTEMPTS, Journal, request_key

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
CACHE_CLEAR = f"{BASE}/bridge/request/cache/clear"
WAIT_S = 60.0

pytestmark = pytest.mark.slow


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A broker whose ACL lets anonymous clients do anything but touch the audio topic of
    target ``denied``."""
    acl = tmp_path / "acl"
    acl.write_text(f"topic readwrite #\ntopic deny {BASE}/audio/denied\n", encoding="utf-8")
    local = LocalBroker(tmp_path / "broker", extra_config=[f"acl_file {acl}"])
    local.start()
    try:
        yield local
    finally:
        local.stop()


def say(probe: MqttProbe, request_id: str, text: str, target: str = "faults", **kw: Any) -> None:
    probe.publish(f"{BASE}/say/{target}", json.dumps({"text": text, "id": request_id}), **kw)


def answers(probe: MqttProbe, ids: list[str], since: int) -> dict[str, dict[str, Any]]:
    """The one answer of each id (waits for all; fails on a second answer for one)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        found: dict[str, list[dict[str, Any]]] = {}
        for message in probe.messages[since:]:
            if message.topic == RESPONSE and message.json().get("id") in ids:
                found.setdefault(message.json()["id"], []).append(message.json())
        if len(found) == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    missing = sorted(set(ids) - set(found))
    log = probe.diagnostics() if probe.diagnostics else ""
    assert not missing, f"no answer for {missing}\n{log}"
    twice = {k: v for k, v in found.items() if len(v) > 1}
    assert not twice, f"answered more than once: {twice}"
    return {k: v[0] for k, v in found.items()}


def test_a_journal_on_a_full_filesystem_answers_every_request_and_recovers(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory, tmp_path: Path
) -> None:
    with small_tmpfs(tmp_path / "journalfs", "1m") as fs:
        bridge = bridge_factory(
            journal={"path": str(fs.root / "journal.sqlite3")}, scheduler={"idle_enabled": False}
        )
        probe = probe_factory(f"{BASE}/#")
        probe.diagnostics = bridge.log_tail
        fs.fill()
        since = probe.mark()
        full = [f"full-{n}" for n in range(25)]
        for request_id in full:
            say(probe, request_id, f"Announcement {request_id}.")
        assert all(a["status"] == "ok" for a in answers(probe, full, since).values())
        health = bridge_api(probe, "health_check", timeout=WAIT_S)["data"]
        assert health["journal_degraded"] == "disk full", health
        fs.free()
        since = probe.mark()
        back = [f"back-{n}" for n in range(5)]
        for request_id in back:
            say(probe, request_id, f"Space is back for {request_id}.")
        assert all(a["status"] == "ok" for a in answers(probe, back, since).values())
        health = bridge_api(probe, "health_check", timeout=WAIT_S)["data"]
        assert health["journal_degraded"] is None, health
        assert bridge.running
        log = bridge.log_path.read_text(encoding="utf-8")
        assert "disk full" in log and "writable again" in log
        assert "Cannot journal request" not in log
        bridge.stop()


def test_a_poison_request_is_retired_and_the_next_one_served(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory, tmp_path: Path
) -> None:
    path = tmp_path / "journal.sqlite3"
    payload = json.dumps({"text": "I stop the bridge every time.", "id": "poison"}).encode()
    with Journal(path) as journal:
        accepted = journal.accept(
            request_key(f"{BASE}/say/attic", payload, request_id="poison"),
            f"{BASE}/say/attic",
            payload,
            response_topic=None,
            correlation_data=None,
            received_at=time.time(),
            dedupe=True,
        )
        # Three starts that began its synthesis and died in it (the out-of-memory killer, say).
        for _ in range(DEFAULT_MAX_ATTEMPTS):
            journal.started(accepted.entry_id)
    probe = probe_factory(f"{BASE}/#")
    bridge = bridge_factory()
    probe.diagnostics = bridge.log_tail
    [error] = answers(probe, ["poison"], 0).values()
    assert (error["status"], error["code"]) == ("error", "poison_request"), error
    assert not probe.find(lambda m: m.topic == f"{BASE}/audio/attic")
    since = probe.mark()
    say(probe, "next", "The one after it.", "attic")
    assert answers(probe, ["next"], since)["next"]["status"] == "ok"
    bridge.stop()
    # Retired for good: a restart does not answer it again.
    since = probe.mark()
    bridge = bridge_factory()
    say(probe, "later", "Later.", "attic")
    answers(probe, ["later"], since)
    assert not [m for m in probe.messages[since:] if m.topic == RESPONSE and "poison" in str(m)]


def test_a_response_topic_aimed_at_cache_clear_does_not_clear_the_cache(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(scheduler={"idle_enabled": False})
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    since = probe.mark()
    say(probe, "warm", "Keep this sentence cached.")
    answers(probe, ["warm"], since)
    entries = bridge_api(probe, "cache/stats", timeout=WAIT_S)["data"]["entries"]
    assert entries >= 1
    since = probe.mark()
    aimed = request_properties(response_topic=CACHE_CLEAR, correlation_data=b"x")
    say(probe, "deputy", "Hello.", properties=aimed)  # a valid request
    probe.publish(f"{BASE}/say/faults", b"\xff not text", properties=aimed)  # and a refusal
    [answer] = answers(probe, ["deputy"], since).values()
    assert answer["code"] == "invalid_response_topic", answer
    probe.wait_for(
        lambda m: m.topic == RESPONSE and m.json()["code"] == "invalid_utf8", since=since
    )
    time.sleep(0.5)  # anything published to the request topic would have arrived by now
    assert not [m for m in probe.messages[since:] if m.topic == CACHE_CLEAR]
    assert not probe.find(lambda m: m.topic == f"{BASE}/bridge/response/cache/clear", since=since)
    assert bridge_api(probe, "cache/stats", timeout=WAIT_S)["data"]["entries"] == entries


def test_an_acl_denied_audio_topic_answers_not_authorized(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(scheduler={"idle_enabled": False})
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    since = probe.mark()
    denied = [f"denied-{n}" for n in range(3)]
    for request_id in denied:
        say(probe, request_id, "This goes nowhere.", "denied")
    say(probe, "allowed", "This is heard.", "kitchen")
    found = answers(probe, [*denied, "allowed"], since)
    for request_id in denied:
        assert found[request_id]["code"] == "not_authorized", found[request_id]
        assert "Not authorized" in found[request_id]["error"]
    assert found["allowed"]["status"] == "ok"
    health = bridge_api(probe, "health_check", timeout=WAIT_S)["data"]
    assert health["publish_refusals"].get("Not authorized") == 3, health
    assert health["answers_not_authorized"] == 3, health
    log = bridge.log_path.read_text(encoding="utf-8")
    assert f"refused a publish to {BASE}/audio/denied" in log
