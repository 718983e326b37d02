"""The order resumed journal entries are served in after a crash: the waiting ones first, then the
suspects one at a time.

A suspect was in synthesis when a process died, so it may be what killed it. Served alongside
the others it could kill the process again before they are spoken, so it waits until every entry
that was only waiting is closed. Suspects then run one at a time, each once the one before it is
closed: when several died together (two synthesis slots, the fast lane), the one that kills the
process again is alone in synthesis then, and only it is counted another attempt.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from tts_bridge.mqtt.journal import JournalEntry

_LOGGER = logging.getLogger(__name__)


class ResumeOrder:
    """Holds suspects back until the waiting entries are closed, then releases them one by one.

    Thread-safe: entries are closed on worker threads, and on the network thread when refused.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: set[int] = set()
        self._suspects: deque[JournalEntry] = deque()
        self._running: int | None = None
        """The suspect being served now (its entry id)."""
        self._serve: Callable[[JournalEntry], None] | None = None

    def start(
        self,
        waiting: list[JournalEntry],
        suspects: list[JournalEntry],
        serve: Callable[[JournalEntry], None],
    ) -> None:
        """Serve `waiting` now and `suspects` after them (`serve` queues one entry; its
        closing must be reported with `closed`). Adds to any order still in progress."""
        with self._lock:
            self._serve = serve
            self._waiting.update(e.entry_id for e in waiting)
            self._suspects.extend(suspects)
        for entry in suspects:
            _LOGGER.warning(
                "Request journal entry %d was in synthesis when the bridge stopped (%d time(s)): "
                "serving it after the %d waiting request(s), alone",
                entry.entry_id,
                entry.attempts,
                len(waiting),
            )
        for entry in waiting:
            serve(entry)
        self._next()

    def closed(self, entry_id: int) -> None:
        """An entry was answered (or refused): the next suspect may go when nothing is ahead
        of it. Entries this order does not hold are ignored; a second call for one is too."""
        with self._lock:
            if entry_id == self._running:
                self._running = None
            elif entry_id in self._waiting:
                self._waiting.discard(entry_id)
            else:
                return
        self._next()

    @property
    def pending(self) -> int:
        """Entries held or in progress (waiting ones not closed, suspects not done)."""
        with self._lock:
            return len(self._waiting) + len(self._suspects) + (self._running is not None)

    def _next(self) -> None:
        with self._lock:
            if self._waiting or self._running is not None or not self._suspects:
                return
            entry = self._suspects.popleft()
            self._running = entry.entry_id
            serve = self._serve
        assert serve is not None
        serve(entry)
