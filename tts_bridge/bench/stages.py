"""Where a request's time goes, per door: the bridge's own stage breakdown.

The whole service runs in this process (a private mosquitto, the Wyoming and HTTP servers on
loopback), so the stages each request recorded (`Metrics.recent_stages`: queue, cache read,
front end, engine, loudness, first audio handed to the door, first byte written, encoding, cache
write) are read next to the first byte the client saw. Each door speaks announcements new to
the cache (uncached), then the same again (cached). The bridge's own cost is the first byte
minus the engine's time.

    tts-bridge bench --stages
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tts_bridge.bench.http_api import first_byte_s
from tts_bridge.bench.localbroker import LocalBroker, free_port
from tts_bridge.bench.util import machine_info, table
from tts_bridge.bench.wyoming import ANNOUNCEMENTS, WARM_UP, first_and_last_s, first_chunk_s
from tts_bridge.config import Settings
from tts_bridge.speech.metrics import REQUEST_STAGES, Metrics

DEFAULT_OUT = Path("bench/results/stages.json")
BASE = "stagesbench"
VOICE = "joe"
TIMEOUT_S = 120.0
DOORS = ("mqtt", "wyoming", "http")
LONG_SENTENCES = (
    (
        "joe",
        "When you leave this morning, please remember that the kitchen window is still open, "
        "the heating is on, and the dog needs its dinner tonight.",
    ),
    ("xiaobei", "今天下午三点，客厅的窗户还开着，暖气也没有关，请记得出门之前检查一下所有的门窗。"),
)
"""A 25-word English sentence and a 40-character Chinese one: first audio against the end."""


class _MqttClient:
    """Says a text on the bench's target and times its first audio message."""

    def __init__(self, host: str, port: int) -> None:
        from tts_bridge.mqtt.client import new_client

        self._arrived = threading.Event()
        self._answered = threading.Event()
        self._client = new_client()
        self._client.on_message = self._on_message
        self._client.connect(host, port)
        self._client.subscribe(
            [
                (f"{BASE}/audio/bench", 1),
                (f"{BASE}/audio/bench/stream", 1),
                (f"{BASE}/bridge/response/say", 1),
            ]
        )
        self._client.loop_start()
        time.sleep(0.5)  # the subscription in place before the first request (not timed)

    def _on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        if message.topic.endswith("/bridge/response/say"):
            self._answered.set()
        else:
            self._arrived.set()

    def first_byte_s(self, text: str, stream: bool) -> float:
        """Seconds from publishing the request to its first audio message; then the answer
        (read to its end, so the next request finds the bridge idle)."""
        self._arrived.clear()
        self._answered.clear()
        payload = json.dumps({"text": text, "voice": VOICE, "stream": stream})
        started = time.perf_counter()
        self._client.publish(f"{BASE}/say/bench", payload, qos=0)
        if not self._arrived.wait(TIMEOUT_S):
            raise RuntimeError(f"no audio for {text!r}")
        elapsed = time.perf_counter() - started
        if not self._answered.wait(TIMEOUT_S):
            raise RuntimeError(f"no answer for {text!r}")
        return elapsed

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


@dataclass(frozen=True)
class Bridge:
    """The bridge running in this process, and where to reach it."""

    metrics: Metrics
    broker: tuple[str, int]
    wyoming_port: int
    http_port: int


@contextlib.contextmanager
def bridge_service(settings: Settings, work: Path) -> Iterator[Bridge]:
    """The whole bridge in this process on a private broker, with metrics of its own."""
    from tts_bridge import app
    from tts_bridge.web.server import AudioServer

    with LocalBroker(work / "broker", extra_config=["set_tcp_nodelay true"]) as broker:
        wyoming_port = free_port()
        bench_settings = settings.model_copy(
            update={
                "mqtt": settings.mqtt.model_copy(
                    update={
                        "host": broker.host,
                        "port": broker.port,
                        "base_topic": BASE,
                        "client_id": "stagesbench",
                    }
                ),
                "cache": settings.cache.model_copy(update={"dir": work / "cache"}),
                "journal": settings.journal.model_copy(update={"path": work / "journal.sqlite3"}),
                "wyoming": settings.wyoming.model_copy(
                    update={
                        "enabled": True,
                        "host": "127.0.0.1",
                        "port": wyoming_port,
                        "zeroconf": False,
                    }
                ),
                "http": settings.http.model_copy(update={"host": "127.0.0.1", "port": 0}),
                "homeassistant": settings.homeassistant.model_copy(update={"discovery": False}),
                "scheduler": settings.scheduler.model_copy(update={"idle_enabled": False}),
            }
        )
        metrics = Metrics()
        service = app.build(bench_settings, metrics=metrics)
        service.start()
        try:
            http_port = next(s for s in service.servers if isinstance(s, AudioServer)).port
            yield Bridge(metrics, (broker.host, broker.port), wyoming_port, http_port)
        finally:
            service.stop()


