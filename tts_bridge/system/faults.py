"""Names for storage faults, a log that reports each fault condition once, and a throttle for
conditions that repeat.

The cache and the journal both keep serving when their disk is full or read-only; what they need
in common is a short name for the condition (for the log and for health) and one warning when a
condition starts, not one per request. A fault that repeats every second while it lasts (no file
descriptors, a broker refusing publishes) is reported once a minute through `LogThrottle`.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Hashable

_ERRNO_CONDITIONS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk full",
    errno.EROFS: "read-only",
    errno.EACCES: "read-only",
    errno.EPERM: "read-only",
    errno.EIO: "I/O error",
}
# SQLite reports these in its message only (the extended result code is not exposed on 3.11).
_SQLITE_CONDITIONS = (
    ("full", "disk full"),
    ("readonly", "read-only"),
    ("read-only", "read-only"),
    ("disk i/o", "I/O error"),
    ("locked", "locked"),
    ("busy", "locked"),
)


STORAGE_FAULTS = frozenset({"disk full", "read-only", "I/O error"})
"""Conditions of the storage itself (as opposed to, e.g., a lock held by another process)."""


def is_storage_fault(exc: BaseException) -> bool:
    """Whether ``exc`` says the storage cannot be written (full, read-only, failing)."""
    return storage_condition(exc) in STORAGE_FAULTS


def storage_condition(exc: BaseException) -> str:
    """A short name for why a storage operation failed ('disk full', 'read-only', ...)."""
    if isinstance(exc, OSError):
        return _ERRNO_CONDITIONS.get(exc.errno or 0, f"OSError {exc.errno}")
    text = str(exc).lower()
    for needle, condition in _SQLITE_CONDITIONS:
        if needle in text:
            return condition
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        return "damaged"
    return type(exc).__name__


class FaultCondition:
    """The current write condition of one store: a warning when it starts, one when it ends.

    ``what`` names the store in the log ("Sentence cache /x"), ``consequence`` says what the
    bridge does meanwhile.
    """

    def __init__(
        self, logger: logging.Logger, what: str, consequence: str, retry_s: float = 30.0
    ) -> None:
        self._logger = logger
        self._what = what
        self._consequence = consequence
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self.condition: str | None = None
        self.since: float | None = None
        """Wall-clock time the condition started."""
        self.errors = 0
        self._retry_at = 0.0

    def failed(self, doing: str, exc: BaseException) -> None:
        condition = storage_condition(exc)
        with self._lock:
            self.errors += 1
            self._retry_at = time.monotonic() + self._retry_s
            if condition == self.condition:
                return
            self.condition, self.since = condition, time.time()
        self._logger.warning(
            "%s cannot be written (%s: %s while %s); %s",
            self._what,
            condition,
            exc,
            doing,
            self._consequence,
        )

    def succeeded(self) -> None:
        with self._lock:
            if self.condition is None:
                return
            condition, self.condition, self.since = self.condition, None, None
        self._logger.warning("%s is writable again (was: %s)", self._what, condition)

    @property
    def degraded(self) -> bool:
        return self.condition is not None

    def should_retry(self) -> bool:
        """True when a degraded store should try its normal (writing) path again."""
        return time.monotonic() >= self._retry_at


class LogThrottle:
    """When to report a condition that repeats: its first occurrence, then at most once per
    `interval_s`, with the number of occurrences since the last report. Thread-safe.

    Keys may come from outside (a topic with a client's target in it): at most `max_keys` are
    remembered, the longest unreported forgotten first.
    """

    def __init__(
        self,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._lock = threading.Lock()
        self._reported: dict[Hashable, float] = {}
        self._since: dict[Hashable, int] = {}

    @property
    def interval_s(self) -> float:
        return self._interval_s

    def due(self, key: Hashable) -> int | None:
        """Count one occurrence of `key`: how many there were since the last report (this one
        included) when it is to be reported now, else None."""
        now = self._clock()
        with self._lock:
            since = self._since.get(key, 0) + 1
            last = self._reported.get(key)
            if last is not None and now - last < self._interval_s:
                self._since[key] = since
                return None
            self._reported.pop(key, None)  # to the end: the dict is in order of reports
            self._reported[key] = now
            self._since[key] = 0
            while len(self._reported) > self._max_keys:
                oldest = next(iter(self._reported))
                del self._reported[oldest]
                self._since.pop(oldest, None)
            return since

    def forget(self, key: Hashable) -> None:
        """The condition ended: its next occurrence is reported at once."""
        with self._lock:
            self._reported.pop(key, None)
            self._since.pop(key, None)

    def clear(self) -> None:
        """Every condition ended."""
        with self._lock:
            self._reported.clear()
            self._since.clear()
