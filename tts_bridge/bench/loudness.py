"""Loudness of each voice on home announcements, as engines make them and as the bridge answers.

Each announcement is rendered by each voice twice, uncached: with loudness normalization off
(what the engine makes) and at `synthesis.loudness_lufs`. Every answer's integrated loudness
(ITU BS.1770, the same meter the bridge uses) is measured; the report gives each voice's mean
and its spread (loudest minus quietest announcement), so a jump between voices or between
sentences shows as a number.

Then the cost of the step itself: each sentence as the engine made it is normalized `rounds`
times (median wall-clock and CPU milliseconds per sentence), and the meter is compared with
pyloudnorm, the reference it replaced, where that is installed (a development dependency).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tts_bridge.config import Settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.loudness import LoudnessNormalizer
from tts_bridge.speech.request import SpeechRequest
from tts_bridge.speech.synthesis import SentenceAudio, Synthesizer
from tts_bridge.system.threads import numpy_blas_on_one_thread

ANNOUNCEMENTS = (
    "The washing machine has finished.",
    "Someone is at the front door.",
    "Dinner is ready.",
    "The garage door has been open for 15 minutes.",
    "Rain is expected in about 20 minutes; bring the washing in.",
    "Yes.",
    "Good morning! It is 7:30 and 4 degrees outside.",
    "The back door is unlocked. Please check it before you leave.",
    "Battery low in the kitchen smoke alarm.",
    "The dishwasher needs salt.",
    "Motion detected in the garden.",
    "Bedtime in ten minutes.",
)
"""Short and long, one word to two sentences: the same set the loudness tests use."""

VOICES = ("joe", "heart")


def measure_voices(
    settings: Settings, voices: tuple[str, ...] = VOICES, texts: tuple[str, ...] = ANNOUNCEMENTS
) -> dict[str, dict[str, Any]]:
    """Per voice: the loudness (LUFS) of each announcement as the bridge renders it with
    `settings` (uncached), their mean and spread (LU)."""
    meter = LoudnessNormalizer(None, 0.0)
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tts-bridge-loudness-") as tmp:
        cache = settings.cache.model_copy(update={"dir": Path(tmp)})
        synth = Synthesizer(settings, EnginePool(settings), SentenceCache(cache))
        try:
            for voice in voices:
                values = []
                for text in texts:
                    rendering = synth.speak(
                        SpeechRequest(text=text, voice=voice, use_cache=False, door="bench")
                    )
                    values.append(meter.measure(rendering.pcm, rendering.sample_rate))
                out[voice] = {
                    "lufs": [round(v, 2) for v in values],
                    "mean_lufs": round(statistics.fmean(values), 2),
                    "spread_lu": round(max(values) - min(values), 2),
                }
        finally:
            synth.cache.close()
    return out


TIMING_ROUNDS = 20


def raw_sentences(
    settings: Settings, voices: tuple[str, ...] = VOICES, texts: tuple[str, ...] = ANNOUNCEMENTS
) -> list[tuple[str, int, np.ndarray[Any, np.dtype[np.int16]]]]:
    """Each sentence of `texts` as each voice's engine makes it (normalization off, uncached):
    (voice, sample rate, PCM)."""
    off = settings.model_copy(
        update={"synthesis": settings.synthesis.model_copy(update={"loudness_lufs": None})}
    )
    out: list[tuple[str, int, np.ndarray[Any, np.dtype[np.int16]]]] = []
    with tempfile.TemporaryDirectory(prefix="tts-bridge-loudness-") as tmp:
        cache = off.cache.model_copy(update={"dir": Path(tmp)})
        synth = Synthesizer(off, EnginePool(off), SentenceCache(cache))
        try:
            for voice in voices:
                pieces: list[SentenceAudio] = []
                for text in texts:
                    made = synth.render(text, voice, use_cache=False, on_sentence=pieces.append)
                    out.extend((voice, made.sample_rate, p.pcm) for p in pieces if p.pcm.size)
                    pieces.clear()
        finally:
            synth.cache.close()
    return out


def time_normalize(
    settings: Settings,
    sentences: list[tuple[str, int, np.ndarray[Any, np.dtype[np.int16]]]],
    rounds: int = TIMING_ROUNDS,
) -> dict[str, Any]:
    """The milliseconds LoudnessNormalizer.normalize takes per sentence (the median of `rounds`
    runs of each, wall clock and this thread's CPU time), and the largest difference of its
    meter from pyloudnorm's on the same sentences (None when pyloudnorm is not installed)."""
    numpy_blas_on_one_thread()  # as the bridge runs it
    normalizer = LoudnessNormalizer(
        settings.synthesis.loudness_lufs, settings.synthesis.true_peak_dbtp
    )
    wall: list[float] = []
    cpu: list[float] = []
    seconds = 0.0
    for _, rate, pcm in sentences:
        normalizer.normalize(pcm, rate)  # the filter plan of this rate is made once
        runs = []
        for _ in range(rounds):
            started, started_cpu = time.perf_counter(), time.thread_time()
            normalizer.normalize(pcm, rate)
            runs.append((time.perf_counter() - started, time.thread_time() - started_cpu))
        wall.append(1000 * statistics.median(r[0] for r in runs))
        cpu.append(1000 * statistics.median(r[1] for r in runs))
        seconds += pcm.size / rate
    return {
        "sentences": len(sentences),
        "mean_sentence_s": round(seconds / max(1, len(sentences)), 2),
        "median_ms": round(statistics.median(wall), 3),
        "p90_ms": round(float(np.percentile(wall, 90)), 3),
        "max_ms": round(max(wall), 3),
        "median_cpu_ms": round(statistics.median(cpu), 3),
        "max_lu_from_pyloudnorm": _from_pyloudnorm(normalizer, sentences),
    }


def _from_pyloudnorm(
    normalizer: LoudnessNormalizer,
    sentences: list[tuple[str, int, np.ndarray[Any, np.dtype[np.int16]]]],
) -> float | None:
    try:
        import pyloudnorm  # a development dependency, not the bridge's
    except ImportError:
        return None
    worst = 0.0
    for _, rate, pcm in sentences:
        samples = pcm.astype(np.float64) / 32768.0
        block = int(np.ceil(0.4 * rate)) + 1
        if samples.size < block:  # as the bridge measures a word shorter than a gating block
            samples = np.resize(samples, block)
        for scale in (1.0, 0.25, 2.0):
            reference = pyloudnorm.Meter(rate).integrated_loudness(samples * scale)
            ours = normalizer.measure(samples * scale, rate)
            worst = max(worst, abs(float(reference) - ours))
    return worst


def run_loudness_bench(settings: Settings, out: Path) -> dict[str, Any]:
    """Measure each voice before (normalization off) and after; print a table, write `out`."""
    target = settings.synthesis.loudness_lufs
    if target is None:
        raise SystemExit("synthesis.loudness_lufs is off: nothing to compare with")
    off = settings.model_copy(
        update={"synthesis": settings.synthesis.model_copy(update={"loudness_lufs": None})}
    )
    before = measure_voices(off)
    after = measure_voices(settings)
    timing = time_normalize(settings, raw_sentences(settings))
    result = {
        "target_lufs": target,
        "true_peak_dbtp": settings.synthesis.true_peak_dbtp,
        "announcements": list(ANNOUNCEMENTS),
        "before": before,
        "after": after,
        "normalize": timing,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"Integrated loudness of {len(ANNOUNCEMENTS)} announcements (target {target:g} LUFS):")
    print(f"{'voice':<8}{'before':>10}{'spread':>8}{'after':>10}{'spread':>8}")
    for voice in before:
        b, a = before[voice], after[voice]
        print(
            f"{voice:<8}{b['mean_lufs']:>10.2f}{b['spread_lu']:>8.2f}"
            f"{a['mean_lufs']:>10.2f}{a['spread_lu']:>8.2f}"
        )
    print(
        f"Normalizing one sentence ({timing['sentences']} sentences, "
        f"{timing['mean_sentence_s']:.1f} s each on average): median {timing['median_ms']:.2f} "
        f"ms, p90 {timing['p90_ms']:.2f} ms, max {timing['max_ms']:.2f} ms "
        f"(median CPU {timing['median_cpu_ms']:.2f} ms)"
    )
    worst = timing["max_lu_from_pyloudnorm"]
    print(
        "Meter against pyloudnorm: "
        + (f"at most {worst:.2g} LU apart" if worst is not None else "pyloudnorm not installed")
    )
    print(f"figures: {out}")
    return result