def _timed(
    metrics: Metrics, door: str, ask: Callable[[str], float], texts: list[str]
) -> list[dict[str, float]]:
    """Each text asked once: the client's first byte and the stages the bridge recorded."""
    records = []
    for text in texts:
        client_s = ask(text)
        time.sleep(0.05)  # the worker's record is complete once the answer is
        door_records = [r for d, r in metrics.recent_stages() if d == door]
        record = dict(door_records[-1]) if door_records else {}
        record["client_first_byte"] = client_s
        records.append(record)
    return records


def long_sentences(port: int) -> list[dict[str, Any]]:
    """Each long sentence streamed over Wyoming, uncached (warmed up on another text)."""
    rows = []
    for voice, text in LONG_SENTENCES:
        warm_up = "好的。" if voice == "xiaobei" else WARM_UP
        asyncio.run(first_and_last_s(port, warm_up, voice=voice, streaming=True))
        first, last = asyncio.run(first_and_last_s(port, text, voice=voice, streaming=True))
        rows.append(
            {
                "voice": voice,
                "chars": len(text),
                "words": len(text.split()),
                "first_audio_ms": round(first * 1000, 1),
                "finished_ms": round(last * 1000, 1),
                "sooner": round(last / first, 2),
            }
        )
    return rows


def _summary(door: str, cache: str, records: list[dict[str, float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"door": door, "cache": cache, "n": len(records)}
    for stage in (*REQUEST_STAGES, "client_first_byte"):
        values = [r[stage] for r in records if stage in r]
        row[stage] = round(statistics.median(values) * 1000, 2) if values else None
    # The bridge's own cost: what its first byte took beyond the engine's work for it.
    own = [
        r["first_byte"] - r.get("engine_first", r.get("engine", 0.0))
        for r in records
        if "first_byte" in r
    ]
    row["own_cost"] = round(statistics.median(own) * 1000, 2) if own else None
    return row


def run_stages_bench(settings: Settings, out: Path | None) -> dict[str, Any]:
    """Every door, uncached then cached; printed and written to `out`."""
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="tts-bridge-stages-bench-") as tmp,
        bridge_service(settings, Path(tmp)) as bridge,
    ):
        mqtt = _MqttClient(*bridge.broker)
        try:
            asks: dict[str, Callable[[str], float]] = {
                "mqtt": lambda text: mqtt.first_byte_s(text, stream=True),
                "wyoming": lambda text: asyncio.run(
                    first_chunk_s(bridge.wyoming_port, text, voice=VOICE, streaming=True)
                ),
                # Streamed PCM: the first byte of audio after the header.
                "http": lambda text: first_byte_s(bridge.http_port, text, VOICE, "pcm"),
            }
            asks["wyoming"](WARM_UP)  # the model loaded before anything is timed
            for door in DOORS:
                texts = [f"{t[:-1]}, by {door}." for t in ANNOUNCEMENTS]
                for cache in ("uncached", "cached"):  # the same texts again: from the cache
                    records = _timed(bridge.metrics, door, asks[door], texts)
                    rows.append(_summary(door, cache, records))
            long = long_sentences(bridge.wyoming_port)
        finally:
            mqtt.close()
    report: dict[str, Any] = {
        "machine": machine_info(),
        "voice": VOICE,
        "rows": rows,
        "long_sentences": long,
    }
    columns = ["door", "cache", "n", *REQUEST_STAGES, "client_first_byte", "own_cost"]
    print("milliseconds, median per request (spans: queue ... cache_write; points: first_*)")
    print(table(rows, columns))
    print("long sentences streamed over Wyoming (uncached): first audio against the last")
    print(table(long, ["voice", "chars", "words", "first_audio_ms", "finished_ms", "sooner"]))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report
