"""Benchmark ChatTTS on ONNX Runtime (FP32 and INT8) at the full-size architecture.

Real weights cannot be fetched here, so the benchmark builds a checkpoint with ChatTTS's
official shapes (GPT 768 x 20 layers, 12 heads, MLP 3072, 21178 text tokens; decoder 512 x 12;
Vocos 512 x 8) and random weights. Speed and memory depend on the shapes, not the values; the
code loop is forced to a fixed token count (EOS is blocked until then), which the output says.

Each measurement runs in a fresh child process that never imports torch, so its peak RSS is what
a torch-free install pays. Run::

    python -m tts_bridge.bench_onnx OUT_DIR [--tokens 200] [--batches 1 4] [--threads N]

Building and exporting the checkpoint (once, cached in OUT_DIR) needs the 'chattts' extra plus
onnx and onnxscript; the measurements need onnxruntime, numpy and tokenizers only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tts_bridge.bench_chattts import write_random_checkpoint

_LOGGER = logging.getLogger(__name__)

# ChatTTS 0.2.5's official sizes (ChatTTS/config/config.py); Config() carries the rest.
BENCH_TEXT = "The washing machine has finished and the front door is locked."
_WARMUP_TOKENS = 4


# -- the full-size random checkpoint ----------------------------------------------------------


def measure(
    folder: Path, precision: str, batch: int, tokens: int, threads: int, *, spinning: bool = True
) -> dict[str, Any]:
    """Time the code loop and decoding for ``batch`` texts of exactly ``tokens`` codes."""
    from tts_bridge.engines.chattts_onnx import (
        ChatTTSOnnxModel,
        SamplingParams,
        code_prompt,
        precision_files,
        read_manifest,
    )
    from tts_bridge.engines.chattts_torch import read_spk_stat_file, sample_spk_emb

    # Before the graphs, as the engine does it (LZMA's transient stays below the later peak).
    hidden_size = int(json.loads((folder / "config.json").read_text())["hidden_size"])
    speaker = sample_spk_emb(read_spk_stat_file(folder / "spk_stat.json", hidden_size), 0)
    started = time.perf_counter()
    graphs = precision_files(read_manifest(folder), precision)
    model = ChatTTSOnnxModel(folder, graphs, threads=threads, spinning=spinning)
    load_s = time.perf_counter() - started
    prompts = [code_prompt(model.cleaner(BENCH_TEXT), 5, True)] * batch
    prompt = model.encode(prompts, speaker)
    # EOS blocked for every step: a fixed amount of work whatever the random weights say.
    warm = SamplingParams(min_new_token=_WARMUP_TOKENS, max_new_token=_WARMUP_TOKENS)
    model.generate(prompt, warm, seed=0)
    model.decode(np.zeros((_WARMUP_TOKENS, model.hidden_size), dtype=np.float32))

    params = SamplingParams(min_new_token=tokens, max_new_token=tokens)
    started = time.perf_counter()
    results = model.generate(prompt, params, seed=0)
    loop_s = time.perf_counter() - started
    times = model.times
    started = time.perf_counter()
    audio = [model.decode(r.hiddens) for r in results]
    decode_s = time.perf_counter() - started
    audio_s = sum(a.size for a in audio) / 24_000
    peak_kb = _peak_rss_kb()
    return {
        "precision": precision,
        "batch": batch,
        "tokens": tokens,
        "threads": threads,
        "spinning": spinning,
        "load_s": round(load_s, 2),
        "gpt_ms_per_step": round(1000 * times.gpt / times.steps, 2),
        "sampling_ms_per_step": round(1000 * times.sampling / times.steps, 2),
        "tokens_per_s": round(batch * tokens / loop_s, 1),
        "decode_s": round(decode_s, 3),
        "audio_s": round(audio_s, 2),
        "rtf": round((loop_s + decode_s) / audio_s, 3),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "torch_imported": "torch" in sys.modules,
    }


def _peak_rss_kb() -> int:
    """This process's peak RSS since exec (VmHWM). getrusage's ru_maxrss would do, but Linux
    carries it across fork and exec, so a child would report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    import resource  # not Linux: the best there is

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _run_child(
    folder: Path, precision: str, batch: int, tokens: int, threads: int, *, spinning: bool = True
) -> Any:
    command = [
        sys.executable,
        "-m",
        "tts_bridge.bench_onnx",
        "--child",
        str(folder),
        precision,
        str(batch),
        str(tokens),
        str(threads),
        "1" if spinning else "0",
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- driver -----------------------------------------------------------------------------------


def run_onnx_bench(
    out: Path,
    tokens: int = 200,
    batches: Sequence[int] = (1, 4),
    threads: int | None = None,
) -> dict[str, Any]:
    """Build (once) and export the full-size checkpoint under ``out``, quantize it, measure.

    Returns the results (also written to ``out/results.json``).
    """
    from tts_bridge.engines.chattts_onnx import MANIFEST_FILE, read_manifest

    threads = threads or os.cpu_count() or 1
    checkpoint = out / "checkpoint"
    export = out / "onnx"
    if not (checkpoint / "asset" / "spk_stat.json").is_file():
        _LOGGER.info("Building a full-size random checkpoint in %s", checkpoint)
        # The same official-shape random checkpoint as the torch bench (one writer for both).
        write_random_checkpoint(checkpoint)
    if not (export / MANIFEST_FILE).is_file():
        from tts_bridge.export.chattts_onnx import export_chattts

        export_chattts(checkpoint, export)
    if "int8" not in read_manifest(export)["variants"]:
        from tts_bridge.export.quantize import quantize_onnx

        quantize_onnx(export)

    rows = [
        _run_child(export, precision, batch, tokens, threads)
        for precision in ("fp32", "int8")
        for batch in batches
    ]
    # Without spinning worker threads (what a shared machine wants), for comparison.
    rows.append(_run_child(export, "int8", batches[0], tokens, threads, spinning=False))
    manifest = read_manifest(export)
    sizes = {
        rel: round(
            sum((export / f).stat().st_size for f in (rel, f"{rel}.data") if (export / f).is_file())
            / 1e6,
            1,
        )
        for rel in sorted(manifest["files"])
        if rel.endswith((".onnx", ".npy"))
    }
    results = {
        "note": (
            f"full-size ChatTTS architecture, random weights, {tokens} codes per text "
            f"(EOS blocked), {threads} threads, {os.cpu_count()} CPUs"
        ),
        "rows": rows,
        "file_sizes_mb": sizes,
        "variants": manifest["variants"],
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


def format_results(results: dict[str, Any]) -> str:
    lines = [results["note"], ""]
    header = "precision batch spin  GPT ms/step  sampling ms  tokens/s    RTF  peak RSS MB  torch"
    lines.append(header)
    for r in results["rows"]:
        lines.append(
            f"{r['precision']:<9} {r['batch']:>5} {'yes' if r['spinning'] else 'no':>4}  "
            f"{r['gpt_ms_per_step']:>11}  {r['sampling_ms_per_step']:>11}  "
            f"{r['tokens_per_s']:>8}  {r['rtf']:>5}  "
            f"{r['peak_rss_mb']:>11}  {r['torch_imported']}"
        )
    lines.append("")
    lines.append("file sizes (graph + its .data):")
    lines.extend(f"  {name}: {size} MB" for name, size in results["file_sizes_mb"].items())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        folder, precision, batch, tokens, threads, spinning = args[1:7]
        row = measure(
            Path(folder), precision, int(batch), int(tokens), int(threads), spinning=spinning == "1"
        )
        print(json.dumps(row))
        return 0
    parser = argparse.ArgumentParser(prog="python -m tts_bridge.bench_onnx")
    parser.add_argument("out", type=Path, help="work folder (checkpoint, export, results)")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, default=None)
    options = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    results = run_onnx_bench(options.out, options.tokens, options.batches, options.threads)
    print(format_results(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
