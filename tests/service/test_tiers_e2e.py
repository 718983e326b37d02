"""Tier routing, idle upgrades, pre-rendering and backpressure through a real broker and bridge."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.harness import (
    BridgeFactory,
    MqttProbe,
    ProbeFactory,
    ReceivedMessage,
    bridge_api,
)

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
WAIT_S = 60.0
IDLE_FAST = {"idle_delay_s": 0.2, "idle_max_load": 1000.0}

pytestmark = pytest.mark.slow


def ask(probe: MqttProbe, payload: dict[str, Any], target: str = "tiers") -> dict[str, Any]:
    since = probe.mark()
    probe.publish(f"{BASE}/say/{target}", json.dumps(payload))

    def is_answer(m: ReceivedMessage) -> bool:
        return m.topic == RESPONSE and m.json()["id"] == payload["id"]

    body: dict[str, Any] = probe.wait_for(is_answer, WAIT_S, since=since).json()
    return body


def api(probe: MqttProbe, name: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    return bridge_api(probe, name, payload, timeout=WAIT_S, base=BASE)


def health_until(
    probe: MqttProbe, done: Callable[[dict[str, Any]], bool], timeout: float = WAIT_S
) -> dict[str, Any]:
    """Poll bridge/request/health_check until `done(data)` holds (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        data: dict[str, Any] = api(probe, "health_check")["data"]
        if done(data) or time.monotonic() > deadline:
            return data
        time.sleep(0.3)


def test_tiny_budget_goes_fast_then_upgrades_at_idle(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(scheduler={"latency_budget_ms": 1, **IDLE_FAST})
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    texts = ["The garage door is open.", "The dryer has finished. Please empty it."]
    for i, text in enumerate(texts):
        first = ask(probe, {"text": text, "id": f"live-{i}"})
        assert first["status"] == "ok", first
        assert first["data"]["tier"] == "fast", first
        assert (first["data"]["voice"], first["data"]["engine"]) == ("heart", "hibari")
        assert first["data"]["requested_voice"] == "joe"
    health = health_until(probe, lambda d: d["background_done"]["upgrade"] >= 3)
    assert health["background_done"]["upgrade"] == 3, health
    assert health["background_pending"] == 0, health
    assert health["answers"]["fast"] == 2, health
    for i, text in enumerate(texts):
        again = ask(probe, {"text": text, "id": f"again-{i}"})
        assert again["data"]["tier"] == "quality", again
        assert again["data"]["cached"] is True, again
        assert (again["data"]["voice"], again["data"]["engine"]) == ("joe", "piper")


def test_huge_budget_keeps_quality_and_forced_tiers_are_honoured(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(scheduler={"latency_budget_ms": 600_000, "idle_enabled": False})
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    for i in range(3):
        body = ask(probe, {"text": f"Quality answer number {i}.", "id": f"q{i}"})
        assert body["data"]["tier"] == "quality", body
        assert body["data"]["engine"] == "piper", body
    forced_fast = ask(probe, {"text": "Forced to be fast.", "id": "ff", "tier": "fast"})
    assert (forced_fast["data"]["tier"], forced_fast["data"]["engine"]) == ("fast", "hibari")
    tight = ask(
        probe,
        {"text": "Forced quality.", "id": "fq", "tier": "quality", "latency_budget_ms": 1},
    )
    assert (tight["data"]["tier"], tight["data"]["engine"]) == ("quality", "piper")
    per_request = ask(probe, {"text": "Tight budget here.", "id": "pb", "latency_budget_ms": 1})
    assert per_request["data"]["tier"] == "fast", per_request
    bad = ask(probe, {"text": "x", "id": "bt", "tier": "medium"})
    assert (bad["status"], bad["code"]) == ("error", "invalid_request"), bad


def test_prerender_runs_at_idle_and_live_requests_go_first(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(scheduler=IDLE_FAST)
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    phrases = [f"Background phrase number {i} is being rendered now." for i in range(30)]
    queued = api(probe, "prerender", {"phrases": phrases})
    assert queued["status"] == "ok", queued
    assert queued["data"]["queued_sentences"] == 30
    health_until(probe, lambda d: d["background_done"]["prerender"] >= 2)
    live = ask(probe, {"text": "A live announcement jumps the queue.", "id": "live"})
    assert live["status"] == "ok" and live["data"]["cached"] is False
    after = api(probe, "health_check")["data"]
    # The live answer came long before the 30 background sentences were done.
    assert after["background_done"]["prerender"] < 30, after
    final = health_until(probe, lambda d: d["background_done"]["prerender"] >= 30, 120)
    assert final["background_done"]["prerender"] == 30, final
    cached = ask(probe, {"text": phrases[7], "id": "hit"})
    assert cached["data"]["cached"] is True and cached["data"]["tier"] == "quality", cached
    bad = api(probe, "prerender", {"phrases": 5})
    assert (bad["status"], bad["code"]) == ("error", "invalid_request"), bad
    unknown = api(probe, "prerender", {"phrases": ["Hi."], "voice": "nobody"})
    assert (unknown["status"], unknown["code"]) == ("error", "unknown_voice"), unknown


def test_configured_and_learned_phrases_are_prerendered(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(
        phrases=["Dinner is ready.", "The front door is open."],
        scheduler={**IDLE_FAST, "learn_min_count": 2, "latency_budget_ms": 1},
    )
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    health_until(probe, lambda d: d["background_done"]["phrase"] >= 2)
    hit = ask(probe, {"text": "Dinner is ready.", "id": "p1"})
    assert hit["data"]["cached"] is True and hit["data"]["tier"] == "quality", hit
    # Asked twice with no cache use: answered fast (budget 1 ms) and learned as a phrase.
    for i in range(2):
        body = ask(probe, {"text": "The mail has arrived.", "id": f"l{i}", "cache": False})
        assert body["data"]["tier"] == "fast", body
    health = health_until(probe, lambda d: d["background_done"]["learned"] >= 1)
    assert health["background_done"]["learned"] == 1, health
    learned = ask(probe, {"text": "The mail has arrived.", "id": "l-hit"})
    assert learned["data"]["cached"] is True and learned["data"]["tier"] == "quality", learned


def test_full_queue_answers_busy_and_nothing_is_dropped(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(
        limits={"max_queue": 2}, scheduler={"idle_enabled": False, "latency_budget_ms": 600_000}
    )
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    since = probe.mark()
    text = "This sentence is long enough to keep the synthesis thread busy for a while, twice."
    ids = [f"flood-{i}" for i in range(20)]
    for request_id in ids:
        probe.publish(
            f"{BASE}/say/flood", json.dumps({"text": text, "id": request_id, "cache": False})
        )

    def all_answered(m: ReceivedMessage) -> bool:
        answered = {r.json()["id"] for r in probe.messages[since:] if r.topic == RESPONSE}
        return set(ids) <= answered

    probe.wait_for(all_answered, 120, since=since, what="an answer for every request")
    answers = [m.json() for m in probe.messages[since:] if m.topic == RESPONSE]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for body in answers:
        by_id.setdefault(body["id"], []).append(body)
    assert all(len(v) == 1 for v in by_id.values()), "exactly one answer per request"
    busy = [b for b in answers if b["status"] == "error"]
    ok = [b for b in answers if b["status"] == "ok"]
    assert busy and ok, answers
    assert all(b["code"] == "busy" for b in busy), busy
    assert len(busy) + len(ok) == 20
