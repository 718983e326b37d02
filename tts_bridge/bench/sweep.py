"""Thread sweep: onnxruntime threads per engine x concurrent synthesis jobs, on this machine.

For each setting a child process builds one engine instance per job (each with its own ONNX
session of that many intra-op threads), loads and warms them up, then the jobs take distinct
sentences from one shared queue until it is empty. That is the bridge's shape under load: a
burst of announcements and ``synthesis.workers`` jobs working through it. A child per setting
keeps thread pools, allocator arenas and page-cache warmth of one setting from helping or
hurting the next.

Reported per setting: throughput (sentences per wall second, and seconds of audio per wall
second) and the per-sentence synthesis latency (p50/p95, from the start of that sentence's
synthesis to its last sample; queue wait is not included, so it shows what concurrency does to
each job's speed). The defaults in ``tuning.py`` should follow from these figures.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tts_bridge import __version__
from tts_bridge.bench.util import machine_info
from tts_bridge.config import Settings

_LOGGER = logging.getLogger(__name__)

SWEEP_THREADS = (1, 2)
SWEEP_CONCURRENCY = (1, 2)
# Distinct home announcements of everyday lengths (a cache would otherwise answer repeats).
SWEEP_SENTENCES = (
    "Dinner is ready.",
    "The washing machine has finished.",
    "The front door has been open for five minutes.",
    "Someone is at the front door.",
    "The dishwasher is done, you can empty it now.",
    "Good morning! It is seven thirty, and the temperature outside is twelve degrees.",
    "Reminder: the recycling goes out tonight.",
    "The garage door is still open.",
    "It is going to rain this afternoon, take an umbrella.",
    "The living room window is open and the heating is on.",
    "Your parcel has been delivered.",
    "The freezer door has been open for two minutes.",
    "Time to leave for school.",
    "The battery of the smoke detector in the hallway is low.",
    "The dryer has finished its cycle.",
    "Motion detected in the garden.",
    "The bedroom is too warm, the air conditioning is turning on.",
    "Good night. All doors are locked and the alarm is set.",
    "The car is fully charged.",
    "Water leak detected under the kitchen sink!",
    "The baby monitor has lost its connection.",
    "Lunch will be ready in ten minutes.",
    "The back door was unlocked at six fifteen.",
    "The air quality in the office is poor, please open a window.",
)
_CHILD_TIMEOUT_S = 900
_THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: with 24 values p95 is the 23rd smallest, an observed value."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def measure_setting(
    settings: Settings, voice_name: str, threads: int, concurrency: int, sentences: Sequence[str]
) -> dict[str, Any]:
    """Runs in a child process: ``concurrency`` engines of ``threads`` threads each."""
    from tts_bridge.engines.base import SynthesisOptions
    from tts_bridge.engines.registry import EnginePool, Voice

    alone = settings.model_copy(
        update={"voices": {voice_name: settings.voices[voice_name]}, "default_voice": voice_name}
    )
    # One pool per job: each builds its own engine, so no ONNX session is shared between jobs.
    voices: list[Voice] = [
        EnginePool(alone, threads=threads).voice(voice_name) for _ in range(concurrency)
    ]
    options = SynthesisOptions(speed=voices[0].settings.speed)
    load_started = time.perf_counter()
    for voice in voices:
        voice.engine.load()
        # The first run of an ONNX session allocates its buffers; no live request pays that.
        list(voice.engine.synthesize("Warm up.", voice.speaker, options))
    load_s = time.perf_counter() - load_started

    work: queue.SimpleQueue[str] = queue.SimpleQueue()
    for sentence in sentences:
        work.put(sentence)
    latencies: list[float] = []
    audio_seconds: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(concurrency + 1)

    def job(voice: Voice) -> None:
        start.wait()
        rate = voice.engine.sample_rate
        while True:
            try:
                sentence = work.get_nowait()
            except queue.Empty:
                return
            began = time.perf_counter()
            try:
                samples = sum(
                    len(c) for c in voice.engine.synthesize(sentence, voice.speaker, options)
                )
            except Exception as exc:  # a failed sentence is reported, not silently dropped
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            elapsed = time.perf_counter() - began
            with lock:
                latencies.append(elapsed)
                audio_seconds.append(samples / rate)

    machine_before = _machine_busy_seconds()
    workers = [
        threading.Thread(target=job, args=(v,), name=f"sweep-{i}") for i, v in enumerate(voices)
    ]
    for worker in workers:
        worker.start()
    cpu_before = _cpu_seconds()
    start.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - began
    cpu = _cpu_seconds() - cpu_before
    machine = _machine_busy_seconds() - machine_before
    if errors:
        raise RuntimeError(f"{len(errors)} sentence(s) failed, first: {errors[0]}")
    audio = sum(audio_seconds)
    return {
        "threads": threads,
        "concurrency": concurrency,
        "engine": voices[0].engine.identity,
        "sentences": len(latencies),
        "wall_s": round(wall, 3),
        "sentences_per_s": round(len(latencies) / wall, 2),
        "audio_s_per_s": round(audio / wall, 1),
        "latency_ms_p50": round(statistics.median(latencies) * 1000, 1),
        "latency_ms_p95": round(_percentile(latencies, 0.95) * 1000, 1),
        "latency_ms_max": round(max(latencies) * 1000, 1),
        "cpu_busy": round(cpu / wall, 2),
        # CPUs that other programs kept busy meanwhile: on a shared machine the figures above
        # are only comparable between runs where this is near 0.
        "others_cpu_busy": round(max(0.0, machine - cpu) / wall, 2),
        "load_and_warmup_s": round(load_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _machine_busy_seconds() -> float:
    import psutil

    times = psutil.cpu_times()
    return float(times.user + times.system + getattr(times, "nice", 0.0)) + sum(
        float(getattr(times, name, 0.0)) for name in ("irq", "softirq", "steal")
    )


def _setting_in_child(
    settings_path: Path, voice: str, threads: int, concurrency: int, count: int
) -> dict[str, Any]:
    env = dict(os.environ)
    # numpy and any OpenMP user in the child stay within the setting's thread count too.
    env.update({name: str(threads) for name in _THREAD_ENV_VARS})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tts_bridge.bench.sweep",
            str(settings_path),
            voice,
            str(threads),
            str(concurrency),
            str(count),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=_CHILD_TIMEOUT_S,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"sweep setting threads={threads} concurrency={concurrency} failed "
            f"(exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _quietest_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    # The setting is what is measured, not the neighbours: the run that other programs
    # disturbed least stands for it; every run's throughput stays in the report.
    chosen = dict(min(runs, key=lambda r: r["others_cpu_busy"]))
    chosen["runs"] = [
        {"sentences_per_s": r["sentences_per_s"], "others_cpu_busy": r["others_cpu_busy"]}
        for r in runs
    ]
    return chosen


def _table(rows: list[dict[str, Any]]) -> str:
    columns = [
        ("threads", "threads"),
        ("concurrency", "jobs"),
        ("sentences_per_s", "sentences/s"),
        ("audio_s_per_s", "audio s/s"),
        ("latency_ms_p50", "p50 ms"),
        ("latency_ms_p95", "p95 ms"),
        ("cpu_busy", "CPUs busy"),
        ("peak_rss_mb", "peak RSS MB"),
        ("others_cpu_busy", "others' CPUs"),
    ]
    cells = [[title for _, title in columns]]
    cells += [[str(row[key]) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells
    )


def run_sweep(
    settings: Settings,
    out: Path,
    *,
    voice: str | None = None,
    threads: Sequence[int] = SWEEP_THREADS,
    concurrency: Sequence[int] = SWEEP_CONCURRENCY,
    sentences: int = len(SWEEP_SENTENCES),
    repeats: int = 1,
) -> dict[str, Any]:
    """Measure every threads x concurrency setting, print a table, write JSON to ``out``.

    ``voice`` defaults to the default voice; ``sentences`` (at most the number of distinct
    sentences, 24) go through each setting. With ``repeats`` > 1 the settings are measured in
    turn, round after round (so a burst of other load does not land on one setting only), and
    each setting's run least disturbed by other programs is reported. Returns the report written.
    """
    voice = voice or settings.default_voice
    if voice not in settings.voices:
        raise ValueError(f"unknown voice {voice!r}; available: {', '.join(settings.voices)}")
    if not 1 <= sentences <= len(SWEEP_SENTENCES):
        raise ValueError(f"sentences must be from 1 to {len(SWEEP_SENTENCES)}, got {sentences}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    grid = [(t, c) for t in threads for c in concurrency]
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {setting: [] for setting in grid}
    with tempfile.TemporaryDirectory(prefix="tts-sweep-") as tmp:
        # The child reads the settings from a file (mode 0600: they may hold a broker password).
        settings_path = Path(tmp) / "settings.json"
        settings_path.touch(mode=0o600)
        settings_path.write_text(settings.model_dump_json(), encoding="utf-8")
        for round_ in range(1, repeats + 1):
            for thread_count, jobs in grid:
                print(
                    f"round {round_}/{repeats}, voice {voice}: "
                    f"{thread_count} thread(s) x {jobs} job(s) ...",
                    file=sys.stderr,
                    flush=True,
                )
                runs[(thread_count, jobs)].append(
                    _setting_in_child(settings_path, voice, thread_count, jobs, sentences)
                )
    rows = [_quietest_run(runs[setting]) for setting in grid]
    best = max(rows, key=lambda r: r["sentences_per_s"])
    quickest = min(rows, key=lambda r: r["latency_ms_p95"])
    report: dict[str, Any] = {
        "version": __version__,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "voice": voice,
        "sentences_per_setting": sentences,
        "repeats": repeats,
        "latency": "per sentence, start of its synthesis to its last sample (no queue wait)",
        "settings": rows,
        "best_throughput": {"threads": best["threads"], "concurrency": best["concurrency"]},
        "best_p95": {"threads": quickest["threads"], "concurrency": quickest["concurrency"]},
    }
    print(_table(rows))
    print(
        f"most throughput: {best['threads']} thread(s) x {best['concurrency']} job(s); "
        f"lowest p95: {quickest['threads']} thread(s) x {quickest['concurrency']} job(s)"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"written to {out}")
    return report


def _child_main(argv: list[str]) -> int:
    settings_file, voice, threads, concurrency, count = argv
    settings = Settings.model_validate_json(Path(settings_file).read_text(encoding="utf-8"))
    result = measure_setting(
        settings, voice, int(threads), int(concurrency), SWEEP_SENTENCES[: int(count)]
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
