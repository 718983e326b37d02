"""Tier routing, idle upgrades, pre-rendering and backpressure, in process: the real service
(real voices, cache, scheduler and idle thread) on a fake connection."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.fake import BASE, FakeConnection, Services, body, hold_worker
from tts_bridge.app import Service

RESPONSE = f"{BASE}/bridge/response/say"
WAIT_S = 60.0
IDLE_FAST = {"idle_delay_s": 0.2, "idle_max_load": 1000.0}


def ask(conn: FakeConnection, payload: dict[str, Any], target: str = "tiers") -> dict[str, Any]:
    since = conn.mark()
    conn.deliver(f"{BASE}/say/{target}", json.dumps(payload))
    found: dict[str, Any] = body(
        conn.wait_for(
            lambda m: m.topic == RESPONSE and body(m)["id"] == payload["id"],
            WAIT_S,
            since=since,
            what=f"the answer to {payload['id']}",
        )
    )
    return found


def api(conn: FakeConnection, name: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    since = conn.mark()
    conn.deliver(f"{BASE}/bridge/request/{name}", json.dumps(payload or {}))
    found: dict[str, Any] = body(
        conn.wait_for(lambda m: m.topic == f"{BASE}/bridge/response/{name}", WAIT_S, since=since)
    )
    return found


def health_until(
    service: Service, done: Callable[[dict[str, Any]], bool], timeout: float = WAIT_S
) -> dict[str, Any]:
    """Poll the health report until `done(data)` holds (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        data = service.reports.health()
        if done(data) or time.monotonic() > deadline:
            return data
        time.sleep(0.05)


def test_tiny_budget_goes_fast_then_upgrades_at_idle(services: Services) -> None:
    service, conn = services(scheduler={"latency_budget_ms": 1, **IDLE_FAST})
    texts = ["The garage door is open.", "The dryer has finished. Please empty it."]
    for i, text in enumerate(texts):
        first = ask(conn, {"text": text, "id": f"live-{i}"})
        assert first["status"] == "ok", first
        assert first["data"]["tier"] == "fast", first
        assert (first["data"]["voice"], first["data"]["engine"]) == ("heart", "hibari")
        assert first["data"]["requested_voice"] == "joe"
    health = health_until(service, lambda d: d["background_done"]["upgrade"] >= 3)
    assert health["background_done"]["upgrade"] == 3, health
    assert health["background_pending"] == 0, health
    assert health["answers"]["fast"] == 2, health
    assert health["last_tier"] == "fast" and health["last_latency_ms"] is not None, health
    for i, text in enumerate(texts):
        again = ask(conn, {"text": text, "id": f"again-{i}"})
        assert again["data"]["tier"] == "quality", again
        assert again["data"]["cached"] is True, again
        assert (again["data"]["voice"], again["data"]["engine"]) == ("joe", "piper")


def test_huge_budget_keeps_quality_and_forced_tiers_are_honoured(services: Services) -> None:
    _, conn = services(scheduler={"latency_budget_ms": 600_000, "idle_enabled": False})
    for i in range(3):
        answer = ask(conn, {"text": f"Quality answer number {i}.", "id": f"q{i}"})
        assert answer["data"]["tier"] == "quality", answer
        assert answer["data"]["engine"] == "piper", answer
    forced_fast = ask(conn, {"text": "Forced to be fast.", "id": "ff", "tier": "fast"})
    assert (forced_fast["data"]["tier"], forced_fast["data"]["engine"]) == ("fast", "hibari")
    tight = ask(
        conn,
        {"text": "Forced quality.", "id": "fq", "tier": "quality", "latency_budget_ms": 1},
    )
    assert (tight["data"]["tier"], tight["data"]["engine"]) == ("quality", "piper")
    per_request = ask(conn, {"text": "Tight budget here.", "id": "pb", "latency_budget_ms": 1})
    assert per_request["data"]["tier"] == "fast", per_request
    bad = ask(conn, {"text": "x", "id": "bt", "tier": "medium"})
    assert (bad["status"], bad["code"]) == ("error", "invalid_request"), bad


@pytest.mark.slow  # a dozen sentences rendered at idle priority
def test_prerender_runs_at_idle_and_live_requests_go_first(services: Services) -> None:
    service, conn = services(scheduler=IDLE_FAST)
    # Enough that many are still waiting when the live request comes (after the second).
    count = 12
    phrases = [f"Background phrase number {i} is being rendered now." for i in range(count)]
    queued = api(conn, "prerender", {"phrases": phrases})
    assert queued["status"] == "ok", queued
    assert queued["data"]["queued_sentences"] == count
    health_until(service, lambda d: d["background_done"]["prerender"] >= 2)
    live = ask(conn, {"text": "A live announcement jumps the queue.", "id": "live"})
    assert live["status"] == "ok" and live["data"]["cached"] is False
    after = service.reports.health()
    # The live answer came long before the background sentences were all done.
    assert after["background_done"]["prerender"] < count, after
    final = health_until(service, lambda d: d["background_done"]["prerender"] >= count, 120)
    assert final["background_done"]["prerender"] == count, final
    cached = ask(conn, {"text": phrases[7], "id": "hit"})
    assert cached["data"]["cached"] is True and cached["data"]["tier"] == "quality", cached
    bad = api(conn, "prerender", {"phrases": 5})
    assert (bad["status"], bad["code"]) == ("error", "invalid_request"), bad
    unknown = api(conn, "prerender", {"phrases": ["Hi."], "voice": "nobody"})
    assert (unknown["status"], unknown["code"]) == ("error", "unknown_voice"), unknown


def test_configured_and_learned_phrases_are_prerendered(services: Services) -> None:
    service, conn = services(
        phrases=["Dinner is ready.", "The front door is open."],
        scheduler={**IDLE_FAST, "learn_min_count": 2, "latency_budget_ms": 1},
    )
    health_until(service, lambda d: d["background_done"]["phrase"] >= 2)
    hit = ask(conn, {"text": "Dinner is ready.", "id": "p1"})
    assert hit["data"]["cached"] is True and hit["data"]["tier"] == "quality", hit
    # Asked twice with no cache use: answered fast (budget 1 ms) and learned as a phrase.
    for i in range(2):
        answer = ask(conn, {"text": "The mail has arrived.", "id": f"l{i}", "cache": False})
        assert answer["data"]["tier"] == "fast", answer
    health = health_until(service, lambda d: d["background_done"]["learned"] >= 1)
    assert health["background_done"]["learned"] == 1, health
    learned = ask(conn, {"text": "The mail has arrived.", "id": "l-hit"})
    assert learned["data"]["cached"] is True and learned["data"]["tier"] == "quality", learned


def test_full_queue_answers_busy_and_nothing_is_dropped(services: Services) -> None:
    service, conn = services(
        limits={"max_queue": 2}, scheduler={"idle_enabled": False, "latency_budget_ms": 600_000}
    )
    gate = hold_worker(service)
    since = conn.mark()
    text = "This sentence is long enough to keep the synthesis thread busy for a while, twice."
    ids = [f"flood-{i}" for i in range(20)]
    try:
        for request_id in ids:
            conn.deliver(
                f"{BASE}/say/flood", json.dumps({"text": text, "id": request_id, "cache": False})
            )
    finally:
        gate.set()

    def all_answered(_: Any) -> bool:
        answered = {body(r)["id"] for r in conn.on(RESPONSE, since)}
        return set(ids) <= answered

    conn.wait_for(all_answered, 120, since=since, what="an answer for every request")
    answers = [body(m) for m in conn.on(RESPONSE, since)]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for answer in answers:
        by_id.setdefault(answer["id"], []).append(answer)
    assert all(len(v) == 1 for v in by_id.values()), "exactly one answer per request"
    busy = [b for b in answers if b["status"] == "error"]
    ok = [b for b in answers if b["status"] == "ok"]
    assert busy and ok, answers
    assert all(b["code"] == "busy" for b in busy), busy
    assert len(busy) + len(ok) == 20
    assert all(b["error"] for b in busy), busy
