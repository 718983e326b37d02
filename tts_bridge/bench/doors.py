"""The doors under attack from one host: are the house's MQTT announcements still answered?

The real bridge (a subprocess, on a private mosquitto, its HTTP and Wyoming servers on loopback)
is measured twice: cache-hit latency over MQTT at rest, then while this process holds
`--idle` idle HTTP connections, floods the Wyoming queue with uncached requests, keeps Wyoming
clients that never read their audio, and streams a megabyte of whitespace. The connections
come from several loopback addresses (127.0.0.2, ...), as from several LAN hosts. An alert
(uncached) is timed during the attack too. Reported: latency p50/p95, what was refused and
why, the bridge's open files, memory and log size.

    python -m tts_bridge.bench.doors --idle 1000
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tts_bridge.bench.localbroker import free_port
from tts_bridge.bench.scenarios import BASE, BridgeSession, bridge_session, percentile
from tts_bridge.bench.util import machine_info, table
from tts_bridge.config import Settings, load_settings
from tts_bridge.system.connections import raise_open_files_limit

_LOGGER = logging.getLogger(__name__)

DEFAULT_OUT = Path("bench/results/doors.json")
HIT = "The front door is open."
"""The announcement measured: a cache hit once warmed up."""
FLOOD_HOSTS = 8
SLOW_READERS = 30
WHITESPACE_BYTES = 1_000_000
TIMEOUT_S = 60.0


def _hosts(count: int) -> list[str]:
    return [f"127.0.0.{n}" for n in range(2, 2 + count)]


def _connect(port: int, source: str, rcvbuf: int | None = None) -> socket.socket | None:
    sock = socket.socket()
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((source, 0))
        sock.settimeout(5)
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def _event(kind: str, data: dict[str, Any]) -> bytes:
    body = json.dumps(data).encode()
    return json.dumps({"type": kind, "data_length": len(body)}).encode() + b"\n" + body


def _first_event(sock: socket.socket) -> str:
    """The type of the first event the server sends (or why there is none)."""
    try:
        line = sock.makefile("rb").readline()
    except OSError as exc:
        return type(exc).__name__
    if not line:
        return "closed"
    header = json.loads(line)
    if header["type"] != "error":
        return str(header["type"])
    return "error"


def _hit_latencies(session: BridgeSession, count: int, tag: str) -> list[float]:
    """Sequential cache-hit requests: publish to the audio's arrival, in ms."""
    latencies = []
    for n in range(count):
        request_id = f"{tag}-{n}"
        start = time.perf_counter()
        payload = json.dumps({"text": HIT, "id": request_id})
        session.client.publish(f"{BASE}/say/hall", payload, qos=1)
        arrived = session.wait(
            lambda a, r=request_id: a[1] == f"{BASE}/audio/hall" and a[2].get("id") == r,
            TIMEOUT_S,
        )
        latencies.append((arrived[0] - start) * 1000)
    return latencies


@contextmanager
def _idle_http(port: int, count: int) -> Iterator[Counter[str]]:
    """`count` idle connections spread over the hosts; yields what became of them."""
    outcome: Counter[str] = Counter()
    held: list[socket.socket] = []
    hosts = _hosts(FLOOD_HOSTS)
    try:
        for n in range(count):
            sock = _connect(port, hosts[n % len(hosts)])
            if sock is None:
                outcome["connect failed"] += 1
            else:
                held.append(sock)
        time.sleep(1.0)  # refusals are written at once
        for sock in held:
            sock.settimeout(0)
            try:
                head = sock.recv(12)
            except BlockingIOError:
                outcome["held open"] += 1
                continue
            except OSError:
                head = b""
            outcome["503" if head.startswith(b"HTTP/1.1 503") else "closed"] += 1
        yield outcome
    finally:
        for sock in held:
            sock.close()


