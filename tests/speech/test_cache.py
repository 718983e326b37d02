"""Sentence cache: round trip, persistence, damage detection, size bound, key coverage, and
storage faults (a full or read-only filesystem, a garbage index, damaged values)."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import diskcache
import numpy as np
import pytest

from tests.support.fullfs import small_tmpfs
from tts_bridge.speech.cache import CacheKey, SentenceCache
from tts_bridge.speech.settings import CacheSettings
from tts_bridge.system.faults import storage_condition


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


def test_clear_reports_the_sentences_removed_not_internal_keys(tmp_path: Path) -> None:
    cache = SentenceCache(CacheSettings(dir=tmp_path / "c", max_mb=8))
    cache.put(_key("One."), _pcm(1), tier="quality", engine="piper:joe:abc")
    cache.put(_key("Two."), _pcm(2), tier="quality", engine="piper:joe:abc")
    assert cache.get(_key("One.")) is not None  # a hit: hit counters are stored as keys too
    assert cache.get(_key("Three.")) is None  # a miss
    assert cache.clear() == 2
    assert cache.stats()["entries"] == 0 and cache.get(_key("One.")) is None
    assert cache.clear() == 0
    cache.close()


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


# -- storage faults: the cache degrades, it never fails a request -----------------------------


def _warnings(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


def test_full_disk_serves_hits_and_returns_new_audio_uncached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_tmpfs(tmp_path / "fs") as fs:
        cache = SentenceCache(CacheSettings(dir=fs.root / "c", max_mb=8))
        cache.put(_key(), _pcm(1), tier="quality", engine="e")
        big = _key("a long sentence")
        assert cache.put(big, _pcm(9, 22050), tier="quality", engine="e")  # a value file
        fs.fill()
        caplog.set_level(logging.WARNING, logger="tts_bridge.speech.cache")
        for _ in range(3):  # hits, read without their bookkeeping write
            hit = cache.get(_key())
            assert hit is not None and np.array_equal(hit.pcm, _pcm(1))
            big_hit = cache.get(big)
            assert big_hit is not None and np.array_equal(big_hit.pcm, _pcm(9, 22050))
        new = [_key(f"new {i}") for i in range(4)]
        for i, key in enumerate(new):
            assert cache.put(key, _pcm(20 + i, 22050), tier="quality", engine="e") is False
            assert cache.get(key) is None  # not stored, so the next request renders it again
        stats = cache.stats()
        assert stats["degraded"] == "disk full"
        assert stats["write_errors"] >= len(new)
        assert stats["hits"] >= 6 and stats["misses"] >= len(new)
        assert len(_warnings(caplog, "cannot be written")) == 1  # one per condition
        cache.upgrades["joe\x00new 0"] = 1.0  # never raises; the upgrade is just not kept

        fs.free()
        assert cache.put(new[0], _pcm(20, 22050), tier="quality", engine="e") is True
        assert cache.stats()["degraded"] is None
        assert _warnings(caplog, "writable again")
        assert cache.get(new[0]) is not None
        cache.close()


def test_storage_conditions_are_named() -> None:
    assert storage_condition(OSError(errno.ENOSPC, "No space left")) == "disk full"
    assert storage_condition(OSError(errno.EROFS, "Read-only file system")) == "read-only"
    assert storage_condition(sqlite3.OperationalError("database or disk is full")) == "disk full"
    readonly = sqlite3.OperationalError("attempt to write a readonly database")
    assert storage_condition(readonly) == "read-only"
    assert storage_condition(sqlite3.OperationalError("disk I/O error")) == "I/O error"
    assert storage_condition(sqlite3.DatabaseError("file is not a database")) == "damaged"


def test_garbage_index_is_moved_aside_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = CacheSettings(dir=tmp_path / "c", max_mb=8)
    cache = SentenceCache(settings)
    cache.put(_key(), _pcm(1, 22050), tier="quality", engine="e")  # leaves a value file
    cache.close()
    garbage = os.urandom(8192)
    (tmp_path / "c" / "cache.db").write_bytes(garbage)
    caplog.set_level(logging.ERROR, logger="tts_bridge.speech.cache")
    cache = SentenceCache(settings)
    assert cache.get(_key()) is None
    assert cache.put(_key(), _pcm(1), tier="quality", engine="e")
    assert cache.get(_key()) is not None
    aside = list((tmp_path / "c").glob("cache.db.corrupt-*"))
    assert [p.read_bytes() for p in aside if p.name.count("-") == 1] == [garbage]
    assert _warnings(caplog, "moved it to")
    # The orphaned value files went with the index; only the new entry's data remains.
    assert not [p for p in (tmp_path / "c").rglob("*.val")]
    cache.close()


def test_cache_clear_works_on_a_garbage_index(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    SentenceCache(CacheSettings(dir=folder)).close()
    (folder / "cache.db").write_bytes(b"not a database at all" * 100)
    (folder / "upgrades" / "cache.db").write_bytes(b"\xff" * 4096)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "tts_bridge", "cache", "clear"],
        env={**env, "TTS_BRIDGE_CACHE__DIR": str(folder)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert list(folder.glob("cache.db.corrupt-*"))
    assert list((folder / "upgrades").glob("cache.db.corrupt-*"))


def _value_file(folder: Path) -> Path:
    (path,) = list(folder.rglob("*.val"))
    return path


def test_unpicklable_value_is_dropped_and_missed(tmp_path: Path) -> None:
    settings = CacheSettings(dir=tmp_path / "c", max_mb=8)
    cache = SentenceCache(settings)
    cache.put(_key(), _pcm(1, 22050), tier="quality", engine="e")  # 44 KB: a value file
    _value_file(tmp_path / "c").write_bytes(b"\x80\x05garbage that is not a pickle")
    assert cache.get(_key()) is None  # a miss: the sentence is rendered again
    assert not cache.contains(_key())  # and the damaged entry is gone
    assert cache.put(_key(), _pcm(1, 22050), tier="quality", engine="e")
    hit = cache.get(_key())
    assert hit is not None and np.array_equal(hit.pcm, _pcm(1, 22050))
    cache.close()


def test_truncated_value_is_dropped_and_missed(tmp_path: Path) -> None:
    cache = SentenceCache(CacheSettings(dir=tmp_path / "c", max_mb=8))
    cache.put(_key(), _pcm(1, 22050), tier="quality", engine="e")
    path = _value_file(tmp_path / "c")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert cache.get(_key()) is None
    assert not cache.contains(_key())
    assert cache.stats()["misses"] == 1
    cache.close()


def test_a_read_writes_nothing_until_its_lookup_is_noted(tmp_path: Path) -> None:
    cache = SentenceCache(CacheSettings(dir=tmp_path / "c", max_mb=1))
    keep = _key("keep me")
    cache.put(keep, _pcm(0, 22050), tier="quality", engine="e")  # 44 KB each
    assert cache.read(keep) is not None and cache.read(_key("absent")) is None
    assert (cache.stats()["hits"], cache.stats()["misses"]) == (0, 0)
    cache.note_lookup(_key("absent"), False)
    assert (cache.stats()["hits"], cache.stats()["misses"]) == (0, 1)
    # A noted hit is recent: it outlives the size bound, as a `get` does.
    for i in range(60):
        cache.put(_key(f"sentence {i}"), _pcm(i + 1, 22050), tier="quality", engine="e")
        assert cache.read(keep) is not None
        cache.note_lookup(keep, True)
    assert cache.stats()["hits"] == 60
    assert cache.read(_key("sentence 0")) is None


def test_without_noting_hits_the_oldest_entry_is_evicted(tmp_path: Path) -> None:
    """What the test above proves is the noted recency (reads alone leave it old)."""
    cache = SentenceCache(CacheSettings(dir=tmp_path / "c", max_mb=1))
    keep = _key("keep me")
    cache.put(keep, _pcm(0, 22050), tier="quality", engine="e")
    for i in range(60):
        cache.put(_key(f"sentence {i}"), _pcm(i + 1, 22050), tier="quality", engine="e")
        cache.read(keep)
    assert cache.read(keep) is None
