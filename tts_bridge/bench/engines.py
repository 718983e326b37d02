"""`tts-bridge bench`: engine load time, real-time factor and peak RSS; what encoding an answer
for a speaker costs; cache-hit latency over MQTT.

Each engine is measured in its own child process so its peak RSS is its own. The cache-hit
latency runs the real bridge as a subprocess against a private mosquitto on loopback and times
publish -> receipt of the WAV at a subscriber, one request at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tts_bridge import __version__
from tts_bridge.bench.util import machine_info, peak_rss_mb, start_bridge
from tts_bridge.bench.util import table as _table
from tts_bridge.config import Settings
from tts_bridge.engines.base import SynthesisOptions

# Home-announcement sentences of different lengths; the same set for every engine.
BENCH_SENTENCES = (
    "Dinner is ready.",
    "The washing machine has finished.",
    "The front door has been open for five minutes.",
    "Good morning! It is seven thirty, and the temperature outside is twelve degrees.",
    "Reminder: the recycling goes out tonight, and the dishwasher needs salt.",
)
ROUNDS = 3


def measure_engine(settings: Settings, voice_name: str) -> dict[str, Any]:
    """Runs inside a child process: load, warm up, then time every bench sentence ROUNDS times."""
    from tts_bridge.engines.registry import EnginePool

    rss_start = peak_rss_mb()
    voice = EnginePool(settings).voice(voice_name)
    started = time.perf_counter()
    voice.engine.load()
    load_s = time.perf_counter() - started
    options = SynthesisOptions(speed=voice.settings.speed)
    list(voice.engine.synthesize("Warm up.", voice.speaker, options))
    synth_s = audio_s = 0.0
    per_sentence: list[float] = []
    for _ in range(ROUNDS):
        for sentence in BENCH_SENTENCES:
            t0 = time.perf_counter()
            samples = sum(len(c) for c in voice.engine.synthesize(sentence, voice.speaker, options))
            elapsed = time.perf_counter() - t0
            synth_s += elapsed
            audio_s += samples / voice.engine.sample_rate
            per_sentence.append(elapsed * 1000)
    return {
        "voice": voice_name,
        "engine": voice.engine.identity,
        "sample_rate": voice.engine.sample_rate,
        "load_s": round(load_s, 3),
        "rtf": round(synth_s / audio_s, 4),
        "x_realtime": round(audio_s / synth_s, 1),
        "sentence_ms_p50": round(statistics.median(per_sentence), 1),
        "audio_s": round(audio_s, 2),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "rss_before_load_mb": round(rss_start, 1),
    }


def _engine_in_child(settings: Settings, voice: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        handle.write(settings.model_dump_json())
        path = handle.name
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tts_bridge.bench.engines", path, voice],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        os.unlink(path)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def measure_cache_hits(
    settings: Settings, requests: int, workdir: Path, broker_nodelay: bool
) -> dict[str, Any]:
    """Real broker, real bridge process; time from publish to the subscriber receiving the WAV.

    With mosquitto's default `set_tcp_nodelay false`, Nagle's algorithm adds ~40-90 ms per
    message on loopback; both settings are measured so the manual can show the difference.
    """
    from tts_bridge.bench.localbroker import LocalBroker
    from tts_bridge.mqtt.client import new_client

    base = "bench_tts"
    extra = ["set_tcp_nodelay true"] if broker_nodelay else []
    with LocalBroker(workdir / "broker", extra_config=extra) as broker:
        log = (workdir / "bridge.log").open("w")
        bridge = start_bridge(
            settings, host=broker.host, port=broker.port, base=base, workdir=workdir, log=log
        )
        received = threading.Event()
        online = threading.Event()

        def on_message(client: Any, userdata: Any, msg: Any) -> None:
            if msg.topic.endswith("/bridge/state") and b"online" in msg.payload:
                online.set()
            elif msg.topic.startswith(f"{base}/audio/"):
                received.set()

        client = new_client()
        client.on_message = on_message
        client.connect(broker.host, broker.port)
        client.subscribe([(f"{base}/audio/#", 1), (f"{base}/bridge/state", 1)])
        client.loop_start()
        try:
            if not online.wait(60):
                raise RuntimeError("the bridge did not come online; see " + str(log.name))
            text = "The front door is open."
            latencies: list[float] = []
            first_ms = 0.0
            for index in range(requests + 1):
                received.clear()
                started = time.perf_counter()
                client.publish(f"{base}/say/bench", text, qos=1)
                if not received.wait(60):
                    raise RuntimeError(f"request {index} got no audio; see {log.name}")
                elapsed = (time.perf_counter() - started) * 1000
                if index == 0:
                    first_ms = elapsed  # the miss that fills the cache (includes model load)
                else:
                    latencies.append(elapsed)
        finally:
            client.loop_stop()
            client.disconnect()
            bridge.terminate()
            bridge.wait(30)
            log.close()
    return {
        "broker_set_tcp_nodelay": broker_nodelay,
        "requests": requests,
        "first_request_ms": round(first_ms, 1),
        "p50_ms": round(_percentile(latencies, 0.50), 2),
        "p99_ms": round(_percentile(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2),
        "mean_ms": round(statistics.fmean(latencies), 2),
    }


ENCODING_COLUMNS = ["format", "sample_rate", "channels", "ms_per_audio_s", "rtf", "kbps", "bytes"]


def measure_encoding() -> list[dict[str, Any]]:
    """Encoding cost per second of audio of the formats speakers play (bench.encoding)."""
    from tts_bridge.bench.encoding import encode_cost_rows

    print("measuring encoding (MP3, Opus, FLAC, WAV) ...", file=sys.stderr)
    rows = encode_cost_rows()
    print("\nencoding an answer, per second of audio (source 22.05 kHz mono):")
    print(_table(rows, ENCODING_COLUMNS))
    return rows


def run_encoding_bench(out: Path) -> None:
    """`bench --encoding`: the encoding rows alone, written to `out`."""
    report: dict[str, Any] = {
        "version": __version__,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "command": "tts-bridge " + " ".join(sys.argv[1:]),
        "encoding": measure_encoding(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten to {out}")


def run_bench(settings: Settings, args: argparse.Namespace) -> int:
    report: dict[str, Any] = {
        "version": __version__,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "command": "tts-bridge " + " ".join(sys.argv[1:]),
        "engines": [],
    }
    for voice in settings.voices:
        print(f"measuring voice {voice} ...", file=sys.stderr)
        report["engines"].append(_engine_in_child(settings, voice))
    print(
        _table(
            report["engines"],
            ["voice", "engine", "load_s", "rtf", "x_realtime", "sentence_ms_p50", "peak_rss_mb"],
        )
    )
    report["encoding"] = measure_encoding()
    if not args.skip_mqtt:
        print(f"measuring {args.requests} cache hits over MQTT ...", file=sys.stderr)
        rows = []
        for nodelay in (True, False):
            with tempfile.TemporaryDirectory(prefix="tts-bench-") as tmp:
                rows.append(measure_cache_hits(settings, args.requests, Path(tmp), nodelay))
        report["cache_hit_mqtt"] = rows
        print()
        print(_table(rows, list(rows[0])))
        from tts_bridge.bench.scenarios import (
            measure_fast_lane,
            measure_routing,
            measure_streaming,
        )

        print(f"\nmeasuring a burst of {args.burst} live requests ...", file=sys.stderr)
        report["routing_burst"] = measure_routing(settings, args.burst)
        print(_table(report["routing_burst"], list(report["routing_burst"][0])))
        print("\nmeasuring a fast-tier request during a long quality job ...", file=sys.stderr)
        report["fast_lane"] = [measure_fast_lane(settings)]
        print(_table(report["fast_lane"], list(report["fast_lane"][0])))
        print("\nmeasuring time to first audio (five sentences) ...", file=sys.stderr)
        report["streaming"] = measure_streaming(settings)
        print(_table(report["streaming"], list(report["streaming"][0])))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten to {args.out}")
    return 0


def _child_main(argv: list[str]) -> int:
    settings = Settings.model_validate_json(Path(argv[0]).read_text(encoding="utf-8"))
    print(json.dumps(measure_engine(settings, argv[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
