"""Benchmark scenarios through a real broker and the real bridge process:

- routing: a burst of distinct live requests, with tier routing on (the default budget) and off
  (an unreachable budget): p50/p95 latency and the tier mix; then the time the idle thread takes
  to upgrade the fast answers to quality;
- streaming: time to first audio for a five-sentence announcement, streamed per sentence vs one
  WAV at the end.

Latency is measured at an MQTT subscriber, from publish to the audio's arrival.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tts_bridge.config import Settings

BASE = "bench_tts"
UPGRADE_WAIT_S = 300.0
"""How long the routing scenario waits for the idle thread to upgrade the fast answers."""
_BURST_TEXTS = [
    "The {n} washing machine has finished its cycle. Please empty it soon.",
    "Reminder number {n}: the recycling goes out tonight. Do not forget the glass.",
    "Door sensor {n} reports the garage door is open. It has been open for ten minutes.",
    "Good evening. Room {n} is at twenty one degrees and the windows are closed.",
]


class BridgeSession:
    """A private mosquitto, a bridge subprocess and a subscriber recording arrival times."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.arrivals: list[tuple[float, str, dict[str, str], bytes]] = []

    def record(self, topic: str, props: dict[str, str], payload: bytes) -> None:
        with self.lock:
            self.arrivals.append((time.perf_counter(), topic, props, payload))

    def wait(self, predicate: Any, timeout: float) -> tuple[float, str, dict[str, str], bytes]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for item in self.arrivals:
                    if predicate(item):
                        return item
            time.sleep(0.002)
        raise TimeoutError("no matching message")

    def api(self, name: str) -> dict[str, Any]:
        marker = f"{name}-{time.monotonic()}"
        self.client.publish(
            f"{BASE}/bridge/request/{name}", json.dumps({"transaction": marker}), qos=1
        )
        item = self.wait(
            lambda a: (
                a[1] == f"{BASE}/bridge/response/{name}"
                and json.loads(a[3]).get("transaction") == marker
            ),
            60,
        )
        data: dict[str, Any] = json.loads(item[3])["data"]
        return data


@contextmanager
def bridge_session(
    settings: Settings, workdir: Path, overrides: dict[str, Any]
) -> Iterator[BridgeSession]:
    from tts_bridge.bench.localbroker import LocalBroker
    from tts_bridge.bench.util import start_bridge
    from tts_bridge.mqtt.client import new_client

    with LocalBroker(workdir / "broker", extra_config=["set_tcp_nodelay true"]) as broker:
        log = (workdir / "bridge.log").open("w")
        bridge = start_bridge(
            settings,
            host=broker.host,
            port=broker.port,
            base=BASE,
            workdir=workdir,
            log=log,
            overrides=overrides,
        )
        client = new_client()
        session = BridgeSession(client)

        def on_message(c: Any, u: Any, msg: Any) -> None:
            props = dict(getattr(msg.properties, "UserProperty", None) or [])
            session.record(msg.topic, props, bytes(msg.payload))

        client.on_message = on_message
        client.connect(broker.host, broker.port)
        client.subscribe([(f"{BASE}/#", 1)])
        client.loop_start()
        try:
            session.wait(lambda a: a[1].endswith("/bridge/state") and b"online" in a[3], 60)
            yield session
        finally:
            client.loop_stop()
            client.disconnect()
            bridge.terminate()
            bridge.wait(30)
            log.close()


def _warm_up(session: BridgeSession) -> None:
    """Load both tiers' models first: the scenarios measure serving, not loading."""
    for tier in ("quality", "fast"):
        payload = json.dumps({"text": "Warm up.", "id": f"warm-{tier}", "tier": tier})
        session.client.publish(f"{BASE}/say/warm", payload, qos=1)
        session.wait(lambda a, t=tier: a[1] == f"{BASE}/audio/warm" and a[2].get("tier") == t, 120)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 1)


def _burst(session: BridgeSession, count: int, tag: str) -> dict[str, Any]:
    sent: dict[str, float] = {}
    for n in range(count):
        request_id = f"{tag}-{n}"
        text = _BURST_TEXTS[n % len(_BURST_TEXTS)].format(n=f"{tag} {n}")
        sent[request_id] = time.perf_counter()
        session.client.publish(
            f"{BASE}/say/burst", json.dumps({"text": text, "id": request_id}), qos=1
        )
    latencies: list[float] = []
    fast: list[float] = []  # the fast tier's answers: they should not wait for quality jobs
    tiers: Counter[str] = Counter()
    last = 0.0
    for request_id, started in sent.items():
        arrived, _, props, _ = session.wait(
            lambda a, r=request_id: a[1] == f"{BASE}/audio/burst" and a[2].get("id") == r, 300
        )
        latencies.append((arrived - started) * 1000)
        tier = props.get("tier", "?")
        tiers[tier] += 1
        if tier == "fast":
            fast.append(latencies[-1])
        last = max(last, arrived)
    return {
        "requests": count,
        "p50_ms": percentile(latencies, 0.5),
        "p95_ms": percentile(latencies, 0.95),
        "max_ms": round(max(latencies), 1),
        "fast_p50_ms": percentile(fast, 0.5) if fast else None,
        "fast_max_ms": round(max(fast), 1) if fast else None,
        "tiers": dict(tiers),
        "last_answer": last,
    }


