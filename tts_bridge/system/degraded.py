"""Which parts of the bridge are off or reduced, and why: the ``status`` of every health report.

A bridge that cannot write its cache folder, whose HTTP port is taken or whose broker is away
still serves what it can. Health says so instead of "healthy" or a crash: ``status`` is ``ok``
or ``degraded``, and ``degraded`` maps each affected part to one line of reason. Parts set at
start-up (a folder, a server that did not start) stay until the process ends; conditions that
come and go (a full disk, a lost broker) are passed in by whoever reports health.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

OK = "ok"
DEGRADED = "degraded"


class Degraded:
    """Thread-safe: set at start-up and by servers' threads, read by health reports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[str, str] = {}

    def set(self, part: str, reason: str) -> None:
        with self._lock:
            self._parts[part] = reason

    def clear(self, part: str) -> None:
        with self._lock:
            self._parts.pop(part, None)

    def parts(self) -> dict[str, str]:
        with self._lock:
            return dict(self._parts)

    def report(self, live: Mapping[str, str | None] | None = None) -> dict[str, Any]:
        """``{"status": "ok"|"degraded", "degraded": {part: reason}}``; ``live`` adds the
        conditions of this moment (None = that part is fine now)."""
        parts = self.parts()
        for part, reason in (live or {}).items():
            if reason:
                parts[part] = reason
        return {"status": DEGRADED if parts else OK, "degraded": parts}
