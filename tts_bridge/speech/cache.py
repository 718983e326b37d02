"""Sentence-level disk cache (diskcache, SQLite + files): PCM plus metadata per sentence.

A key covers everything that changes the audio: the normalized sentence, the engine identity
(which includes the model file's hash), the voice and speaker, the synthesis options and the
sample rate. diskcache commits an entry only after its value is fully written, and each entry also
carries a digest of its PCM that is checked on read, so a damaged entry is dropped, never served.

The cache is disposable, so storage faults degrade it and never fail a request:

* **cannot write** (disk full, read-only, I/O error): hits are still served, read without their
  bookkeeping (recency and hit counters need a write); new audio is returned uncached. One
  warning per condition, ``stats()["degraded"]`` names it for health, and the cache recovers by
  itself at the first write that succeeds again (writes are retried as sentences come, and the
  normal read path every ``_RETRY_S``).
* **damaged index** (``cache.db`` that SQLite does not recognise): moved aside as
  ``cache.db.corrupt-<time>`` at open and a new, empty cache is built; the value files it
  indexed are unreachable without it and are removed.
* **damaged value** (a pickle that does not load, a truncated file, a PCM digest mismatch): the
  entry is dropped and reported as a miss, so the sentence is rendered again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import diskcache
import numpy as np

from tts_bridge.audio.codec import Int16Audio
from tts_bridge.speech.settings import CacheSettings
from tts_bridge.system.faults import FaultCondition

_LOGGER = logging.getLogger(__name__)
_FORMAT = 1  # bump when the stored layout changes; old entries are then simply missed
_SENTENCE_PREFIX = "pcm:"
"""Keys of sentence audio; the others are counters and per-entry hit counts."""
_STATS_HITS = "stats:hits"
_STATS_MISSES = "stats:misses"
_DB_FILE = "cache.db"  # diskcache's index, one per cache folder
_RETRY_S = 30.0
"""While degraded, hits try the normal (bookkeeping) read path again this often."""
_VALUE_DIR = re.compile(r"^[0-9a-f]{2}$")  # diskcache's value files live in <xx>/<yy>/...


@dataclass(frozen=True)
class CacheKey:
    sentence: str
    engine: str
    voice: str
    speaker: str | None
    options: tuple[tuple[str, object], ...]
    sample_rate: int
    loudness: str = "off"
    """The loudness the audio was normalized to (LoudnessNormalizer.cache_field)."""

    def digest(self) -> str:
        blob = json.dumps([_FORMAT, *asdict(self).values()], ensure_ascii=False, default=str)
        return _SENTENCE_PREFIX + hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class CachedSentence:
    pcm: Int16Audio
    sample_rate: int
    tier: str
    engine: str
    created: float


_STORAGE_ERRORS = (sqlite3.Error, OSError, diskcache.Timeout)


def _open_cache(directory: Path, **settings: Any) -> diskcache.Cache:
    """diskcache.Cache on ``directory``; an index SQLite does not recognise is moved aside."""
    try:
        return diskcache.Cache(str(directory), **settings)
    except sqlite3.OperationalError:
        raise  # locked, disk full, permissions: not damage, nothing to move aside
    except sqlite3.DatabaseError as exc:
        aside = _move_aside(directory)
        _LOGGER.error(
            "Sentence cache index %s is damaged (%s); moved it to %s and starting an empty cache",
            directory / _DB_FILE,
            exc,
            aside.name,
        )
        return diskcache.Cache(str(directory), **settings)


def _move_aside(directory: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = directory / f"{_DB_FILE}.corrupt-{stamp}"
    counter = 1
    while aside.exists():
        counter += 1
        aside = directory / f"{_DB_FILE}.corrupt-{stamp}-{counter}"
    os.replace(directory / _DB_FILE, aside)
    for suffix in ("-wal", "-shm"):
        # The damaged index's write-ahead log belongs to it; applied to a new file it would be
        # garbage again.
        side = directory / (_DB_FILE + suffix)
        if side.exists():
            os.replace(side, Path(str(aside) + suffix))
    # Value files are only reachable through the index: without it they are disk space lost.
    for child in directory.iterdir():
        if child.is_dir() and _VALUE_DIR.match(child.name):
            shutil.rmtree(child, ignore_errors=True)
    return aside


class _Upgrades:
    """The upgrade index (see SentenceCache.upgrades) with writes that never raise: a sentence
    that cannot be remembered for its quality upgrade stays on the fast tier, nothing worse."""

    def __init__(self, directory: Path, health: FaultCondition) -> None:
        self._health = health
        self.cache = _open_cache(directory, eviction_policy="none")  # as diskcache.Index
        self._index = diskcache.Index.fromcache(self.cache)

    def __len__(self) -> int:
        try:
            return len(self._index)
        except _STORAGE_ERRORS as exc:
            _LOGGER.debug("Upgrade index unreadable: %s", exc)
            return 0

    def __iter__(self) -> Iterator[str]:
        try:
            yield from list(self._index)
        except _STORAGE_ERRORS as exc:
            _LOGGER.debug("Upgrade index unreadable: %s", exc)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._index
        except _STORAGE_ERRORS:
            return False

    def __setitem__(self, key: str, value: float) -> None:
        try:
            self._index[key] = value
        except _STORAGE_ERRORS as exc:
            self._health.failed("remembering a quality upgrade", exc)
        else:
            self._health.succeeded()

    def pop(self, key: str, default: float | None = None) -> float | None:
        try:
            value: float | None = self._index.pop(key, default)
        except _STORAGE_ERRORS as exc:
            self._health.failed("forgetting a quality upgrade", exc)
            return default
        return value

    def clear(self) -> None:
        self._index.clear()


class SentenceCache:
    """Bounded (least recently used first), persistent and safe across threads and processes."""

    def __init__(self, settings: CacheSettings) -> None:
        self.enabled = settings.enabled
        self.directory = settings.dir.expanduser()
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # cached speech can reveal what a household announces
        self._health = FaultCondition(
            _LOGGER,
            f"Sentence cache {self.directory}",
            "serving hits read-only and new audio uncached until it can",
            retry_s=_RETRY_S,
        )
        self._cache = _open_cache(
            self.directory,
            size_limit=settings.max_mb * 1024 * 1024,
            eviction_policy="least-recently-used",
            cull_limit=10,
        )
        # Sentences answered by the fast tier that still need their quality version: a separate
        # persistent, insertion-ordered index, so cache eviction never forgets an upgrade.
        self.upgrades = _Upgrades(self.directory / "upgrades", self._health)
        # Hits and misses counted while the counters on disk cannot be written.
        self._unsaved = {_STATS_HITS: 0, _STATS_MISSES: 0}

    def close(self) -> None:
        self._cache.close()
        self.upgrades.cache.close()

    @property
    def degraded(self) -> str | None:
        """Why the cache cannot be written now ('disk full', ...), or None when it can."""
        return self._health.condition

    def contains(self, key: CacheKey) -> bool:
        """Presence check without touching statistics or recency."""
        if not self.enabled:
            return False
        try:
            return key.digest() in self._cache
        except _STORAGE_ERRORS as exc:
            _LOGGER.debug("Cache look-up failed: %s", exc)
            return False

    def get(self, key: CacheKey) -> CachedSentence | None:
        """The cached sentence, or None (also for a damaged entry, which is dropped), with the
        look-up's bookkeeping done (`read`, then `note_lookup`)."""
        found = self.read(key)
        self.note_lookup(key, found is not None)
        return found

    def read(self, key: CacheKey) -> CachedSentence | None:
        """The cached sentence, or None (also for a damaged entry, which is dropped), without
        writing anything: the look-up's bookkeeping (`note_lookup`) can wait until the audio
        has gone out."""
        if not self.enabled:
            return None
        digest = key.digest()
        value = self._lookup(digest)
        if value is None:
            return None
        try:
            pcm = np.frombuffer(value["pcm"], dtype="<i2")
            if hashlib.sha256(value["pcm"]).hexdigest() != value["pcm_sha256"]:
                raise ValueError("PCM digest mismatch")
            return CachedSentence(
                pcm, int(value["sample_rate"]), value["tier"], value["engine"], value["created"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            self._drop(digest, str(exc))
            return None

    def note_lookup(self, key: CacheKey, hit: bool) -> None:
        """A look-up's bookkeeping: the hit and miss counters, and a hit's recency (what the
        size limit evicts last)."""
        if not self.enabled:
            return
        if not hit:
            self._count(_STATS_MISSES)
            return
        digest = key.digest()
        if not self._health.degraded or self._health.should_retry():
            try:
                self._touch(digest)
            except _STORAGE_ERRORS as exc:
                self._health.failed("reading a sentence", exc)
        self._count(_STATS_HITS, "hits:" + digest)

    def _lookup(self, digest: str) -> Any:
        """The stored value or None."""
        try:
            return self._peek(digest)
        except _STORAGE_ERRORS as exc:
            _LOGGER.warning("Cache entry %s unreadable: %s", digest[:16], exc)
            return None
        except Exception as exc:
            # A damaged value file: pickle raises almost anything on bad bytes (UnpicklingError,
            # EOFError on a truncated file, ValueError, KeyError, ...).
            self._drop(digest, f"{type(exc).__name__}: {exc}")
            return None

    def _touch(self, digest: str) -> None:
        """What diskcache's own get writes under its least-recently-used policy: the entry's
        access time."""
        db_key, raw = self._cache._disk.put(digest)
        self._cache._sql(
            "UPDATE Cache SET access_time = ? WHERE key = ? AND raw = ?",
            (time.time(), db_key, raw),
        )
        self._health.succeeded()

    def _peek(self, key: str) -> Any:
        """A value read without diskcache's bookkeeping write (access time, statistics): the
        same SELECT diskcache runs, on its own connection, then its own decoding."""
        db_key, raw = self._cache._disk.put(key)
        rows = self._cache._sql(
            "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = ?"
            " AND (expire_time IS NULL OR expire_time > ?)",
            (db_key, raw, time.time()),
        ).fetchall()
        if not rows:
            return None
        mode, filename, value = rows[0]
        return self._cache._disk.fetch(mode, filename, value, False)

    def _drop(self, digest: str, why: str) -> None:
        _LOGGER.warning("Dropping damaged cache entry %s: %s", digest[:16], why)
        try:
            self._cache.delete(digest, retry=True)
        except _STORAGE_ERRORS as exc:
            self._health.failed("dropping a damaged entry", exc)

    def _count(self, counter: str, per_entry: str | None = None) -> None:
        if self._health.degraded:
            self._unsaved[counter] += 1
            return
        try:
            self._cache.incr(counter, retry=True)
            if per_entry is not None:
                self._cache.incr(per_entry, retry=True)
        except _STORAGE_ERRORS as exc:
            self._unsaved[counter] += 1
            self._health.failed("counting hits", exc)

    def put(self, key: CacheKey, pcm: Int16Audio, tier: str, engine: str) -> bool:
        """Store a sentence; False when it could not be stored (the cache is degraded)."""
        if not self.enabled:
            return False
        raw = np.asarray(pcm, dtype="<i2").tobytes()
        value = {
            "pcm": raw,
            "pcm_sha256": hashlib.sha256(raw).hexdigest(),
            "sample_rate": key.sample_rate,
            "tier": tier,
            "engine": engine,
            "created": time.time(),
            "sentence": key.sentence,
            "voice": key.voice,
        }
        try:
            self._cache.set(key.digest(), value, retry=True)
        except _STORAGE_ERRORS as exc:
            self._health.failed("storing a sentence", exc)
            return False
        self._health.succeeded()
        return True

    def delete(self, key: CacheKey) -> bool:
        """Remove one sentence; whether it was there."""
        if not self.enabled:
            return False
        try:
            return bool(self._cache.delete(key.digest(), retry=True))
        except _STORAGE_ERRORS as exc:
            self._health.failed("removing a sentence", exc)
            return False

    def stats(self) -> dict[str, Any]:
        """Counts for health and ``cache/stats``; reads only, so it works on a full disk too."""
        try:
            hits = int(self._peek(_STATS_HITS) or 0)
            misses = int(self._peek(_STATS_MISSES) or 0)
            entries = self._sentence_entries()
            volume = int(self._cache.volume())
        except _STORAGE_ERRORS as exc:
            _LOGGER.debug("Cache statistics unreadable: %s", exc)
            hits = misses = entries = volume = 0
        hits += self._unsaved[_STATS_HITS]
        misses += self._unsaved[_STATS_MISSES]
        return {
            "dir": str(self.directory),
            "entries": entries,
            "bytes": volume,
            "max_bytes": int(self._cache.size_limit),
            "hits": hits,
            "misses": misses,
            "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
            "pending_upgrades": len(self.upgrades),
            "degraded": self._health.condition,
            "write_errors": self._health.errors,
        }

    def clear(self) -> int:
        """Remove everything; returns how many sentences were cached (the hit counters and
        other internal keys go too, but they are not entries a user would count)."""
        self.upgrades.clear()
        try:
            sentences = self._sentence_entries()
        except _STORAGE_ERRORS as exc:
            _LOGGER.debug("Cache entries uncountable before clearing: %s", exc)
            sentences = None
        removed = int(self._cache.clear(retry=True))
        return removed if sentences is None else min(sentences, removed)

    def _sentence_entries(self) -> int:
        return sum(1 for k in self._cache.iterkeys() if str(k).startswith(_SENTENCE_PREFIX))
