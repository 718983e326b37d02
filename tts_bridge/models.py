"""Model files: streamed SHA-256 hashing (never reads a whole model into memory)."""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

_LOGGER = logging.getLogger(__name__)
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


class FileHasher:
    """Remembers hashes by (path, size, mtime) so a file is hashed once per change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, int, int], str] = {}

    def sha256(self, path: Path) -> str:
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            cached = self._known.get(key)
        if cached is not None:
            return cached
        value = sha256_file(path)
        _LOGGER.debug("sha256 %s = %s", path, value)
        with self._lock:
            self._known[key] = value
        return value
