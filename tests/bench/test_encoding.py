"""The encoding bench's rows (shape and sense, never its timings)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tts_bridge.audio.formats import AudioFormat
from tts_bridge.bench import encoding
from tts_bridge.bench.encoding import DEFAULT_FORMATS, encode_cost_rows, speechlike
from tts_bridge.cli import main as cli


def test_one_row_per_format_with_its_output_rate_and_bitrate() -> None:
    formats = [AudioFormat("mp3", 44100), AudioFormat("opus", 48000, 2), AudioFormat("flac")]
    rows = encode_cost_rows(formats, seconds=1.0, repeats=1)
    assert [(r["format"], r["sample_rate"], r["channels"]) for r in rows] == [
        ("mp3", 44100, 1),
        ("opus", 48000, 2),
        ("flac", 22050, 1),
    ]
    for row in rows:
        assert row["ms_per_audio_s"] > 0
        assert row["rtf"] > 0
        assert row["kbps"] == round(row["bytes"] * 8 / 1000, 1)
    assert rows[0]["kbps"] < rows[2]["kbps"]  # lossy is smaller than lossless


def test_the_source_is_deterministic_and_in_range() -> None:
    a, b = speechlike(0.5), speechlike(0.5)
    assert a.size == 11025
    assert (a == b).all()
    assert float(abs(a).max()) <= 1.0


def test_bench_encoding_prints_and_writes_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def short(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return encode_cost_rows(DEFAULT_FORMATS, seconds=0.5, repeats=1)

    monkeypatch.setattr(encoding, "encode_cost_rows", short)
    config = tmp_path / "config.yaml"
    config.write_text("{}\n", encoding="utf-8")
    out = tmp_path / "encoding.json"
    assert cli.main(["bench", "--config", str(config), "--encoding", "--out", str(out)]) == 0
    rows = json.loads(out.read_text(encoding="utf-8"))["encoding"]
    assert {row["format"] for row in rows} == {"mp3", "opus", "flac", "wav"}
    printed = capsys.readouterr().out
    assert "ms_per_audio_s" in printed
    assert printed.count("\nmp3 ") == sum(row["format"] == "mp3" for row in rows)