def measure_routing(settings: Settings, count: int = 12) -> list[dict[str, Any]]:
    rows = []
    for label, budget in (("routing on", settings.scheduler.latency_budget_ms), ("off", 600_000)):
        with tempfile.TemporaryDirectory(prefix="tts-bench-route-") as tmp:
            # idle_max_load off: on a shared machine other programs would hold idle work back,
            # and this measures how fast the upgrade runs, not when the neighbours go quiet.
            overrides = {
                "scheduler": {"latency_budget_ms": budget, "idle_delay_s": 2.0, "idle_max_load": 64}
            }
            with bridge_session(settings, Path(tmp), overrides) as session:
                _warm_up(session)
                row = _burst(session, count, label.split()[-1])
                last = row.pop("last_answer")
                upgrade_s = None
                if row["tiers"].get("fast"):
                    deadline = time.monotonic() + UPGRADE_WAIT_S
                    while True:  # until the idle thread has rendered every fast answer
                        health = session.api("health_check")
                        if health["background_pending"] == 0 and not health["background_running"]:
                            break
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"upgrades not done in {UPGRADE_WAIT_S} s: {health}")
                        time.sleep(0.2)
                    upgrade_s = round(time.perf_counter() - last, 1)
                rows.append({"routing": label, "budget_ms": budget, **row, "upgraded_s": upgrade_s})
    return rows


def measure_fast_lane(settings: Settings) -> dict[str, Any]:
    """A fast-tier request sent while a long quality job runs: its latency against the quality
    job's (the fast lane answers it beside the running job instead of after it)."""
    long_text = " ".join(
        f"Sentence number {n} of a long announcement about the heating schedule." for n in range(12)
    )
    fast_ms: list[float] = []
    quality_ms: list[float] = []
    no_idle = {"scheduler": {"idle_enabled": False}}
    with (
        tempfile.TemporaryDirectory(prefix="tts-bench-lane-") as tmp,
        bridge_session(settings, Path(tmp), no_idle) as session,
    ):
        _warm_up(session)
        for n in range(3):
            ids = {"quality": f"long-{n}", "fast": f"quick-{n}"}
            started = time.perf_counter()
            long_request = {"text": long_text, "id": ids["quality"], "cache": False}
            long_request["tier"] = "quality"
            session.client.publish(f"{BASE}/say/lane", json.dumps(long_request), qos=1)
            time.sleep(0.1)  # the long job is running by now
            sent_fast = time.perf_counter()
            quick = {"text": f"The door bell rang {n}.", "id": ids["fast"], "tier": "fast"}
            session.client.publish(f"{BASE}/say/lane", json.dumps({**quick, "cache": False}), qos=1)
            for tier, since, out in (
                ("fast", sent_fast, fast_ms),
                ("quality", started, quality_ms),
            ):
                arrived, _, _, _ = session.wait(
                    lambda a, r=ids[tier]: a[1] == f"{BASE}/audio/lane" and a[2].get("id") == r,
                    300,
                )
                out.append((arrived - since) * 1000)
    return {
        "quality_job_ms": percentile(quality_ms, 0.5),
        "fast_meanwhile_p50_ms": percentile(fast_ms, 0.5),
        "fast_meanwhile_max_ms": round(max(fast_ms), 1),
    }


def measure_streaming(settings: Settings) -> list[dict[str, Any]]:
    text = " ".join(
        f"This is sentence number {n} of a longer announcement about the house." for n in range(5)
    )
    rows = []
    no_idle = {"scheduler": {"idle_enabled": False}}
    with (
        tempfile.TemporaryDirectory(prefix="tts-bench-stream-") as tmp,
        bridge_session(settings, Path(tmp), no_idle) as session,
    ):
        session.client.publish(f"{BASE}/say/warm", "Warm up.", qos=1)
        session.wait(lambda a: a[1] == f"{BASE}/audio/warm", 120)
        for stream in (False, True, False, True):
            request_id = f"s-{stream}-{time.monotonic()}"
            payload = {"text": text, "id": request_id, "stream": stream, "cache": False}
            started = time.perf_counter()
            session.client.publish(f"{BASE}/say/hall", json.dumps(payload), qos=1)
            topic = f"{BASE}/audio/hall" + ("/stream" if stream else "")
            first, _, _, _ = session.wait(
                lambda a, r=request_id, t=topic: a[1] == t and a[2].get("id") == r, 120
            )
            done, _, _, _ = session.wait(
                lambda a, r=request_id: (
                    a[1] == f"{BASE}/bridge/response/say" and json.loads(a[3])["id"] == r
                ),
                120,
            )
            rows.append(
                {
                    "stream": stream,
                    "sentences": 5,
                    "first_audio_ms": round((first - started) * 1000, 1),
                    "all_done_ms": round((done - started) * 1000, 1),
                }
            )
    # Keep the second (warm) measurement of each mode.
    return [rows[2], rows[3]]
