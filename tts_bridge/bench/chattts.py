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
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tts_bridge import __version__
from tts_bridge.bench.bandwidth import memory_bandwidth, step_floors
from tts_bridge.bench.util import (
    machine_info,
    patched,
    peak_rss_mb,
    rss_mb,
    run_child,
    time_first_chunk,
)
from tts_bridge.bench.util import table as _table
from tts_bridge.engines.chattts.common import (
    SAMPLE_RATE,
    SAMPLES_PER_TOKEN,
    TOKENS_PER_SECOND,
    expected_seconds,
)
from tts_bridge.engines.chattts.random_checkpoint import (
    OFFICIAL,
    official_sections,
    write_random_checkpoint,
)
from tts_bridge.engines.chattts.torch_engine import (
    SPK_STAT_FILE,
    _release_freed_heap,
    read_checkpoint,
)
from tts_bridge.manifests import add_model, expected_hashes

if TYPE_CHECKING:
    from tts_bridge.engines.chattts.onnx_format import Precision

_LOGGER = logging.getLogger(__name__)

NOTE = "full-size architecture, random weights: speed and memory are real, sound is not"
MODEL_NAME = "chattts-bench"
PRECISIONS = ("fp32", "int8")
TORCH_CASES = ("torch-fp32", "torch-int8")
ONNX_CASES = ("onnx-fp32", "onnx-int8", "onnx-int8-all", "onnx-int4")
QUANTIZED_CASES = ("onnx-int8", "onnx-int4")
"""Their GPT logits are compared with FP32's (top-1 agreement) in a child of their own
(int8-all runs int8's GPT; its own difference is the decoder's, in ``codec_fidelity``)."""
PEAK_RSS_CASES = ("onnx-int8", "onnx-int8-all")
"""The cases held to the peak RSS targets: the INT8 GPT with FP32 or INT8 decoders."""
CASES = (*TORCH_CASES, *ONNX_CASES)
WARMUP_TOKENS = 4
CHILD_TIMEOUT_S = 3600
CHECKPOINT_DIR = "checkpoint"
EXPORT_DIR = "onnx"
RESULTS_FILE = "results.json"

# Texts of similar length so a batch pads little; the 4th is Chinese like many real requests.
BENCH_TEXTS = (
    "the washing machine has finished.",
    "the front door has been open for five minutes.",
    "dinner is ready, please come to the kitchen.",
    "客厅温度二十一点五度，湿度百分之四十五。",
)
FIRST_AUDIO_TEXT = "The front door is open."
"""The one-sentence announcement whose first streamed audio is timed."""
SPEED_LEVEL = 5
"""[speed_5], ChatTTS's default and the engines' at speed 1.0."""


def default_first_audio_codes(text: str = FIRST_AUDIO_TEXT) -> int:
    """The engine's own length estimate of ``text`` in codes (106 for the announcement)."""
    return math.ceil(expected_seconds(text, SPEED_LEVEL) * TOKENS_PER_SECOND)


# -- one case (runs in a child process) ----------------------------------------------------------


