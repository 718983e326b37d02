"""Kokoro engine to engine: the bridge's xiaobei against kokoro-onnx on the same model, voice
vector and phonemes.

The bridge's Kokoro engine speaks each sentence (its Mandarin phonemizer included, about 1 % of
the time); kokoro-onnx, in a child process with its own Python (`--peer-python`, a venv with
kokoro-onnx 0.6.1), is given the same INT8 model file, the same xiaobei style vectors and the
phonemes the bridge made, and speaks them as `Kokoro.create(..., is_phonemes=True)`. Each
engine first speaks a warm-up sentence; then they take turns, pass by pass, so the machine's
load falls on both alike. The real-time factor of a pass is its wall time over the audio it
made; the figure is the median over the passes.

    python -m tts_bridge.bench.kokoro_peer --peer-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tts_bridge.bench.cer import LONG_ANNOUNCEMENTS, WARM_UP
from tts_bridge.bench.util import machine_info
from tts_bridge.config import load_settings
from tts_bridge.engines.base import SynthesisOptions
from tts_bridge.engines.registry import EnginePool

VOICE = "xiaobei"
SPEAKER = "zf_xiaobei"
PASSES = 5
SENTENCES = (
    *(item.text for item in LONG_ANNOUNCEMENTS),
    "门口的摄像头发现有人在院子里走动，请打开手机查看一下录像。",
    "冰箱的门没有关好，里面的温度正在上升。",
)
"""Plain Chinese sentences (no digits: the front end leaves them as they are)."""

_PEER = r"""
import json, sys, time
import numpy as np
from kokoro_onnx import Kokoro
job = json.loads(sys.stdin.readline())
kokoro = Kokoro(job["model"], job["voices"])
kokoro.create(job["warm_up"], voice=job["speaker"], is_phonemes=True)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    seconds = audio = 0.0
    for phonemes in job["phonemes"]:
        started = time.perf_counter()
        samples, rate = kokoro.create(phonemes, voice=job["speaker"], is_phonemes=True)
        seconds += time.perf_counter() - started
        audio += len(samples) / rate
    print(json.dumps({"seconds": seconds, "audio": audio}), flush=True)
"""


def run(config: Path | None, peer_python: str, passes: int = PASSES) -> dict[str, Any]:
    from tts_bridge.text import mandarin

    settings = load_settings(config)
    pool = EnginePool(settings)
    voice = pool.voice(VOICE)
    engine: Any = voice.engine
    pool.ensure_loaded(engine)
    options = SynthesisOptions()
    speaker = voice.speaker or SPEAKER
    phonemes = [mandarin.to_phonemes(text) for text in SENTENCES]

    def ours() -> dict[str, float]:
        seconds = audio = 0.0
        for text in SENTENCES:
            started = time.perf_counter()
            chunks = list(engine.synthesize(text, speaker, options))
            seconds += time.perf_counter() - started
            audio += sum(c.size for c in chunks) / engine.sample_rate
        return {"seconds": seconds, "audio": audio}

    list(engine.synthesize(WARM_UP, speaker, options))
    with tempfile.TemporaryDirectory(prefix="tts-bridge-kokoro-peer-") as tmp:
        model = Path(tmp) / "model.onnx"
        model.write_bytes(engine._model_bytes())
        voices = Path(tmp) / "voices.npz"
        np.savez(voices, **{speaker: engine.style(speaker)[:, None, :]})  # rows x 1 x dim
        job = {
            "model": str(model),
            "voices": str(voices),
            "speaker": speaker,
            "phonemes": phonemes,
            "warm_up": mandarin.to_phonemes(WARM_UP),
        }
        peer = subprocess.Popen(
            [peer_python, "-c", _PEER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert peer.stdin is not None and peer.stdout is not None
        try:
            peer.stdin.write(json.dumps(job) + "\n")
            peer.stdin.flush()
            if not json.loads(peer.stdout.readline()).get("ready"):
                raise RuntimeError("kokoro-onnx did not start")
            passes_of: dict[str, list[dict[str, float]]] = {"tts_bridge": [], "kokoro-onnx": []}
            for number in range(passes):
                for name in ("tts_bridge", "kokoro-onnx")[:: 1 if number % 2 == 0 else -1]:
                    if name == "tts_bridge":
                        passes_of[name].append(ours())
                    else:
                        peer.stdin.write("go\n")
                        peer.stdin.flush()
                        passes_of[name].append(json.loads(peer.stdout.readline()))
        finally:
            peer.stdin.close()
            peer.wait(30)
    rows = []
    for name, runs in passes_of.items():
        rtfs = [r["seconds"] / r["audio"] for r in runs]
        rows.append(
            {
                "engine": name,
                "passes": len(runs),
                "audio_s": round(statistics.median(r["audio"] for r in runs), 2),
                "rtf": round(statistics.median(rtfs), 3),
                "rtf_min": round(min(rtfs), 3),
                "rtf_max": round(max(rtfs), 3),
            }
        )
    return {
        "machine": machine_info(),
        "voice": VOICE,
        "sentences": list(SENTENCES),
        "onnx_session": engine.plan.describe(),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="the bridge's configuration file")
    parser.add_argument("--peer-python", required=True, help="a Python with kokoro-onnx")
    parser.add_argument("--passes", type=int, default=PASSES)
    parser.add_argument("--out", type=Path, help="write the report here as JSON too")
    args = parser.parse_args(argv)
    report = run(args.config, args.peer_python, args.passes)
    for row in report["rows"]:
        print(
            f"{row['engine']:<12} RTF {row['rtf']:.3f} (passes {row['rtf_min']:.3f}–"
            f"{row['rtf_max']:.3f}), {row['audio_s']:.1f} s of audio a pass"
        )
    print(f"the bridge's session: {report['onnx_session']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
