"""The encoding bench's rows (shape and sense, never its timings)."""

from __future__ import annotations

from tts_bridge.bench.encoding import encode_cost_rows, speechlike
from tts_bridge.formats import AudioFormat


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