def result_row(
    spec: dict[str, Any],
    *,
    started_load: float,
    import_s: float,
    load_s: float,
    loop_s: float,
    decode_s: float,
    audio_s: float,
    first_audio: dict[str, float] | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """One child's figures, the same fields for every case (both child modules build it)."""
    tokens, batch = int(spec["tokens"]), int(spec["batch"])
    row: dict[str, Any] = {
        "case": spec["case"],
        "batch": batch,
        "threads": spec["threads"],
        "tokens_per_text": tokens,
        "import_s": round(import_s, 2),
        "load_s": round(load_s, 2),
        # One step makes one code for every text in the batch; sampling is included.
        "ms_per_step": round(1000 * loop_s / tokens, 2),
        "tokens_per_s": round(batch * tokens / loop_s, 1),
        "loop_s": round(loop_s, 3),
        "decode_s": round(decode_s, 3),
        "audio_s": round(audio_s, 2),
        "loop_rtf": round(loop_s / audio_s, 3),
        "decode_rtf": round(decode_s / audio_s, 4),
        "rtf": round((loop_s + decode_s) / audio_s, 3),
        **extra,
    }
    if first_audio is not None:
        codes = int(spec["first_audio_codes"])
        # The forced count must have held (a little audio may be dropped as silence).
        expected = (2 * codes - 1) * SAMPLES_PER_TOKEN // 2
        if first_audio["total_samples"] < 0.8 * expected:
            raise RuntimeError(
                f"{spec['case']}: {first_audio['total_samples']} samples for {codes} forced "
                f"codes (about {expected} expected): the fixed code count did not hold"
            )
        row.update(
            {
                "first_audio_text": FIRST_AUDIO_TEXT,
                "first_audio_codes": codes,
                "first_audio_ms": round(first_audio["first_ms"], 1),
                "first_chunk_audio_s": round(first_audio["first_samples"] / SAMPLE_RATE, 2),
                "sentence_ms": round(first_audio["total_ms"], 1),
                "sentence_audio_s": round(first_audio["total_samples"] / SAMPLE_RATE, 2),
                "sentence_chunks": first_audio["chunks"],
            }
        )
    row.update(
        {
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "torch_imported": "torch" in sys.modules,
            "loadavg_start": round(started_load, 2),
            "loadavg_end": round(os.getloadavg()[0], 2),
        }
    )
    return row


def measure_torch(spec: dict[str, Any]) -> dict[str, Any]:
    """torch FP32 or INT8: load through ChatTTSEngine, time the loop, decoding, first audio."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tts_bridge.engines.chattts.common import ChatTTSOptions
    from tts_bridge.engines.chattts.torch_engine import ChatTTSEngine

    precision = spec["case"].removeprefix("torch-")
    if precision not in PRECISIONS:
        raise ValueError(f"not a torch case: {spec['case']}")
    batch, tokens = int(spec["batch"]), int(spec["tokens"])
    loadavg_start = os.getloadavg()[0]
    started = time.perf_counter()
    # Importing torch, transformers and ChatTTS is a cost of its own (the bridge pays it on the
    # first ChatTTS request); timed apart so load_s is the model itself.
    importlib.import_module("ChatTTS")
    import_s = time.perf_counter() - started
    engine = ChatTTSEngine(
        Path(spec["checkpoint"]),
        expected_sha256=expected_hashes(MODEL_NAME, Path(spec["models_dir"])),
        threads=int(spec["threads"]),
    )
    started = time.perf_counter()
    engine.load()  # verifies every file's SHA-256, as the bridge does
    load_s = time.perf_counter() - started
    rss_loaded = rss_mb()
    # The engine has no public way to fix the token count (it sizes each generation from the
    # text), so the bench drives the loaded Chat object with ChatTTS's own parameters.
    loaded = engine._loaded
    assert loaded is not None
    chat = loaded.chat
    # Every fixed-length run ends "incomplete" at max_new_token by design; not worth a warning.
    logging.getLogger("tts_bridge.engines.chattts.torch_engine.chattts").setLevel(logging.ERROR)

    quantize_s = 0.0
    quantized_linears = 0
    if precision == "int8":
        import torch

        started = time.perf_counter()
        # torch.ao.quantization carries no annotations; the call is the documented API.
        torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            chat.gpt.gpt, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
        )
        quantize_s = time.perf_counter() - started
        quantized_linears = sum(
            type(m).__module__.startswith("torch.ao.nn.quantized.dynamic")
            for m in chat.gpt.gpt.modules()
        )
        # Hand the heap freed by the swap back to the OS (as the engine does on unload). The
        # FP32 weights themselves stay mapped from model.safetensors (clean file pages that
        # the kernel can reclaim, but RSS counts them) while any GPT tensor still uses it.
        gc.collect()
        _release_freed_heap()
    rss_ready = rss_mb()

    speaker = loaded.default_speaker
    texts = [
        chat.normalizer(BENCH_TEXTS[i % len(BENCH_TEXTS)], True, True, None) for i in range(batch)
    ]
    _generate(chat, texts, speaker, WARMUP_TOKENS)
    loop_s, decode_s, _generated, samples = _generate(chat, texts, speaker, tokens)
    # transformers memory-maps the GPT weights: they become resident as the first generation
    # touches them, so the RSS of a model in use is read after the run, not after loading.
    rss_in_use = rss_mb()
    first_audio = None
    codes = int(spec["first_audio_codes"])
    if codes:
        with _torch_fixed_codes(chat, codes):
            first_audio = time_first_chunk(
                lambda: engine.synthesize(FIRST_AUDIO_TEXT, None, ChatTTSOptions())
            )
    return result_row(
        spec,
        started_load=loadavg_start,
        import_s=import_s,
        load_s=load_s,
        loop_s=loop_s,
        decode_s=decode_s,
        audio_s=samples * batch / SAMPLE_RATE,
        first_audio=first_audio,
        extra={
            "quantize_s": round(quantize_s, 2),
            "quantized_linears": quantized_linears,
            "samples_per_text": samples,
            "rss_loaded_mb": round(rss_loaded, 1),
            "rss_ready_mb": round(rss_ready, 1),
            "rss_in_use_mb": round(rss_in_use, 1),
        },
    )


@contextlib.contextmanager
def _torch_fixed_codes(chat: Any, codes: int) -> Iterator[None]:
    """Make ChatTTSEngine's next generations exactly ``codes`` long (EOS blocked until then)."""
    original = chat.InferCodeParams

    def fixed(**kwargs: Any) -> Any:
        kwargs["min_new_token"] = kwargs["max_new_token"] = codes
        return original(**kwargs)

    with patched(chat, "InferCodeParams", fixed):
        yield


def _generate(
    chat: Any, texts: list[str], speaker: str, tokens: int
) -> tuple[float, float, int, int]:
    """One batch through the GPT and then the decoder + Vocos, the two halves of Chat._infer.

    Returns (code loop seconds, decode seconds, tokens generated, samples per text).
    """
    params = chat.InferCodeParams(
        prompt=f"[speed_{SPEED_LEVEL}]",
        spk_emb=speaker,
        temperature=0.3,
        top_P=0.7,
        top_K=20,
        max_new_token=tokens,
        min_new_token=tokens,  # EOS is masked until here: exactly `tokens` per text
        show_tqdm=False,
        manual_seed=0,
    )
    started = time.perf_counter()
    result = next(chat._infer_code(texts, False, chat.device, True, params))
    loop_s = time.perf_counter() - started
    generated = sum(int(h.shape[0]) for h in result.hiddens)
    started = time.perf_counter()
    wavs = chat._decode_to_wavs(result.hiddens, True)
    decode_s = time.perf_counter() - started
    result.destroy()
    if generated != tokens * len(texts):
        raise RuntimeError(f"expected {tokens} tokens per text, the GPT made {generated} in all")
    return loop_s, decode_s, generated, int(wavs.shape[-1])


# -- the bench ------------------------------------------------------------------------------------

FASTEST = (
    "import_s",
    "load_s",
    "quantize_s",
    "ms_per_step",
    "gpt_ms_per_step",
    "sampling_ms_per_step",
    "loop_s",
    "decode_s",
    "loop_rtf",
    "decode_rtf",
    "rtf",
    "first_audio_ms",
    "sentence_ms",
)
"""Figures where the best round is the lowest."""
HIGHEST = (
    "tokens_per_s",
    "rss_loaded_mb",
    "rss_ready_mb",
    "rss_in_use_mb",
    "peak_rss_mb",
    "peak_rss_loaded_mb",
    "peak_rss_generated_mb",
    "loadavg_start",
    "loadavg_end",
)
"""Throughput (best = highest) and memory and load (reported at their highest)."""

TABLE_COLUMNS = {
    "case": "case",
    "batch": "batch",
    "ms_per_step": "ms/step",
    "tokens_per_s": "tokens/s",
    "gpt_ms_per_step": "GPT ms/step",
    "sampling_ms_per_step": "sampling ms/step",
    "decode_s": "decode s",
    "rtf": "RTF e2e",
    "first_audio_ms": "first audio ms",
    "load_s": "load s",
    "peak_rss_mb": "peak RSS MB",
    "torch_imported": "torch imported",
}
"""Printed columns: result field -> heading."""

MEMORY_COLUMNS = {
    "rss_loaded_mb": "RSS loaded",
    "peak_rss_loaded_mb": "peak at load",
    "peak_rss_generated_mb": "peak after the code loop",
    "rss_in_use_mb": "RSS after decoding",
    "peak_rss_mb": "peak (with first audio)",
}
"""The ONNX rows' memory by stage: result field -> heading."""

TARGET_TOKENS_PER_S = 80.0
TARGET_RTF = 0.65
TARGET_BATCH_GAIN = 2.5
TARGET_PEAK_RSS_MB = {1: 450.0, 4: 600.0}
"""Peak RSS per batch size; any other batch size is held to the largest of these."""
TARGET_FIRST_AUDIO_MS = 400.0
TARGET_FLOOR_MULTIPLE = 1.4


def combine_rounds(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (case, batch), in first-seen order: the best figure of its rounds."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["case"], run["batch"]), []).append(run)
    rows = []
    for group in groups.values():
        row = {k: v for k, v in group[0].items() if k != "round"}
        row["rounds"] = len(group)
        for keys, pick in ((FASTEST, min), (HIGHEST, max)):
            for key in keys:
                values = [r[key] for r in group if r.get(key) is not None]
                if values:
                    row[key] = pick(values)
        row["torch_imported"] = any(r["torch_imported"] for r in group)
        timed = [r for r in group if r.get("first_audio_parts")]
        if timed:  # the parts of the fastest first audio, the one shown
            row["first_audio_parts"] = min(timed, key=lambda r: r["first_audio_ms"])[
                "first_audio_parts"
            ]
        rows.append(row)
    return rows


def _find(rows: Sequence[dict[str, Any]], case: str, batch: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["case"] == case and r["batch"] == batch), None)


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def evaluate_targets(
    rows: Sequence[dict[str, Any]], floors: Sequence[dict[str, Any]] = ()
) -> list[dict[str, str]]:
    """The issue's targets for ONNX INT8, each with the figure and PASS, MISS or n/a."""
    one = _find(rows, "onnx-int8", 1)
    four = _find(rows, "onnx-int8", 4)
    targets: list[tuple[str, str, bool | None]] = []
    if one is None:
        targets.append((f"batch 1 >= {TARGET_TOKENS_PER_S:g} tokens/s", "not measured", None))
        targets.append((f"batch 1 RTF <= {TARGET_RTF:g} end to end", "not measured", None))
    else:
        tps, rtf = one["tokens_per_s"], one["rtf"]
        targets.append(
            (f"batch 1 >= {TARGET_TOKENS_PER_S:g} tokens/s", f"{tps}", tps >= TARGET_TOKENS_PER_S)
        )
        targets.append((f"batch 1 RTF <= {TARGET_RTF:g} end to end", f"{rtf}", rtf <= TARGET_RTF))
    name = f"batch 4 aggregate >= {TARGET_BATCH_GAIN:g}x batch 1"
    if one is None or four is None:
        targets.append((name, "not measured", None))
    else:
        gain = four["tokens_per_s"] / one["tokens_per_s"]
        targets.append((name, f"{gain:.2f}x", gain >= TARGET_BATCH_GAIN))
    for row in (r for r in rows if r["case"] in PEAK_RSS_CASES):
        peak, torch_free = row["peak_rss_mb"], not row["torch_imported"]
        limit = TARGET_PEAK_RSS_MB.get(row["batch"], max(TARGET_PEAK_RSS_MB.values()))
        figure = f"{peak:.0f} MB, " + ("torch-free" if torch_free else "torch imported")
        variant = "" if row["case"] == "onnx-int8" else f", {row['case'].removeprefix('onnx-')}"
        targets.append(
            (
                f"torch-free process peak RSS <= {limit:g} MB (batch {row['batch']}{variant})",
                figure,
                torch_free and peak <= limit,
            )
        )
    name = f"batch 1 GPT step <= {TARGET_FLOOR_MULTIPLE:g}x the bandwidth floor"
    floor = next((f for f in floors if f["case"] == "onnx-int8" and f["batch"] == 1), None)
    if floor is None:
        targets.append((name, "not measured", None))
    else:
        multiple = floor["x floor"]
        targets.append((name, f"{multiple:.2f}x", multiple <= TARGET_FLOOR_MULTIPLE))
    name = f"first streamed audio <= {TARGET_FIRST_AUDIO_MS:g} ms"
    timed = next((r for r in rows if r["case"] == "onnx-int8" and "first_audio_ms" in r), None)
    if timed is None:
        targets.append((name, "not measured", None))
    else:
        ms = timed["first_audio_ms"]
        targets.append((name, f"{ms:.0f} ms", ms <= TARGET_FIRST_AUDIO_MS))
    return [
        {"target": f"ONNX INT8 {name}", "figure": figure, "result": _verdict(ok)}
        for name, figure, ok in targets
    ]


def file_sizes(checkpoint: Path, export: Path, cases: Sequence[str]) -> list[dict[str, Any]]:
    """The files each case loads (MB), and the GPT's part of them."""
    rows: list[dict[str, Any]] = []
    for case in cases:
        if case in TORCH_CASES:
            files = [p for p in (checkpoint / "asset").rglob("*") if p.is_file()]
            gpt = [checkpoint / "asset" / "gpt" / "model.safetensors"]
            note = "checkpoint (safetensors)"
            if case == "torch-int8":
                note += "; the GPT is quantized in memory at load"
        else:
            from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
            from tts_bridge.engines.chattts.onnx_format import (
                external_data_path,
                precision_files,
                read_manifest,
            )

            precision = case.removeprefix("onnx-")
            engine = ChatTTSOnnxEngine(export, precision=_precision(case))
            files = [export / rel for rel in engine.files()]
            graph = export / precision_files(read_manifest(export), precision)["gpt"]
            gpt = [graph, external_data_path(graph)]
            note = "ONNX export (graph + .data, numpy embeddings, tokenizer)"
        gpt_bytes = sum(p.stat().st_size for p in gpt if p.is_file())
        rows.append(
            {
                "case": case,
                "files_mb": round(sum(p.stat().st_size for p in files) / 1e6, 1),
                "gpt_mb": round(gpt_bytes / 1e6, 1),
                # The graph's weights are nearly all of its files; a step reads each once.
                "gpt_bytes": gpt_bytes,
                "what": note,
            }
        )
    return rows


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


def _precision(case: str) -> Precision:
    precision = case.removeprefix("onnx-")
    if precision not in ("fp32", "int8", "int4", "int8-all"):
        raise ValueError(f"not an ONNX case: {case}")
    return cast("Precision", precision)


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
    hidden_size: int = OFFICIAL.hidden_size,
    num_layers: int = OFFICIAL.num_layers,
    first_audio_codes: int | None = None,
    spinning: bool = True,
) -> dict[str, Any]:
    """Measure every case x batch size, ``rounds`` times interleaved; print, write JSON.

    ``spinning`` is the ONNX sessions' spinning (onnxruntime's default, on): off is the fair
    choice on a host whose other programs keep the cores busy, where spinning is a cliff.

    ``out`` is the work folder: the checkpoint in ``out/checkpoint`` and the export in
    ``out/onnx`` are made when missing (``hidden_size``/``num_layers`` size a new checkpoint;
    an existing one is used as it is), the results go to ``out/results.json``.
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
    spec = [str(checkpoint), str(hidden_size), str(num_layers)]
    report["checkpoint"] = run_child(__name__, ["checkpoint", *spec], timeout=CHILD_TIMEOUT_S)
    dims = read_checkpoint(checkpoint)
    report["checkpoint"]["dims"] = asdict(dims)
    if any(case in ONNX_CASES for case in cases) and not _onnx_ready(export, cases):
        print(f"exporting to ONNX and quantizing in {export} ...", file=sys.stderr)
        extra = [c.removeprefix("onnx-") for c in ("onnx-int4", "onnx-int8-all") if c in cases]
        report["export"] = run_child(
            __name__,
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
                            __name__, ["measure", json.dumps(spec_)], timeout=CHILD_TIMEOUT_S
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


def format_report(report: dict[str, Any]) -> str:
    """The printed form: note and settings, the figures, file sizes, the targets."""
    dims = report["checkpoint"]["dims"]
    rounds = report["rounds"]
    first = report["first_audio"]
    lines = [
        report["note"],
        f"ChatTTS GPT {dims['hidden_size']} hidden x {dims['num_hidden_layers']} layers; "
        f"{report['tokens_per_text']} tokens per text (EOS blocked until then), "
        f"{report['threads']} threads (ONNX spinning "
        f"{'on' if report.get('onnx_spinning', True) else 'off'}), "
        + ("1 round" if rounds == 1 else f"best of {rounds} interleaved rounds (memory: highest)"),
        f"first audio: {first['text']!r} through the engine's synthesize, EOS blocked for a fixed "
        f"{first['codes']} codes (random weights stop at an arbitrary EOS); time to its first "
        "yielded chunk",
        "ms/step: one code for every text of the batch; tokens/s: all texts together; RTF e2e: "
        "code loop with sampling, decoder, Vocos and ISTFT over the audio's duration",
        "",
    ]
    shown = [
        {
            heading: ("" if row.get(field) is None else row[field])
            for field, heading in TABLE_COLUMNS.items()
        }
        for row in report["results"]
    ]
    lines.append(_table(shown, list(TABLE_COLUMNS.values())))
    lines += ["", "files loaded:"]
    sizes = [
        {"case": r["case"], "files MB": r["files_mb"], "GPT MB": r["gpt_mb"], "what": r["what"]}
        for r in report["file_sizes"]
    ]
    lines.append(_table(sizes, ["case", "files MB", "GPT MB", "what"]))
    memory = [
        {
            "case": r["case"],
            "batch": r["batch"],
            **{heading: r[key] for key, heading in MEMORY_COLUMNS.items() if key in r},
        }
        for r in report["results"]
        if "peak_rss_loaded_mb" in r
    ]
    if memory:
        lines += ["", "where the peak RSS (MB) is set, per stage (VmRSS now, VmHWM so far):"]
        lines.append(_table(memory, ["case", "batch", *MEMORY_COLUMNS.values()]))
    bandwidth = report["bandwidth"]
    lines += [
        "",
        f"memory bandwidth at start: {bandwidth['gb_per_s']} GB/s ({bandwidth['how']}, "
        f"{bandwidth['threads']} threads); a GPT step reads every weight once, so its floor is "
        "weights / bandwidth (the KV cache read, shown beside, is left out of it):",
    ]
    if report["floors"]:
        lines.append(_table(report["floors"], list(report["floors"][0])))
    parts = [
        {"case": r["case"], "first audio ms": r["first_audio_ms"], **r["first_audio_parts"]}
        for r in report["results"]
        if r.get("first_audio_parts")
    ]
    if parts:
        lines += [
            "",
            "first streamed audio, where its time went: the prefill step, the codes made before "
            "the first piece is sent (GPT steps after the prefill + sampling), the rest (text, "
            "prompt, the first piece's decode); with the early start (approximate_ms of audio "
            "from previews, their SNR against the exact audio) and without it (exact_*):",
            _table(parts, list(parts[0])),
        ]
    contexts = [
        {"case": r["case"], **{f"L={k}": v for k, v in r["early_snr_by_context"].items()}}
        for r in report["results"]
        if r.get("early_snr_by_context")
    ]
    if contexts:
        lines += [
            "",
            "early start: SNR (dB) of the first piece's codes against the exact audio, by the "
            "codes of right-hand context it waits for (random weights: an indicator only):",
            _table(contexts, list(contexts[0])),
        ]
    if report["fidelity"]:
        lines += [
            "",
            "GPT logits against FP32, teacher-forced on FP32's greedy codes (random weights: "
            "an indicator only):",
            _table(
                report["fidelity"],
                ["case", "tokens", "top1_agreement", "max_abs_logit_diff"],
            ),
        ]
    if report.get("codec_fidelity"):
        lines += [
            "",
            "INT8 decoder and Vocos (int8-all) against FP32's on the same hidden states, the "
            "waveform's SNR (one shot, and streamed in the engine's pieces):",
            _table(
                report["codec_fidelity"],
                ["case", "tokens", "snr_db", "streamed_snr_db", "max_abs_diff"],
            ),
        ]
    full_size = report["note"] == NOTE
    lines += ["", "targets" + (":" if full_size else ", set for the full-size model:")]
    lines.append(_table(report["targets"], ["target", "figure", "result"]))
    rows = report["results"]
    busiest = max(max(r["loadavg_start"], r["loadavg_end"]) for r in rows)
    cpus = report["machine"]["cpus"]
    if busiest > cpus / 2:
        # Threads stall when the cores are shared; say so next to the figures.
        lines.append(
            f"\nthe machine was busy (1-minute load average up to {busiest:.1f} on {cpus} "
            "cores): these figures understate the speed"
        )
    return "\n".join(lines)


def _child_main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result: dict[str, Any]
    if argv[:1] == ["checkpoint"] and len(argv) == 4:
        checkpoint = Path(argv[1])
        result = {"built": False}
        # spk_stat.json is written last: its presence means a complete checkpoint.
        if not (checkpoint / SPK_STAT_FILE).is_file():
            started = time.perf_counter()
            size = replace(OFFICIAL, hidden_size=int(argv[2]), num_layers=int(argv[3]))
            write_random_checkpoint(checkpoint, size)
            result = {"built": True, "build_s": round(time.perf_counter() - started, 1)}
        result["official_sections"] = official_sections(checkpoint)
    elif argv[:1] == ["export"] and len(argv) == 4:
        from tts_bridge.engines.chattts.onnx_format import MANIFEST_FILE, read_manifest
        from tts_bridge.engines.chattts.quantize import (
            quantize_int4,
            quantize_int8_all,
            quantize_onnx,
        )

        checkpoint, export = Path(argv[1]), Path(argv[2])
        started = time.perf_counter()
        if not (export / MANIFEST_FILE).is_file():
            from tts_bridge.engines.chattts.export import export_chattts

            export_chattts(checkpoint, export)
        exported = time.perf_counter()
        if "int8" not in read_manifest(export)["variants"]:
            quantize_onnx(export)
        extra = set(argv[3].split(","))  # the optional variants: int4, int8-all (or none)
        if "int4" in extra and "int4" not in read_manifest(export)["variants"]:
            quantize_int4(export)
        if "int8-all" in extra and "int8-all" not in read_manifest(export)["variants"]:
            quantize_int8_all(export)
        result = {
            "export_s": round(exported - started, 1),
            "quantize_s": round(time.perf_counter() - exported, 1),
        }
    elif argv[:1] == ["measure"] and len(argv) == 2:
        result = measure_torch(json.loads(argv[1]))
    else:
        print(
            "usage: python -m tts_bridge.bench.chattts checkpoint DEST HIDDEN LAYERS\n"
            "       python -m tts_bridge.bench.chattts export CHECKPOINT DEST int4,int8-all|none\n"
            "       python -m tts_bridge.bench.chattts measure SPEC_JSON",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