@contextmanager
def _wyoming_attack(port: int) -> Iterator[dict[str, Counter[str]]]:
    """A queue flood, clients that never read, and a megabyte of whitespace, over Wyoming."""
    results: dict[str, Counter[str]] = {"flood": Counter(), "slow": Counter(), "spaces": Counter()}
    held: list[socket.socket] = []
    hosts = _hosts(FLOOD_HOSTS)
    lock = threading.Lock()

    def flood(n: int) -> None:
        sock = _connect(port, hosts[n % len(hosts)])
        if sock is None:
            with lock:
                results["flood"]["connect failed"] += 1
            return
        with lock:
            held.append(sock)
        sock.sendall(_event("synthesize", {"text": f"Flood request number {n} is here."}))
        sock.settimeout(TIMEOUT_S)
        first = _first_event(sock)
        with lock:
            results["flood"][first] += 1

    text = " ".join(["The washing machine has finished its long cycle."] * 18)
    for n in range(SLOW_READERS):
        sock = _connect(port, hosts[n % len(hosts)], rcvbuf=4096)
        if sock is None:
            results["slow"]["connect failed"] += 1
            continue
        sock.sendall(_event("synthesize", {"text": text}))
        held.append(sock)
        results["slow"]["sent"] += 1
    threads = [threading.Thread(target=flood, args=(n,), daemon=True) for n in range(70)]
    for thread in threads:
        thread.start()
    spaces = _connect(port, hosts[-1])
    if spaces is not None:
        held.append(spaces)
        started = time.perf_counter()
        try:
            spaces.sendall(_event("synthesize-start", {}))
            chunk = _event("synthesize-chunk", {"text": " " * 16_000})
            for _ in range(WHITESPACE_BYTES // 16_000):
                spaces.sendall(chunk)
        except OSError:
            pass  # refused and closed while sending
        spaces.settimeout(TIMEOUT_S)
        results["spaces"][_first_event(spaces)] += 1
        results["spaces"]["ms"] = round((time.perf_counter() - started) * 1000)
    try:
        yield results
    finally:
        for thread in threads:
            thread.join(TIMEOUT_S)
        for sock in held:
            sock.close()


def run_doors_bench(settings: Settings, idle: int, requests: int, out: Path) -> dict[str, Any]:
    raise_open_files_limit()  # this process holds the idle connections
    wyoming_port = free_port()
    overrides = {
        "wyoming": {
            "enabled": True,
            "host": "127.0.0.1",
            "port": wyoming_port,
            "zeroconf": False,
        },
        "scheduler": {"idle_enabled": False},
    }
    with tempfile.TemporaryDirectory(prefix="tts-bench-doors-") as tmp:
        work = Path(tmp)
        with bridge_session(settings, work, overrides) as session:
            first = json.dumps({"text": HIT, "id": "warm"})
            session.client.publish(f"{BASE}/say/hall", first, qos=1)
            answer = session.wait(
                lambda a: a[1] == f"{BASE}/bridge/response/say" and b'"warm"' in a[3], 120
            )
            http_port = int(json.loads(answer[3])["data"]["url"].split(":")[2].split("/")[0])
            at_rest = _hit_latencies(session, requests, "rest")
            with ExitStack() as attack:
                idle_outcome = attack.enter_context(_idle_http(http_port, idle))
                wyoming_outcome = attack.enter_context(_wyoming_attack(wyoming_port))
                under = _hit_latencies(session, requests, "attack")
                start = time.perf_counter()
                alert = {"text": "Smoke in the kitchen!", "id": "alert", "priority": "alert"}
                session.client.publish(f"{BASE}/say/hall", json.dumps(alert), qos=1)
                session.wait(
                    lambda a: a[1] == f"{BASE}/audio/hall" and a[2].get("id") == "alert",
                    TIMEOUT_S,
                )
                alert_ms = (time.perf_counter() - start) * 1000
                health = session.api("health_check")
            log_bytes = (work / "bridge.log").stat().st_size
    rows = [
        {
            "when": "at rest",
            "p50_ms": percentile(at_rest, 0.5),
            "p95_ms": percentile(at_rest, 0.95),
        },
        {
            "when": "under attack",
            "p50_ms": percentile(under, 0.5),
            "p95_ms": percentile(under, 0.95),
        },
    ]
    result = {
        "machine": machine_info(),
        "idle_http_connections": idle,
        "cache_hit_latency": rows,
        "alert_latency_ms": round(alert_ms, 1),
        "idle_http": dict(idle_outcome),
        "wyoming": {k: dict(v) for k, v in wyoming_outcome.items()},
        "bridge": {
            "connections": health.get("connections"),
            "open_files": health.get("open_files"),
            "busy_refusals": health.get("busy_refusals"),
            "rss_mb": health.get("rss_mb"),
            "log_bytes": log_bytes,
        },
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(table(rows, ["when", "p50_ms", "p95_ms"]))
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=None, help="the bridge's configuration")
    parser.add_argument("--idle", type=int, default=1000, help="idle HTTP connections held")
    parser.add_argument("--requests", type=int, default=50, help="cache hits timed per phase")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    settings = load_settings(args.config)
    run_doors_bench(settings, args.idle, args.requests, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
