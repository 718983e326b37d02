"""Encoded answers on disk, named by unguessable tokens, for the HTTP audio server.

A token is an HMAC (keyed with a per-install secret kept in the state folder) of the audio's
content key and its format, so the same cached sentence in the same format keeps one URL while it
lives, across restarts, and nobody without the secret can derive or guess it (announcements can
be private). Files live on disk, not in memory (a Raspberry Pi has little RAM): one file per
token, written atomically; a file's mtime is its expiry time, so expiry needs no index to keep
consistent and survives restarts. The folder is bounded: what expires soonest goes first.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tts_bridge.audio.formats import CONTAINERS, EXTENSIONS, AudioFormat, Container
from tts_bridge.config import Settings
from tts_bridge.system.durable import is_partial, write_atomic

_LOGGER = logging.getLogger(__name__)

TOKEN_BYTES = 24
"""192 bits: far beyond guessing, and 32 URL-safe characters."""
TOKEN_CHARS = 32
_NAME_RE = re.compile(r"^([A-Za-z0-9_-]{32})\.([a-z0-9]{1,8})$")
_BY_EXTENSION: dict[str, Container] = {EXTENSIONS[c]: c for c in CONTAINERS}
_SECRET_BYTES = 32
_OLD_TEMP_PREFIX = ".part-"
"""Partial writes of earlier versions, still swept."""
_SWEEP_INTERVAL_S = 60.0


@dataclass(frozen=True)
class StoredAudio:
    path: Path
    container: Container
    size: int
    expires_at: float
    made_at: float = 0.0
    """When the file was last written or published again (its ctime: its mtime holds the
    expiry)."""

    @property
    def content_type(self) -> str:
        return AudioFormat(self.container).content_type


def _read_or_make_secret(path: Path) -> bytes:
    """The install's URL key; made (0600, in a 0700 folder) when missing or unusable."""
    try:
        secret = path.read_bytes()
    except FileNotFoundError:
        secret = b""
    if len(secret) >= _SECRET_BYTES:
        return secret
    if secret:
        _LOGGER.warning(
            "URL key %s is damaged; making a new one (old audio URLs stop working)", path
        )
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret = secrets.token_bytes(_SECRET_BYTES)
    write_atomic(path, secret, mode=0o600)
    return secret


class AudioStore:
    """Thread-safe: publishers write from synthesis threads while the server thread reads."""

    def __init__(
        self,
        directory: Path,
        secret_file: Path,
        max_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._clock = clock
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # the audio says what a household announces
        self._secret = _read_or_make_secret(secret_file)
        self._lock = threading.Lock()
        self._bytes_since_sweep = 0
        self._last_sweep = float("-inf")
        self.sweep()

    @classmethod
    def from_settings(cls, settings: Settings) -> AudioStore:
        http = settings.http
        directory = http.dir or settings.cache.dir / "http"
        secret_file = http.secret_file or settings.journal.path.parent / "http.key"
        return cls(directory, secret_file, http.max_mb * 1024 * 1024)

    def token(self, content_key: str, fmt: AudioFormat) -> str:
        """The URL token of this content in this format."""
        message = f"audio\0{content_key}\0{fmt.key()}".encode()
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()[:TOKEN_BYTES]
        return base64.urlsafe_b64encode(digest).decode("ascii")

    def _path(self, token: str, fmt: AudioFormat) -> Path:
        return self.directory / f"{token}.{fmt.extension}"

    def refresh(self, token: str, fmt: AudioFormat, ttl_s: float) -> int | None:
        """Push back the expiry of stored, unexpired audio and return its size; None when it
        must be written."""
        path = self._path(token, fmt)
        now = self._clock()
        try:
            stat = path.stat()
            if stat.st_mtime <= now:
                return None
            os.utime(path, (now, now + ttl_s))
        except FileNotFoundError:
            return None
        return stat.st_size

    def put(self, token: str, fmt: AudioFormat, data: bytes, ttl_s: float) -> Path:
        """Store encoded audio under its token (atomically: a reader sees all of it or none)."""
        if not re.fullmatch(r"[A-Za-z0-9_-]{32}", token):
            raise ValueError("not a store token")
        path = self._path(token, fmt)
        now = self._clock()
        write_atomic(path, data, mode=0o600, times=(now, now + ttl_s))
        with self._lock:
            self._bytes_since_sweep += len(data)
            due = self._clock() - self._last_sweep >= _SWEEP_INTERVAL_S
            full = self._bytes_since_sweep > self.max_bytes // 8
        if due or full:
            self.sweep()
        return path

    def read(self, token: str, fmt: AudioFormat) -> bytes | None:
        """The stored bytes of unexpired audio; None when there are none (expired, evicted)."""
        stored = self.lookup(f"{token}.{fmt.extension}")
        if stored is None:
            return None
        try:
            return stored.path.read_bytes()
        except OSError:
            return None

    def lookup(self, name: str) -> StoredAudio | None:
        """The audio a request's last path segment names, or None: a name that is not exactly a
        token and a known extension, unknown audio, and expired audio all get None."""
        match = _NAME_RE.match(name)
        if match is None or match.group(2) not in _BY_EXTENSION:
            return None
        path = self.directory / name
        try:
            stat = path.stat()
        except OSError:
            return None
        if stat.st_mtime <= self._clock():
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return StoredAudio(
            path, _BY_EXTENSION[match.group(2)], stat.st_size, stat.st_mtime, stat.st_ctime
        )

    def sweep(self) -> int:
        """Drop expired audio and stale partial writes, then what expires soonest until the
        folder is within its bound; returns how many files went."""
        with self._lock:
            self._last_sweep = self._clock()
            self._bytes_since_sweep = 0
            now = self._last_sweep
            removed = 0
            live: list[tuple[float, int, Path]] = []
            for entry in os.scandir(self.directory):
                try:
                    stat = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                partial = is_partial(entry.name) or entry.name.startswith(_OLD_TEMP_PREFIX)
                stale_part = partial and stat.st_mtime < now - 3600
                expired = _NAME_RE.match(entry.name) is not None and stat.st_mtime <= now
                if stale_part or expired:
                    removed += _unlink(Path(entry.path))
                elif _NAME_RE.match(entry.name):
                    live.append((stat.st_mtime, stat.st_size, Path(entry.path)))
            total = sum(size for _, size, _ in live)
            for _, size, path in sorted(live):
                if total <= self.max_bytes:
                    break
                removed += _unlink(path)
                total -= size
        if removed:
            _LOGGER.debug(
                "Audio store: %d file(s) expired or evicted, %d bytes kept", removed, total
            )
        return removed


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except OSError:
        return 0
    return 1
