"""Sentence-level disk cache (diskcache, SQLite + files): PCM plus metadata per sentence.

A key covers everything that changes the audio: the normalized sentence, the engine identity
(which includes the model file's hash), the voice and speaker, the synthesis options and the
sample rate. diskcache commits an entry only after its value is fully written, and each entry also
carries a digest of its PCM that is checked on read, so a damaged entry is dropped, never served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import diskcache
import numpy as np

from tts_bridge.audio import Int16Audio
from tts_bridge.config import CacheSettings

_LOGGER = logging.getLogger(__name__)
_FORMAT = 1  # bump when the stored layout changes; old entries are then simply missed
_STATS_HITS = "stats:hits"
_STATS_MISSES = "stats:misses"


@dataclass(frozen=True)
class CacheKey:
    sentence: str
    engine: str
    voice: str
    speaker: str | None
    options: tuple[tuple[str, object], ...]
    sample_rate: int

    def digest(self) -> str:
        blob = json.dumps([_FORMAT, *asdict(self).values()], ensure_ascii=False, default=str)
        return "pcm:" + hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class CachedSentence:
    pcm: Int16Audio
    sample_rate: int
    tier: str
    engine: str
    created: float


class SentenceCache:
    """Bounded (least recently used first), persistent and safe across threads and processes."""

    def __init__(self, settings: CacheSettings) -> None:
        self.enabled = settings.enabled
        self.directory = settings.dir.expanduser()
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # cached speech can reveal what a household announces
        self._cache = diskcache.Cache(
            str(self.directory),
            size_limit=settings.max_mb * 1024 * 1024,
            eviction_policy="least-recently-used",
            cull_limit=10,
        )
        # Sentences answered by the fast tier that still need their quality version: a separate
        # persistent, insertion-ordered index, so cache eviction never forgets an upgrade.
        self.upgrades = diskcache.Index(str(self.directory / "upgrades"))

    def close(self) -> None:
        self._cache.close()
        self.upgrades.cache.close()

    def contains(self, key: CacheKey) -> bool:
        """Presence check without touching statistics or recency."""
        return self.enabled and key.digest() in self._cache

    def get(self, key: CacheKey) -> CachedSentence | None:
        if not self.enabled:
            return None
        digest = key.digest()
        value: Any = self._cache.get(digest, default=None, retry=True)
        if value is None:
            self._cache.incr(_STATS_MISSES, retry=True)
            return None
        try:
            pcm = np.frombuffer(value["pcm"], dtype="<i2")
            if hashlib.sha256(value["pcm"]).hexdigest() != value["pcm_sha256"]:
                raise ValueError("PCM digest mismatch")
            entry = CachedSentence(
                pcm, int(value["sample_rate"]), value["tier"], value["engine"], value["created"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            _LOGGER.warning("Dropping damaged cache entry %s: %s", digest[:16], exc)
            self._cache.delete(digest, retry=True)
            self._cache.incr(_STATS_MISSES, retry=True)
            return None
        self._cache.incr(_STATS_HITS, retry=True)
        self._cache.incr("hits:" + digest, retry=True)
        return entry

    def put(self, key: CacheKey, pcm: Int16Audio, tier: str, engine: str) -> None:
        if not self.enabled:
            return
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
        self._cache.set(key.digest(), value, retry=True)

    def stats(self) -> dict[str, Any]:
        hits = int(self._cache.get(_STATS_HITS, 0, retry=True))
        misses = int(self._cache.get(_STATS_MISSES, 0, retry=True))
        entries = sum(1 for k in self._cache.iterkeys() if str(k).startswith("pcm:"))
        return {
            "dir": str(self.directory),
            "entries": entries,
            "bytes": int(self._cache.volume()),
            "max_bytes": int(self._cache.size_limit),
            "hits": hits,
            "misses": misses,
            "hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
            "pending_upgrades": len(self.upgrades),
        }

    def clear(self) -> int:
        self.upgrades.clear()
        return int(self._cache.clear(retry=True))
