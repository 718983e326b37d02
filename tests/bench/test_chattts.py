"""The ChatTTS bench on small models and a handful of tokens: the same code as the full-size run.

One run builds a checkpoint with a small GPT (the decoder, DVAE and Vocos keep ChatTTS's official
sizes at any GPT size, so this also checks that the generated files reproduce ChatTTS's own
Config for them) and measures the torch cases; one runs every case -- torch and ONNX, FP32 and
INT8, child processes, export, target table -- on the tiny test checkpoint. The numbers
themselves are not asserted: speed is shown by the benchmark, not by timed unit tests.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tts_bridge.bench import chattts as bench_chattts
from tts_bridge.bench import onnx_backends as bench_onnx
from tts_bridge.bench.bandwidth import memory_bandwidth, step_floors
from tts_bridge.bench.chattts import run_chattts_bench
from tts_bridge.bench.chattts_measure import CASES, ONNX_CASES, TORCH_CASES
from tts_bridge.bench.chattts_report import NOTE, TABLE_COLUMNS, combine_rounds, evaluate_targets
from tts_bridge.cli import main as cli

needs_chattts = pytest.mark.skipif(
    importlib.util.find_spec("ChatTTS") is None,
    reason="the 'chattts' extra (torch, chattts) is not installed",
)

TOKENS = 5
FIRST_AUDIO_CODES = 24
"""Longer than the default early start's 16 codes and the tiny model's first exact piece
(8 codes + 8.5 of lookahead), so the first audio is timed both ways."""


@pytest.mark.slow
@needs_chattts
def test_bench_builds_a_checkpoint_and_measures_torch_through_the_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = 2
    report = run_chattts_bench(
        tmp_path,
        tokens=TOKENS,
        batches=(batch,),
        cases=TORCH_CASES,
        hidden_size=32,
        num_layers=1,
        first_audio_codes=FIRST_AUDIO_CODES,
    )

    printed = capsys.readouterr().out
    assert all(heading in printed for heading in TABLE_COLUMNS.values())
    assert json.loads((tmp_path / "results.json").read_text(encoding="utf-8")) == report
    assert NOTE not in printed and "not the full-size architecture" in report["note"]
    assert not (tmp_path / "onnx").exists()  # no ONNX case, no export

    checkpoint = report["checkpoint"]
    assert checkpoint["built"]
    # Only the GPT is shrunk; the codec parts have ChatTTS's official sizes.
    assert {"dvae", "vocos"} <= set(checkpoint["official_sections"])
    assert "gpt" not in checkpoint["official_sections"]
    dims = checkpoint["dims"]
    assert (dims["num_vq"], dims["num_audio_tokens"], dims["num_text_tokens"]) == (4, 626, 21178)
    assert dims["decoder"]["idim"] == 16  # half the GPT hidden size

    rows = report["results"]
    assert [(r["case"], r["batch"]) for r in rows] == [("torch-fp32", batch), ("torch-int8", batch)]
    for row in rows:
        # Vocos' centred ISTFT: two mel frames of 256 samples per token, less one hop.
        assert row["samples_per_text"] == (2 * TOKENS - 1) * 256
        assert row["tokens_per_s"] > 0 and row["rtf"] > 0 and row["first_audio_ms"] > 0
        assert row["peak_rss_mb"] >= row["rss_in_use_mb"] > 0
        assert row["torch_imported"]
        assert row["first_audio_codes"] == FIRST_AUDIO_CODES
    assert rows[0]["quantized_linears"] == 0
    # Every Linear of the GPT (q, k, v, o, gate, up, down per layer) became INT8.
    assert rows[1]["quantized_linears"] == 7 * dims["num_hidden_layers"]
    # No ONNX INT8 row: every target says so rather than passing or failing.
    assert {t["result"] for t in report["targets"]} == {"n/a"}


@pytest.mark.slow
@needs_chattts
def test_combined_bench_on_the_tiny_checkpoint(
    tmp_path: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint")
    batches = (1, 4)

    report = run_chattts_bench(
        tmp_path, tokens=TOKENS, batches=batches, first_audio_codes=FIRST_AUDIO_CODES
    )

    printed = capsys.readouterr().out
    assert not report["checkpoint"]["built"]  # the checkpoint in OUT/checkpoint is used as is
    manifest = json.loads((tmp_path / "onnx" / "manifest.json").read_text(encoding="utf-8"))
    # exported and quantized once
    assert set(manifest["variants"]) == {"fp32", "int8", "int4", "int8-all"}
    assert json.loads((tmp_path / "results.json").read_text(encoding="utf-8")) == report
    assert f"{TOKENS} tokens per text" in printed
    assert "random weights: speed and memory are real, sound is not" in printed

    rows = report["results"]
    assert [(r["case"], r["batch"]) for r in rows] == [(c, b) for c in CASES for b in batches]
    for row in rows:
        # Each case in its own process: the ONNX ones never import torch, the torch ones do.
        assert row["torch_imported"] == (row["case"] in TORCH_CASES)
        assert row["tokens_per_text"] == TOKENS and row["rounds"] == 1
        assert row["samples_per_text"] == (2 * TOKENS - 1) * 256
        # First audio is timed once per case, in the first batch size's process.
        assert ("first_audio_ms" in row) == (row["batch"] == batches[0])
    for row in rows:
        if row["case"] in ONNX_CASES:
            assert row["gpt_ms_per_step"] > 0 and row["sampling_ms_per_step"] >= 0
            # Memory by stage: VmHWM only grows.
            assert row["peak_rss_loaded_mb"] <= row["peak_rss_generated_mb"] <= row["peak_rss_mb"]
        if "first_audio_ms" in row:
            assert 0 < row["first_audio_ms"] <= row["sentence_ms"]
            # The forced code count held (a sample or two may be dropped as silence).
            assert row["sentence_audio_s"] == pytest.approx(
                (2 * FIRST_AUDIO_CODES - 1) * 256 / 24_000, abs=0.01
            )
    assert [s["case"] for s in report["file_sizes"]] == list(CASES)
    sizes = {s["case"]: s for s in report["file_sizes"]}
    assert sizes["onnx-int8"]["gpt_mb"] < sizes["onnx-fp32"]["gpt_mb"]

    targets = report["targets"]
    # tokens/s, RTF, batch gain, peak RSS at batch 1 and 4 (int8 and int8-all), the floor,
    # first audio
    assert len(targets) == 9
    floors = {(f["case"], f["batch"]): f for f in report["floors"]}
    assert set(floors) == {(c, b) for c in ONNX_CASES for b in batches}
    assert all(f["x floor"] > 0 and f["floor ms"] > 0 for f in floors.values())
    assert "memory bandwidth at start" in printed
    # The quantized GPTs' logits are compared with FP32's, and the first audio is broken down.
    fidelity = {f["case"]: f for f in report["fidelity"]}
    assert set(fidelity) == {"onnx-int8", "onnx-int4"}
    assert all(0 < f["top1_agreement"] <= 1 for f in fidelity.values())
    assert fidelity["onnx-int8"]["max_abs_logit_diff"] > 0
    # The INT8 decoder and Vocos are compared with FP32's on the same hidden states.
    (codec,) = report["codec_fidelity"]
    assert codec["case"] == "onnx-int8-all" and codec["tokens"] == TOKENS
    assert 0 < codec["snr_db"] < 200 and 0 < codec["streamed_snr_db"] < 200
    assert "INT8 decoder and Vocos (int8-all)" in printed
    for row in rows:
        if row["case"] in ONNX_CASES and "first_audio_ms" in row:
            parts = row["first_audio_parts"]
            assert parts["prefill_ms"] > 0 and 1 <= parts["codes"] <= FIRST_AUDIO_CODES
            assert parts["prefill_ms"] + parts["codes_ms"] <= row["first_audio_ms"]
            # With the early start (the default) and without, its deviation by context.
            assert parts["codes"] < parts["exact_codes"] and parts["previews"] >= 1
            assert parts["exact_prefill_ms"] + parts["exact_codes_ms"] <= parts["exact_ms"]
            assert parts["snr_db"] is not None and parts["approximate_ms"] > 0
            assert len(row["early_snr_by_context"]) > 1
    assert all(t["result"] in ("PASS", "MISS") for t in targets)
    assert all(t["target"] in printed and t["figure"] in printed for t in targets)


def _row(case: str, batch: int, **figures: Any) -> dict[str, Any]:
    base = {"case": case, "batch": batch, "torch_imported": False, "peak_rss_mb": 500.0}
    return {**base, **figures}


def test_rounds_keep_the_best_speed_and_the_highest_memory() -> None:
    runs = [
        _row("onnx-int8", 1, tokens_per_s=50.0, rtf=0.9, peak_rss_mb=480.0, first_audio_ms=900.0),
        _row("onnx-int8", 4, tokens_per_s=150.0, rtf=0.4, peak_rss_mb=600.0),
        _row("onnx-int8", 1, tokens_per_s=60.0, rtf=1.1, peak_rss_mb=490.0, first_audio_ms=800.0),
        _row("onnx-int8", 4, tokens_per_s=140.0, rtf=0.3, peak_rss_mb=610.0),
    ]

    one, four = combine_rounds(runs)

    assert (one["tokens_per_s"], one["rtf"], one["peak_rss_mb"]) == (60.0, 0.9, 490.0)
    assert one["first_audio_ms"] == 800.0 and one["rounds"] == 2
    assert (four["tokens_per_s"], four["rtf"], four["peak_rss_mb"]) == (150.0, 0.3, 610.0)
    assert "first_audio_ms" not in four


def test_targets_say_pass_miss_or_not_measured() -> None:
    rows = [
        _row("onnx-int8", 1, tokens_per_s=85.0, rtf=0.7, first_audio_ms=450.0, peak_rss_mb=440.0),
        _row("onnx-int8", 4, tokens_per_s=200.0, rtf=0.3, peak_rss_mb=650.0),
    ]
    floors = [{"case": "onnx-int8", "batch": 1, "x floor": 1.3}]

    results = {t["target"]: t["result"] for t in evaluate_targets(rows, floors)}

    assert results == {
        "ONNX INT8 batch 1 >= 80 tokens/s": "PASS",
        "ONNX INT8 batch 1 RTF <= 0.65 end to end": "MISS",
        "ONNX INT8 batch 4 aggregate >= 2.5x batch 1": "MISS",
        "ONNX INT8 torch-free process peak RSS <= 450 MB (batch 1)": "PASS",
        "ONNX INT8 torch-free process peak RSS <= 600 MB (batch 4)": "MISS",
        "ONNX INT8 batch 1 GPT step <= 1.4x the bandwidth floor": "PASS",
        "ONNX INT8 first streamed audio <= 400 ms": "MISS",
    }
    # A process that imported torch does not meet the torch-free target, whatever its size.
    rows[0]["torch_imported"] = True
    results = {t["target"]: t["result"] for t in evaluate_targets(rows)}
    assert results["ONNX INT8 torch-free process peak RSS <= 450 MB (batch 1)"] == "MISS"
    assert results["ONNX INT8 batch 1 GPT step <= 1.4x the bandwidth floor"] == "n/a"
    assert {t["result"] for t in evaluate_targets([])} == {"n/a"}


def test_step_floor_is_the_weights_over_the_bandwidth() -> None:
    rows = [
        _row("onnx-int8", 1, gpt_ms_per_step=12.0, kv_mb_per_step_mean=3.0),
        _row("onnx-fp32", 4, gpt_ms_per_step=30.0),
        _row("torch-fp32", 1, gpt_ms_per_step=50.0),  # no graph: no floor
    ]
    weights = {"onnx-int8": 200_000_000, "onnx-fp32": 800_000_000}

    floors = step_floors(rows, weights, gb_per_s=40.0)

    assert [(f["case"], f["batch"]) for f in floors] == [("onnx-int8", 1), ("onnx-fp32", 4)]
    assert floors[0]["floor ms"] == 5.0 and floors[0]["x floor"] == 2.4
    assert floors[0]["weights MB/step"] == 200.0 and floors[0]["KV MB/step (mean)"] == 3.0
    assert floors[1]["floor ms"] == 20.0 and floors[1]["x floor"] == 1.5


def test_memory_bandwidth_is_measured_with_the_given_threads() -> None:
    measured = memory_bandwidth(2, buffer_bytes=8 * 1024 * 1024, repeats=2)

    assert measured["gb_per_s"] > 0 and measured["threads"] == 2
    assert measured["buffer_mb"] == 8


@needs_chattts
def test_rounds_are_interleaved(
    tmp_path: Path,
    tiny_checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copytree(tiny_checkpoint, tmp_path / "checkpoint")
    calls: list[tuple[str, int]] = []

    def fake_child(module: str, args: list[str], *, timeout: float) -> dict[str, Any]:
        if args[0] == "checkpoint":
            return {"built": False, "official_sections": []}
        spec = json.loads(args[1])
        calls.append((spec["case"], spec["batch"]))
        assert spec["spinning"] is False  # the bench's choice reaches every child
        figures = {"tokens_per_s": 1.0, "loadavg_start": 0.0, "loadavg_end": 0.0}
        return _row(spec["case"], spec["batch"], tokens_per_text=spec["tokens"], **figures)

    monkeypatch.setattr(bench_chattts, "run_child", fake_child)
    report = run_chattts_bench(
        tmp_path, tokens=3, batches=(1, 4), rounds=2, cases=TORCH_CASES, spinning=False
    )

    one_round = [(c, b) for c in TORCH_CASES for b in (1, 4)]
    assert calls == one_round * 2
    assert [r["round"] for r in report["runs"]] == [1] * 4 + [2] * 4
    assert [r["rounds"] for r in report["results"]] == [2] * 4
    printed = capsys.readouterr().out
    assert "best of 2 interleaved rounds" in printed and "spinning off" in printed


def test_cli_and_onnx_alias_run_the_combined_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def record(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append((args, kwargs))
        return {}

    monkeypatch.setattr(bench_chattts, "run_chattts_bench", record)
    config = tmp_path / "config.yaml"
    config.write_text("{}\n", encoding="utf-8")

    argv = ["bench", "--config", str(config), "--chattts", "--tokens", "20", "--rounds", "3"]
    assert cli.main([*argv, "--out", str(tmp_path / "out")]) == 0
    assert bench_onnx.main([str(tmp_path / "onnx-out"), "--tokens", "7", "--batches", "1"]) == 0

    (cli_args, cli_kwargs), (alias_args, alias_kwargs) = calls
    assert cli_args == (tmp_path / "out", 20, [1, 4]) and cli_kwargs["rounds"] == 3
    assert alias_args == (tmp_path / "onnx-out", 7, [1]) and alias_kwargs["cases"] == ONNX_CASES


def test_int8_all_rows_are_held_to_the_peak_rss_targets_under_their_name() -> None:
    rows = [
        _row("onnx-int8-all", 1, peak_rss_mb=420.0),
        _row("onnx-int8-all", 4, peak_rss_mb=610.0),
        _row("onnx-int4", 1, peak_rss_mb=400.0),
    ]

    results = {t["target"]: t["result"] for t in evaluate_targets(rows)}

    peak = {k: v for k, v in results.items() if "peak RSS" in k}
    assert peak == {
        "ONNX INT8 torch-free process peak RSS <= 450 MB (batch 1, int8-all)": "PASS",
        "ONNX INT8 torch-free process peak RSS <= 600 MB (batch 4, int8-all)": "MISS",
    }
