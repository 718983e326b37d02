"""Sentence cache: round trip, persistence, damage detection, size bound, key coverage."""

from __future__ import annotations

import stat
from pathlib import Path

import diskcache
import numpy as np

from tts_bridge.config import CacheSettings
from tts_bridge.speech.cache import CacheKey, SentenceCache


def _key(sentence: str = "Dinner is ready.", **changes: object) -> CacheKey:
    fields: dict[str, object] = {
        "sentence": sentence,
        "engine": "piper:joe:abc",
        "voice": "joe",
        "speaker": None,
        "options": (("speed", 1.0),),
        "sample_rate": 22050,
    }
    fields.update(changes)
    return CacheKey(**fields)  # type: ignore[arg-type]


def _pcm(seed: int, samples: int = 2205) -> np.ndarray:
    return np.random.default_rng(seed).integers(-3000, 3000, samples, dtype=np.int16)


def test_round_trip_and_persistence(tmp_path: Path) -> None:
    settings = CacheSettings(dir=tmp_path / "c", max_mb=8)
    cache = SentenceCache(settings)
    assert cache.get(_key()) is None
    cache.put(_key(), _pcm(1), tier="quality", engine="piper:joe:abc")
    cache.close()
    reopened = SentenceCache(settings)
    hit = reopened.get(_key())
    assert hit is not None
    assert np.array_equal(hit.pcm, _pcm(1))
    assert (hit.tier, hit.engine, hit.sample_rate) == ("quality", "piper:joe:abc", 22050)
    stats = reopened.stats()
    assert stats["entries"] == 1
    assert stats["hits"] == 1 and stats["misses"] == 1
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700


def test_every_key_field_matters() -> None:
    base = _key().digest()
    variants = [
        _key("Dinner is ready!"),
        _key(engine="piper:joe:def"),
        _key(voice="other"),
        _key(speaker="1"),
        _key(options=(("speed", 1.2),)),
        _key(sample_rate=24000),
    ]
    digests = {v.digest() for v in variants}
    assert base not in digests
    assert len(digests) == len(variants)


def test_damaged_entry_is_dropped_not_served(tmp_path: Path) -> None:
    settings = CacheSettings(dir=tmp_path / "c", max_mb=8)
    cache = SentenceCache(settings)
    cache.put(_key(), _pcm(2), tier="fast", engine="hibari")
    cache.close()
    raw = diskcache.Cache(str(tmp_path / "c"))
    value = raw[_key().digest()]
    value["pcm"] = value["pcm"][:-2] + b"\x00\x01"  # one sample changed on disk
    raw[_key().digest()] = value
    raw.close()
    cache = SentenceCache(settings)
    assert cache.get(_key()) is None
    assert cache.stats()["entries"] == 0


def test_size_bound_evicts_least_recently_used(tmp_path: Path) -> None:
    cache = SentenceCache(CacheSettings(dir=tmp_path / "c", max_mb=1))
    keep = _key("keep me")
    cache.put(keep, _pcm(0, 22050), tier="quality", engine="e")  # 44 KB each
    for i in range(60):  # ~2.6 MB in all, more than twice the bound
        cache.put(_key(f"sentence {i}"), _pcm(i + 1, 22050), tier="quality", engine="e")
        assert cache.get(keep) is not None  # recently used, so it survives
    stats = cache.stats()
    assert stats["bytes"] <= 1.3 * 1024 * 1024
    assert stats["entries"] < 60
    assert cache.get(_key("sentence 0")) is None


def test_disabled_cache_stores_nothing(tmp_path: Path) -> None:
    cache = SentenceCache(CacheSettings(dir=tmp_path / "c", enabled=False))
    cache.put(_key(), _pcm(3), tier="quality", engine="e")
    assert cache.get(_key()) is None
    assert cache.stats()["entries"] == 0
