"""Time to the first byte of the HTTP speech API (``POST /v1/audio/speech``), new text and cached.

The bridge's pipeline and HTTP server run in this process on a loopback port with a fresh cache;
a plain HTTP client asks for each announcement once (new to the cache) and then again (a hit).
The clock runs from sending the request to reading the first byte of the body: for a streamed
format (wav) that is the first sentence's audio; for a whole one (mp3) the encoded answer. A
warm-up request first, so no figure includes a model load.

    tts-bridge bench --http
"""

from __future__ import annotations

import contextlib
import http.client
import json
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tts_bridge.bench.util import machine_info, table
from tts_bridge.bench.wyoming import ANNOUNCEMENTS, WARM_UP
from tts_bridge.config import Settings

READ_TIMEOUT_S = 120.0


def first_byte_s(port: int, text: str, voice: str, fmt: str) -> float:
    """Seconds from sending the request to the body's first byte (the rest is read too)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=READ_TIMEOUT_S)
    body = json.dumps({"model": "tts-1-hd", "voice": voice, "input": text, "response_format": fmt})
    try:
        started = time.perf_counter()
        conn.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:200]!r}")
        response.read(1)
        elapsed = time.perf_counter() - started
        response.read()
        return elapsed
    finally:
        conn.close()


@contextlib.contextmanager
def http_api_server(settings: Settings) -> Iterator[int]:
    """The bridge's pipeline and HTTP server with the speech API on a loopback port."""
    from tts_bridge.app import build_pipeline, build_synthesizer
    from tts_bridge.web.api_keys import ApiKeys
    from tts_bridge.web.server import AudioServer
    from tts_bridge.web.speech_api import SpeechApi

    synth = build_synthesizer(settings)
    pipeline = build_pipeline(settings, synth)
    pipeline.start()
    server = AudioServer.from_settings(settings)
    server.routes.append(SpeechApi(settings, pipeline, ApiKeys([]), store=server))
    server.start()
    try:
        yield server.port
    finally:
        server.stop()
        pipeline.stop(10.0)
        synth.cache.close()


def _summary(fmt: str, cache: str, seconds: Sequence[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    return {
        "format": fmt,
        "cache": cache,
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
    }


def run_http_bench(settings: Settings, voice: str = "joe") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tts-bridge-http-bench-") as tmp:
        work = Path(tmp)
        bench_settings = settings.model_copy(
            update={
                "cache": settings.cache.model_copy(update={"dir": work / "cache"}),
                "http": settings.http.model_copy(
                    update={"host": "127.0.0.1", "port": 0, "dir": work / "http"}
                ),
                "scheduler": settings.scheduler.model_copy(update={"idle_enabled": False}),
            }
        )
        rows = []
        with http_api_server(bench_settings) as port:
            first_byte_s(port, WARM_UP, voice, "wav")
            for fmt in ("wav", "mp3"):
                texts = [f"{t[:-1]}, {fmt}." for t in ANNOUNCEMENTS]  # new to the cache
                new = [first_byte_s(port, t, voice, fmt) for t in texts]
                hit = [first_byte_s(port, t, voice, fmt) for t in texts]
                rows += [_summary(fmt, "uncached", new), _summary(fmt, "cached", hit)]
    return {"machine": machine_info(), "voice": voice, "rows": rows}


def main_report(settings: Settings, out: Path | None) -> None:
    report = run_http_bench(settings)
    print(table(report["rows"], ["format", "cache", "n", "median_ms", "min_ms", "max_ms"]))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2), encoding="utf-8")
