"""The Wyoming bench (`python -m tts_bridge.bench.wyoming`) against a real bridge in a child
process on a loopback port, asked by the bench's own Wyoming client. The peer, wyoming-piper,
needs a wyoming newer than the bridge pins, so it is not in this environment: its side runs by
hand (docs/benchmarks.md); here the bridge's side and the report around it."""

from __future__ import annotations

import pytest

from tts_bridge.bench import wyoming

pytestmark = pytest.mark.slow


def test_the_wyoming_bench_measures_the_bridge_new_and_cached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fewer texts than a real run: the rows and their arithmetic are what is tested here.
    monkeypatch.setattr(wyoming, "ANNOUNCEMENTS", wyoming.ANNOUNCEMENTS[:3])
    monkeypatch.setattr(wyoming, "LONG_VARIANTS", wyoming.LONG_VARIANTS[:1])

    report = wyoming.run_wyoming_bench(None, None)

    rows = {(r["server"], r["form"], r["cache"]): r for r in report["rows"]}
    name = "tts_bridge (joe)"
    assert set(rows) == {
        (name, form, cache) for form in ("stream", "synthesize") for cache in ("uncached", "cached")
    }
    for form in ("stream", "synthesize"):
        new, again = rows[(name, form, "uncached")], rows[(name, form, "cached")]
        assert new["n"] == again["n"] == 3
        assert new["min_ms"] <= new["median_ms"] <= new["max_ms"]
        # A repeat comes from the cache: no engine run before its first chunk.
        assert again["median_ms"] * 3 < new["median_ms"], (new, again)
    long_rows = {r["text"]: r for r in report["long"]}
    assert set(long_rows) == {"long sentence", "paragraph"}
    for row in long_rows.values():
        assert row["server"] == name and row["n"] == 1
        assert 0 < row["first_ms"] < row["last_ms"], row
    # A paragraph of four sentences is streamed: its first audio comes well before its last.
    assert long_rows["paragraph"]["sooner"] > 1.5, long_rows["paragraph"]
    assert report["ratios"] == {}, "without a peer there is nothing to compare"
    assert report["machine"]
