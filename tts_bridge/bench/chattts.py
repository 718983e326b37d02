"""`tts-bridge bench --chattts`: ChatTTS on torch and on ONNX Runtime, measured alike.

The real weights come from a model hub this project never contacts, so the bench writes a
checkpoint with the official shapes and random weights (once, into ``OUT/checkpoint``): GPT 768
hidden x 20 layers (12 heads, MLP 3072), 4 VQ codebooks of 626 audio tokens, a 21178-token text
vocabulary, and ChatTTS's own decoder, DVAE and Vocos sizes (taken from ``ChatTTS.config.Config``).
It exports that checkpoint to ONNX and quantizes it to INT8 (once, into ``OUT/onnx``). Random
weights: speed and memory are real, the sound is not.

Four cases -- torch FP32, torch dynamic INT8 (``quantize_dynamic`` on the GPT's Linear layers),
ONNX FP32, ONNX INT8 -- at each batch size, each in its own child process, one after another (so
each peak RSS is the process's own and no two cases share the cores). The ONNX children never
import torch (``tts_bridge.bench.onnx_backends``; every row records whether torch got imported).
Each child loads through the bridge's engine (``ChatTTSEngine`` / ``ChatTTSOnnxEngine``: hash
verification, the engine's own loader), then:

* runs the code loop for exactly ``tokens`` codes per text (EOS is blocked until then:
  random weights would stop at an arbitrary EOS) and decodes the result: ms per step and
  tokens/s (sampling included), and the end-to-end real-time factor (code loop, sampling,
  decoder, Vocos and ISTFT; one code = 512 samples at 24 kHz, 46.875 codes per second of audio);
* in the first batch size's child, times the engine's ``synthesize`` on a one-sentence
  announcement from the call to its first yielded audio chunk, with EOS blocked for a fixed
  number of codes (the engine's own length estimate of the sentence) for the same reason;
* records its peak RSS (VmHWM) and whether torch was imported.

With ``rounds`` > 1 the rounds are interleaved (every case once, then again) since the machine's
load varies; each figure is the best of the rounds (fastest time, highest throughput) except
memory, which is the highest. The targets the ONNX tier was built to meet are printed next to
the figures.

This module runs the bench; ``chattts_measure`` is what runs in each child (one case, or the
checkpoint and export prepared), ``chattts_report`` turns the rows into results and the report.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tts_bridge import __version__
from tts_bridge.bench.bandwidth import memory_bandwidth, step_floors
from tts_bridge.bench.chattts_measure import (
    CASES,
    FIRST_AUDIO_TEXT,
    MODEL_NAME,
    ONNX_CASES,
    QUANTIZED_CASES,
    TORCH_CASES,
    default_first_audio_codes,
)
from tts_bridge.bench.chattts_report import (
    NOTE,
    combine_rounds,
    evaluate_targets,
    file_sizes,
    format_report,
)
from tts_bridge.bench.util import machine_info, run_child
from tts_bridge.engines.chattts.torch_engine import read_checkpoint
from tts_bridge.engines.manifests import add_model

_LOGGER = logging.getLogger(__name__)

CHILD_TIMEOUT_S = 3600
CHECKPOINT_DIR = "checkpoint"
EXPORT_DIR = "onnx"
RESULTS_FILE = "results.json"
_MEASURE = "tts_bridge.bench.chattts_measure"
"""The module whose children prepare the checkpoint and measure the torch cases."""


def measure_fidelity(
    export: Path, cases: Sequence[str], threads: int, tokens: int
) -> list[dict[str, Any]]:
    """Each quantized case's GPT logits against FP32's, in a child process per case."""
    return [
        run_child(
            "tts_bridge.bench.onnx_backends",
            ["--fidelity", json.dumps(spec)],
            timeout=CHILD_TIMEOUT_S,
        )
        for spec in (
            {"export": str(export), "precision": case.removeprefix("onnx-")}
            | {"threads": threads, "tokens": tokens}
            for case in cases
            if case in QUANTIZED_CASES
        )
    ]


def codec_fidelity(
    export: Path, cases: Sequence[str], threads: int, tokens: int
) -> list[dict[str, Any]]:
    """The INT8 decoder and Vocos against FP32's (the waveform's SNR), in a child process,
    when ``onnx-int8-all`` is measured."""
    if "onnx-int8-all" not in cases:
        return []
    spec = {"export": str(export), "threads": threads, "tokens": tokens}
    return [
        run_child(
            "tts_bridge.bench.onnx_backends",
            ["--codec-fidelity", json.dumps(spec)],
            timeout=CHILD_TIMEOUT_S,
        )
    ]


def _onnx_ready(export: Path, cases: Sequence[str]) -> bool:
    from tts_bridge.engines.chattts.onnx_format import MANIFEST_FILE, read_manifest

    if not (export / MANIFEST_FILE).is_file():
        return False
    variants = read_manifest(export)["variants"]
    return all(case.removeprefix("onnx-") in variants for case in cases if case in ONNX_CASES)


def run_chattts_bench(
    out: Path,
    tokens: int = 200,
    batches: Sequence[int] = (1, 4),
    *,
    rounds: int = 1,
    cases: Sequence[str] = CASES,
    threads: int | None = None,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    first_audio_codes: int | None = None,
    spinning: bool = True,
) -> dict[str, Any]:
    """Measure every case x batch size, ``rounds`` times interleaved; print, write JSON.

    ``spinning`` is the ONNX sessions' spinning (onnxruntime's default, on): off is the fair
    choice on a host whose other programs keep the cores busy, where spinning is a cliff.

    ``out`` is the work folder: the checkpoint in ``out/checkpoint`` and the export in
    ``out/onnx`` are made when missing (``hidden_size``/``num_layers`` size a new checkpoint,
    None: the official size; an existing one is used as it is), the results go to
    ``out/results.json``.
    """
    if tokens < 1 or not batches or min(batches) < 1 or rounds < 1:
        raise ValueError("tokens, rounds and every batch size must be at least 1")
    unknown = set(cases) - set(CASES)
    if unknown or not cases:
        raise ValueError(f"unknown cases {sorted(unknown)}; choose from {CASES}")
    threads = threads or len(os.sched_getaffinity(0))
    codes = default_first_audio_codes() if first_audio_codes is None else first_audio_codes
    out = out.resolve()
    checkpoint, export = out / CHECKPOINT_DIR, out / EXPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "version": __version__,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "tokens_per_text": tokens,
        "batches": list(batches),
        "rounds": rounds,
        "threads": threads,
        "onnx_spinning": spinning,
        "first_audio": {
            "text": FIRST_AUDIO_TEXT,
            "codes": codes,
            "how": "time from the engine's synthesize call to its first yielded chunk, "
            "EOS blocked for exactly this many codes",
        },
    }
    # Before anything else loads the machine: the floor every GPT step is compared with.
    report["bandwidth"] = memory_bandwidth(threads)
    print(f"memory bandwidth {report['bandwidth']['gb_per_s']} GB/s", file=sys.stderr)
    print(f"checkpoint in {checkpoint} ...", file=sys.stderr)
    spec = [str(checkpoint), str(hidden_size or 0), str(num_layers or 0)]
    report["checkpoint"] = run_child(_MEASURE, ["checkpoint", *spec], timeout=CHILD_TIMEOUT_S)
    dims = read_checkpoint(checkpoint)
    report["checkpoint"]["dims"] = asdict(dims)
    if any(case in ONNX_CASES for case in cases) and not _onnx_ready(export, cases):
        print(f"exporting to ONNX and quantizing in {export} ...", file=sys.stderr)
        extra = [c.removeprefix("onnx-") for c in ("onnx-int4", "onnx-int8-all") if c in cases]
        report["export"] = run_child(
            _MEASURE,
            ["export", str(checkpoint), str(export), ",".join(extra) or "none"],
            timeout=CHILD_TIMEOUT_S,
        )

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tts-chattts-bench-") as models_dir:
        if any(case in TORCH_CASES for case in cases):
            manifest = add_model(MODEL_NAME, checkpoint, Path(models_dir))
            report["checkpoint"]["bytes"] = manifest.total_bytes
        for round_ in range(1, rounds + 1):
            for case in cases:
                for batch in batches:
                    print(f"round {round_}/{rounds}: {case} batch {batch} ...", file=sys.stderr)
                    spec_ = {
                        "case": case,
                        "batch": batch,
                        "tokens": tokens,
                        "threads": threads,
                        "checkpoint": str(checkpoint),
                        "models_dir": models_dir,
                        "export": str(export),
                        "first_audio_codes": codes if batch == batches[0] else 0,
                        "spinning": spinning,
                    }
                    if case in TORCH_CASES:
                        row = run_child(
                            _MEASURE, ["measure", json.dumps(spec_)], timeout=CHILD_TIMEOUT_S
                        )
                    else:
                        row = run_child(
                            "tts_bridge.bench.onnx_backends",
                            ["--child", json.dumps(spec_)],
                            timeout=CHILD_TIMEOUT_S,
                        )
                    runs.append({**row, "round": round_})
    report["fidelity"], report["codec_fidelity"] = (
        measure_fidelity(export, cases, threads, tokens),
        codec_fidelity(export, cases, threads, tokens),
    )
    rows = combine_rounds(runs)
    sections = report["checkpoint"]["official_sections"]
    full_size = len(sections) == 5
    report["note"] = (
        NOTE
        if full_size
        else f"GPT {dims.hidden_size} x {dims.num_hidden_layers} (not the full-size "
        "architecture), random weights: speed and memory are real, sound is not"
    )
    report["runs"] = runs
    report["results"] = rows
    report["file_sizes"] = file_sizes(checkpoint, export, cases)
    weights = {r["case"]: r["gpt_bytes"] for r in report["file_sizes"] if r["case"] in ONNX_CASES}
    report["floors"] = step_floors(rows, weights, report["bandwidth"]["gb_per_s"])
    report["targets"] = evaluate_targets(rows, report["floors"])
    print(format_report(report))
    results = out / RESULTS_FILE
    results.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"\nwritten to {results}")
    return report
