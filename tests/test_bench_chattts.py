"""The ChatTTS bench on a small GPT and a handful of tokens: the same code as the full-size run.

The decoder, DVAE and Vocos keep ChatTTS's official sizes at any GPT size, so this also checks
that the generated files reproduce ChatTTS's own Config for them. The numbers themselves are
not asserted: speed is shown by the benchmark, not by timed unit tests.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tts_bridge.bench_chattts import NOTE, TABLE_COLUMNS, run_chattts_bench

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("ChatTTS") is None,
        reason="the 'chattts' extra (torch, chattts) is not installed",
    ),
]

TOKENS = 5
BATCH = 2


def test_bench_measures_fp32_and_int8_through_the_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results" / "chattts.json"

    report = run_chattts_bench(out, tokens=TOKENS, batches=(BATCH,), hidden_size=32, num_layers=1)

    printed = capsys.readouterr().out
    assert NOTE in printed
    assert all(column in printed for column in TABLE_COLUMNS)
    assert json.loads(out.read_text(encoding="utf-8")) == report
    assert report["note"] == NOTE

    checkpoint = report["checkpoint"]
    # Only the GPT is shrunk; the codec parts have ChatTTS's official sizes.
    assert {"dvae", "vocos"} <= set(checkpoint["official_sections"])
    assert "gpt" not in checkpoint["official_sections"]
    dims = checkpoint["dims"]
    assert (dims["num_vq"], dims["num_audio_tokens"], dims["num_text_tokens"]) == (4, 626, 21178)
    assert dims["decoder"]["idim"] == 16  # half the GPT hidden size

    rows = report["results"]
    assert [(r["precision"], r["batch"]) for r in rows] == [("fp32", BATCH), ("int8", BATCH)]
    for row in rows:
        # Exactly the fixed token count, whatever the random weights sample.
        assert row["tokens_total"] == TOKENS * BATCH
        # Vocos' centred ISTFT: two mel frames of 256 samples per token, less one hop.
        assert row["samples_per_text"] == (2 * TOKENS - 1) * 256
        assert row["gpt_tokens_per_s"] > 0 and row["rtf"] > 0
        assert row["peak_rss_mb"] >= row["rss_in_use_mb"] > 0
    assert rows[0]["quantize_s"] == 0.0
    assert rows[1]["quantize_s"] > 0.0
