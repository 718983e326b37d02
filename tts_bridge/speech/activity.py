"""The last requests of every door (MQTT, Hermes, Wyoming, HTTP, the web UI), in memory only,
and the queues of those who follow them live.

The pipeline records an entry where it counts an answer or a refusal: the door, voice, tier,
latency, and "ok" or the error code of a request, never its text. The web UI's Activity page
reads the list and follows new entries (server-sent events, one stream per open page).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

MAX_ENTRIES = 50


@dataclass(frozen=True)
class Entry:
    at: float
    door: str
    voice: str | None
    tier: str | None
    latency_ms: float | None
    status: str
    """"ok", or the error code."""


class ActivityLog:
    """The last MAX_ENTRIES entries, and the queues of the pages that follow them."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: deque[Entry] = deque(maxlen=MAX_ENTRIES)
        self._watchers: set[asyncio.Queue[str]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def record(
        self,
        door: str,
        status: str,
        *,
        voice: str | None = None,
        tier: str | None = None,
        latency_ms: float | None = None,
    ) -> Entry:
        entry = Entry(self._clock(), door, voice, tier, latency_ms, status)
        with self._lock:
            self._entries.append(entry)
            loop, watchers = self._loop, list(self._watchers)
        if loop is not None and watchers:
            message = sse("request", asdict(entry))
            # A closed loop (the server stopped) has nobody watching any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_offer, watchers, message)
        return entry

    def entries(self) -> list[Entry]:
        """Newest first."""
        with self._lock:
            return list(reversed(self._entries))

    def watch(self) -> asyncio.Queue[str]:
        """A queue of SSE messages for one page (call on the server's loop)."""
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=100)
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._watchers.add(queue)
        return queue

    def unwatch(self, queue: asyncio.Queue[str]) -> None:
        with self._lock:
            self._watchers.discard(queue)

    @property
    def watchers(self) -> int:
        with self._lock:
            return len(self._watchers)


def _offer(watchers: list[asyncio.Queue[str]], message: str) -> None:
    for queue in watchers:
        if not queue.full():  # a page that stopped reading misses entries, not memory
            queue.put_nowait(message)


def sse(event: str, data: Any) -> str:
    """One server-sent event (data on one line: JSON has no raw newlines)."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
