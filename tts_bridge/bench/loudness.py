"""Loudness of each voice on home announcements, as engines make them and as the bridge answers.

Each announcement is rendered by each voice twice, uncached: with loudness normalization off
(what the engine makes) and at `synthesis.loudness_lufs`. Every answer's integrated loudness
(ITU BS.1770, the same meter the bridge uses) is measured; the report gives each voice's mean
and its spread (loudest minus quietest announcement), so a jump between voices or between
sentences shows as a number.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tts_bridge.config import Settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.loudness import LoudnessNormalizer
from tts_bridge.speech.synthesis import Synthesizer

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
                    rendering = synth.render(text, voice, use_cache=False)
                    values.append(meter.measure(rendering.pcm, rendering.sample_rate))
                out[voice] = {
                    "lufs": [round(v, 2) for v in values],
                    "mean_lufs": round(statistics.fmean(values), 2),
                    "spread_lu": round(max(values) - min(values), 2),
                }
        finally:
            synth.cache.close()
    return out


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
    result = {
        "target_lufs": target,
        "true_peak_dbtp": settings.synthesis.true_peak_dbtp,
        "announcements": list(ANNOUNCEMENTS),
        "before": before,
        "after": after,
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
    print(f"figures: {out}")
    return result
