"""The ChatTTS bench's figures: rounds combined, the targets judged, file sizes, the printed
report (``tts_bridge.bench.chattts`` runs the cases; this turns their rows into results)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tts_bridge.bench.chattts_measure import PEAK_RSS_CASES, TORCH_CASES
from tts_bridge.bench.util import table as _table

if TYPE_CHECKING:
    from tts_bridge.engines.chattts.onnx_format import Precision

NOTE = "full-size architecture, random weights: speed and memory are real, sound is not"

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


def _precision(case: str) -> Precision:
    precision = case.removeprefix("onnx-")
    if precision not in ("fp32", "int8", "int4", "int8-all"):
        raise ValueError(f"not an ONNX case: {case}")
    return cast("Precision", precision)


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
