"""Durable request journal: at-least-once delivery of say requests, answered exactly once.

The bridge subscribes with manual acks. A request is written here (committed and fsynced) before
it is acked to the broker, so once the broker forgets it, the journal remembers it: after a crash
the bridge resumes every unfinished entry. A redelivered duplicate (the broker re-sends what was
never acked, with the dup flag and its original packet id) finds its entry and is answered from
the stored outcome, never synthesized or spoken twice.

Order of operations in the bridge::

    key = request_key(msg.topic, msg.payload, request_id=parsed_id, packet_id=msg.mid)
    result = journal.accept(key, msg.topic, msg.payload, ...,
                            dedupe=parsed_id is not None or msg.dup)
    NEW, IN_PROGRESS, DONE -> client.ack(msg.mid, msg.qos)  # only after accept() returned
    NEW -> serve; publish; journal.finish(result.entry_id, response_body)
    IN_PROGRESS -> nothing (this run is serving it, or resumed it at start)
    DONE -> publish result.outcome again, no synthesis
    UNJOURNALED -> serve; publish; then client.ack(msg.mid, msg.qos)

UNJOURNALED means the journal cannot be written (disk full, I/O error): the request is served
without it and acked only once its answer is out, so a crash before that leaves it with the
broker, which delivers it again; at-least-once holds, only without the journal's dedupe. The
journal logs one warning per condition and tries again at every accept(), so it recovers by
itself when space returns; answers it could not record meanwhile are recorded then.

An attempt is counted when an entry's synthesis starts: ``started(entry_id)``, committed as
durably as accept() before the engine runs. An unfinished entry with an attempt was in synthesis
when a process died. At start, ``resume(max_attempts)`` hands back the unfinished entries in
three groups: the waiting ones, never started (their count stays 0: they stopped nothing); the
suspects, started and never finished (serve them after the waiting ones, one at a time, fewest
attempts first, so that a request that kills the bridge (out of memory, say) cannot take the
others with it, and one of a batch that died together is told from the rest); and the poison
ones, started ``max_attempts`` times without finishing: answer those with an error and finish()
them.

What is not covered: a crash after the audio went out but before finish() committed speaks that
request again after restart (publish and commit cannot be one atomic step; finishing first would
lose requests instead). The journal is local, so bridges sharing a subscription do not see each
other's entries.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tts_bridge.mqtt.journal_file import JournalError, open_file
from tts_bridge.system.faults import FaultCondition

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "AcceptResult",
    "AcceptStatus",
    "Journal",
    "JournalEntry",
    "JournalError",
    "Resumed",
    "request_key",
]

_LOGGER = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 3
"""Times an entry's synthesis starts without it finishing before resume() hands it back as
poison."""


class AcceptStatus(enum.Enum):
    NEW = "new"
    """Journaled now: serve it, then finish()."""
    IN_PROGRESS = "in_progress"
    """Accepted earlier and not finished: being served, or resumed from unfinished() at start."""
    DONE = "done"
    """Answered earlier: publish ``outcome`` again, do not synthesize."""
    UNJOURNALED = "unjournaled"
    """The journal cannot be written now: serve it, and ack only after the answer is out."""


@dataclass(frozen=True)
class AcceptResult:
    status: AcceptStatus
    entry_id: int
    """The entry to finish(); keys can repeat, entry ids cannot. 0 for UNJOURNALED (there is
    no entry; finish(0, ...) does nothing)."""
    outcome: dict[str, Any] | None = None
    """The stored response body, for DONE only."""

    @property
    def ack_now(self) -> bool:
        """Ack the message now (True), or only after its answer is out (UNJOURNALED)."""
        return self.status is not AcceptStatus.UNJOURNALED


@dataclass(frozen=True)
class JournalEntry:
    """An accepted request, as received: enough to parse and serve it again after a restart."""

    entry_id: int
    key: str
    topic: str
    payload: bytes
    response_topic: str | None
    correlation_data: bytes | None
    received_at: float
    """Wall-clock seconds (time.time()), so that it still means something after a restart."""
    attempts: int = 0
    """Times its synthesis started without it being finished."""


@dataclass(frozen=True)
class Resumed:
    """What resume() hands back at start."""

    entries: list[JournalEntry]
    """Never started: serve these again first, oldest first."""
    suspects: list[JournalEntry]
    """Started and never finished, so in synthesis when a process stopped (they may have
    stopped it): serve these after the waiting ones, one at a time, in this order (fewest
    attempts first, then oldest)."""
    poison: list[JournalEntry]
    """Synthesis started ``max_attempts`` times and never finished: answer each with an error
    (code ``poison_request``) and finish() it, do not serve it again."""


def request_key(
    topic: str,
    payload: bytes,
    *,
    request_id: str | int | None = None,
    packet_id: int | None = None,
) -> str:
    """The journal key of a received request; pass ``dedupe`` to accept() as documented here.

    With a client-given ``request_id`` the key is the topic and payload (which contains the id),
    and accept() should dedupe always (``dedupe=True``): the client promised one id per request,
    so a second copy is a duplicate even when it is not a broker redelivery, e.g. a publisher
    that re-sent after a reconnect. The payload is part of the key so that an id reused with a
    different text is still spoken; an id reused with the same text within ``keep_done_s`` is
    answered as a duplicate and not spoken, so clients should send a fresh id each time (Home
    Assistant: ``"id": "{{ context.id }}"``).

    Without an id, the same text can legitimately be announced twice ("The front door is open"),
    so the key adds the MQTT packet id and accept() should dedupe only when the packet is a
    broker redelivery (``dedupe=msg.dup``). A redelivery carries its original packet id (MQTT
    4.4; measured on mosquitto 2.0, also after a broker SIGKILL with persistence), and a packet id
    is not reused while its message is unacked, so the newest entry with that key is the one
    being redelivered. The one ambiguity: the same text arriving again with a reused packet id,
    and the bridge dying between receiving it and accept(); its redelivery then matches the
    earlier entry and is not spoken. mosquitto counts packet ids up to 65535 before reusing
    one, so this needs that many messages within the window; brokers that reuse ids sooner
    make it likelier, which is one more reason for clients to send an id.
    """
    digest = hashlib.sha256()
    # Length prefixes keep ("ab", b"c") and ("a", b"bc") apart.
    parts = [topic.encode(), payload]
    if request_id is not None:
        parts.append(f"{type(request_id).__name__}:{request_id}".encode())
    elif packet_id is not None:
        parts.append(str(packet_id).encode())
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return ("id:" if request_id is not None else "msg:") + digest.hexdigest()


class Journal:
    """The request journal: one SQLite file, used by one bridge process at a time.

    Thread-safe: one connection guarded by a lock. SQLite writes one transaction at a time
    anyway, and accept()'s look-up-then-insert must be atomic across the MQTT thread and the
    synthesis threads; a lock around one connection gives that without busy retries, and
    close() can close the only connection there is (per-thread connections would outlive their
    threads and could not all be closed).
    """

    def __init__(
        self,
        path: Path,
        *,
        keep_done_s: float = 86400,
        max_entries: int = 10000,
        lock_timeout_s: float = 5.0,
    ) -> None:
        """Open or create the journal at ``path``; raises JournalError when it cannot.

        ``keep_done_s`` is the dedupe window: it should be at least the MQTT session expiry,
        because the broker redelivers unacked requests for that long. ``max_entries`` bounds the
        finished entries kept (unfinished ones are never dropped). ``lock_timeout_s`` is how long
        to wait for another process that still holds the journal, e.g. a bridge shutting down.
        """
        self.path = Path(path)
        self.keep_done_s = keep_done_s
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._lock_timeout_s = lock_timeout_s
        self._fault = FaultCondition(
            _LOGGER,
            f"Request journal {self.path}",
            "serving requests without it, each acknowledged after its answer is out",
            retry_s=0.0,  # every accept() tries again: one small write, and it must recover
        )
        # finish() calls that could not be written: entry id -> outcome, written at the next
        # transaction that works (until then a restart would serve them again).
        self._unwritten: dict[int, str] = {}
        self._after_commit: list[Callable[[], object]] = []
        self._connection: sqlite3.Connection | None = open_file(self.path, lock_timeout_s)

    # -- the request path -------------------------------------------------------------------

    def accept(
        self,
        key: str,
        topic: str,
        payload: bytes,
        *,
        response_topic: str | None,
        correlation_data: bytes | None,
        received_at: float,
        dedupe: bool,
    ) -> AcceptResult:
        """Journal a received request, durably, unless it is a duplicate; then ack it.

        With ``dedupe`` (see request_key for when) an entry with the same key from the last
        ``keep_done_s`` makes this a duplicate: IN_PROGRESS or DONE, nothing written. Otherwise,
        or when there is no such entry, the request is committed to disk before this returns
        NEW. When it cannot be written (disk full, I/O error) this returns UNJOURNALED instead
        of raising: serve the request and ack it only after its answer is out. Raises
        JournalError only when the journal is closed.
        """
        try:
            with self._transaction() as connection:
                self._write_unwritten(connection)
                result = self._accept(
                    connection,
                    key,
                    topic=topic,
                    payload=payload,
                    response_topic=response_topic,
                    correlation_data=correlation_data,
                    received_at=received_at,
                    dedupe=dedupe,
                )
        except _StorageError as fault:
            self._fault.failed("journaling a request", fault.cause)
            # A duplicate is still recognised: the look-up only reads.
            duplicate = self._read_only_duplicate(key, received_at) if dedupe else None
            return duplicate or AcceptResult(AcceptStatus.UNJOURNALED, 0)
        self._fault.succeeded()
        return result

    def _read_only_duplicate(self, key: str, received_at: float) -> AcceptResult | None:
        with self._lock:
            if self._connection is None:
                return None
            try:
                return self._duplicate(self._connection, key, received_at)
            except sqlite3.Error as exc:
                _LOGGER.debug("Journal look-up failed too: %s", exc)
                return None

    def _accept(
        self,
        connection: sqlite3.Connection,
        key: str,
        *,
        topic: str,
        payload: bytes,
        response_topic: str | None,
        correlation_data: bytes | None,
        received_at: float,
        dedupe: bool,
    ) -> AcceptResult:
        if dedupe:
            duplicate = self._duplicate(connection, key, received_at)
            if duplicate is not None:
                return duplicate
        cursor = connection.execute(
            "INSERT INTO entries (key, topic, payload, response_topic, correlation_data, "
            "received_at) VALUES (?, ?, ?, ?, ?, ?)",
            (key, topic, payload, response_topic, correlation_data, received_at),
        )
        entry_id = cursor.lastrowid
        assert entry_id is not None  # always set after an INSERT into a rowid table
        return AcceptResult(AcceptStatus.NEW, entry_id)

    def finish(self, entry_id: int, outcome: dict[str, Any]) -> None:
        """Store the response body that was published and mark the entry done, durably.

        Call it after the answer went out. The payload is dropped: answering a duplicate needs
        only the outcome, and the text of past announcements is not kept longer than needed.
        Finishing an entry twice keeps the first outcome (that is the answer already given).
        ``entry_id`` 0 (an UNJOURNALED request) does nothing. When the journal cannot be
        written the outcome is kept in memory and written with the next transaction that works
        (a duplicate is answered from it meanwhile); a restart before that serves it again.
        """
        if entry_id == 0:
            return
        body = json.dumps(outcome, ensure_ascii=True, separators=(",", ":"))
        try:
            with self._transaction() as connection:
                self._write_unwritten(connection)
                updated = self._finish(connection, entry_id, body)
                exists = (
                    updated
                    or connection.execute(
                        "SELECT 1 FROM entries WHERE id = ?", (entry_id,)
                    ).fetchone()
                )
        except _StorageError as fault:
            self._fault.failed("recording an answer", fault.cause)
            self._unwritten.setdefault(entry_id, body)
            return
        self._fault.succeeded()
        if updated:
            return
        if exists is None:
            raise JournalError(self.path, f"no entry {entry_id} to finish")
        _LOGGER.warning(
            "Journal entry %d was already finished; keeping the first outcome", entry_id
        )

    def _duplicate(
        self, connection: sqlite3.Connection, key: str, received_at: float
    ) -> AcceptResult | None:
        row = connection.execute(
            "SELECT id, finished_at, outcome FROM entries WHERE key = ? "
            "AND (finished_at IS NULL OR finished_at >= ?) ORDER BY id DESC LIMIT 1",
            (key, received_at - self.keep_done_s),
        ).fetchone()
        if row is None:
            return None
        entry_id, finished_at, outcome = row
        if finished_at is None:
            unwritten = self._unwritten.get(entry_id)
            if unwritten is None:
                return AcceptResult(AcceptStatus.IN_PROGRESS, entry_id)
            return AcceptResult(AcceptStatus.DONE, entry_id, json.loads(unwritten))
        return AcceptResult(AcceptStatus.DONE, entry_id, json.loads(outcome))

    @staticmethod
    def _finish(connection: sqlite3.Connection, entry_id: int, body: str) -> bool:
        return bool(
            connection.execute(
                "UPDATE entries SET finished_at = ?, outcome = ?, payload = X'', "
                "response_topic = NULL, correlation_data = NULL "
                "WHERE id = ? AND finished_at IS NULL",
                (time.time(), body, entry_id),
            ).rowcount
        )

    def _write_unwritten(self, connection: sqlite3.Connection) -> None:
        """Record the answers finish() could not write, in the caller's transaction."""
        if not self._unwritten:
            return
        pending = dict(self._unwritten)
        for entry_id, body in pending.items():
            self._finish(connection, entry_id, body)
        # Forgotten only once the transaction commits (else the next one tries again).
        self._after_commit.append(lambda: [self._unwritten.pop(i, None) for i in pending])

    def health(self) -> dict[str, Any]:
        """For the bridge's health report: whether the journal can be written now."""
        return {
            "degraded": self._fault.condition,
            "write_errors": self._fault.errors,
            "unrecorded_answers": len(self._unwritten),
        }

    # -- start-up, look-ups and housekeeping ------------------------------------------------

    def unfinished(self) -> list[JournalEntry]:
        """Accepted but not finished entries, oldest accepted first (a look, no attempt counted;
        the bridge resumes with resume())."""
        with self._transaction() as connection:
            rows = connection.execute(_UNFINISHED).fetchall()
        return [_entry(row) for row in rows if row[0] not in self._unwritten]

    def started(self, entry_id: int) -> None:
        """Count an attempt: the entry's synthesis starts now. Committed (as durably as accept())
        before this returns, so that the next start after a process killed in this synthesis
        finds the entry a suspect. When it cannot be written (disk full) the attempt is not
        counted and synthesis goes ahead (logged as the journal's fault). ``entry_id`` 0 (an
        UNJOURNALED request) does nothing."""
        if entry_id == 0:
            return
        try:
            with self._transaction() as connection:
                self._write_unwritten(connection)
                connection.execute(
                    "UPDATE entries SET attempts = attempts + 1 "
                    "WHERE id = ? AND finished_at IS NULL",
                    (entry_id,),
                )
        except _StorageError as fault:
            self._fault.failed("counting an attempt", fault.cause)
            return
        self._fault.succeeded()

    def resume(self, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Resumed:
        """The unfinished entries to serve again at start: waiting, suspects and poison (see
        Resumed). Writes nothing: started() counts when synthesis begins again."""
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        with self._transaction() as connection:
            rows = connection.execute(_UNFINISHED).fetchall()
        entries = [_entry(row) for row in rows if row[0] not in self._unwritten]
        suspects = [e for e in entries if 0 < e.attempts < max_attempts]
        return Resumed(
            entries=[e for e in entries if e.attempts == 0],
            suspects=sorted(suspects, key=lambda e: (e.attempts, e.entry_id)),
            poison=[e for e in entries if e.attempts >= max_attempts],
        )

    def outcome(self, key: str) -> dict[str, Any] | None:
        """The newest stored outcome for ``key``, or None when none is finished (or kept)."""
        with self._transaction() as connection:
            row = connection.execute(
                "SELECT outcome FROM entries WHERE key = ? AND finished_at IS NOT NULL "
                "ORDER BY id DESC LIMIT 1",
                (key,),
            ).fetchone()
        if row is None:
            return None
        result: dict[str, Any] = json.loads(row[0])
        return result

    def prune(self, now: float | None = None) -> int:
        """Drop finished entries older than keep_done_s and beyond max_entries; returns how many.

        Unfinished entries are never dropped. Call it at start and then periodically (hourly is
        plenty); accept() ignores expired entries whether or not they were pruned yet.
        """
        cutoff = (time.time() if now is None else now) - self.keep_done_s
        with self._transaction() as connection:
            expired = connection.execute(
                "DELETE FROM entries WHERE finished_at IS NOT NULL AND finished_at < ?", (cutoff,)
            ).rowcount
            surplus = connection.execute(
                "DELETE FROM entries WHERE finished_at IS NOT NULL AND id NOT IN ("
                "SELECT id FROM entries WHERE finished_at IS NOT NULL ORDER BY id DESC LIMIT ?)",
                (self.max_entries,),
            ).rowcount
        if expired or surplus:
            _LOGGER.debug("Journal pruned: %d expired, %d over the limit", expired, surplus)
        return expired + surplus

    def close(self) -> None:
        """Close the file and release it for another process; safe to call twice."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection in one transaction under the lock.

        sqlite3 errors become _StorageError (a JournalError), which accept() and finish() turn
        into their degraded answers; the other methods let it propagate as a JournalError.
        """
        with self._lock:
            connection = self._connection
            if connection is None:
                raise JournalError(self.path, "closed")
            self._after_commit = []
            try:
                # The file is locked exclusively by this process, so IMMEDIATE never waits; it
                # just makes the look-up and the insert in accept() one transaction.
                connection.execute("BEGIN IMMEDIATE")
                try:
                    yield connection
                except BaseException:
                    if connection.in_transaction:  # some errors (disk full) roll back already
                        connection.execute("ROLLBACK")
                    raise
                connection.execute("COMMIT")
            except sqlite3.Error as exc:
                # Disk full, I/O error, damage found late: the caller must not ack.
                if connection.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        connection.execute("ROLLBACK")
                raise _StorageError(self.path, exc) from exc
            for hook in self._after_commit:
                hook()


class _StorageError(JournalError):
    """A journal operation failed in SQLite (disk full, I/O error, ...)."""

    def __init__(self, path: Path, cause: sqlite3.Error) -> None:
        super().__init__(path, f"{type(cause).__name__}: {cause}")
        self.cause = cause


_UNFINISHED = (
    "SELECT id, key, topic, payload, response_topic, correlation_data, received_at, attempts "
    "FROM entries WHERE finished_at IS NULL ORDER BY id"
)


def _entry(row: tuple[Any, ...]) -> JournalEntry:
    return JournalEntry(
        entry_id=row[0],
        key=row[1],
        topic=row[2],
        payload=bytes(row[3]),
        response_topic=row[4],
        correlation_data=bytes(row[5]) if row[5] is not None else None,
        received_at=row[6],
        attempts=row[7],
    )
