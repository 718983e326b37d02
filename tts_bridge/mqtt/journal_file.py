"""The request journal's file: created private, opened exclusively in WAL mode with full
fsync, its format checked and migrated (journal.py says what the journal is for)."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

from tts_bridge.system.durable import fsync_dir

_LOGGER = logging.getLogger(__name__)

# Marks the file as ours, so a journal path pointed at some other SQLite file (the sentence cache,
# say) is refused instead of having tables added to it. "TTSJ" in ASCII.
_APPLICATION_ID = 0x5454534A
_SCHEMA_VERSION = 2
_MIGRATIONS = {
    # version -> the script that brings a journal of that version to the next one
    1: "ALTER TABLE entries ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;",
}
_SCHEMA = """
CREATE TABLE entries (
    -- AUTOINCREMENT: an id is never reused after prune, so a stale id can never finish a newer
    -- request.
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    -- Not unique: identical plain-text announcements that are not redeliveries share a key and
    -- each gets its own entry (see request_key).
    key TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    response_topic TEXT,
    correlation_data BLOB,
    received_at REAL NOT NULL,
    finished_at REAL,
    outcome TEXT,
    -- How often its synthesis started (journals before started() existed: it was resumed).
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX entries_by_key ON entries (key, id);
CREATE INDEX entries_unfinished ON entries (id) WHERE finished_at IS NULL;
"""


class JournalError(Exception):
    """The journal cannot be opened or written; ``path`` is the journal file.

    At start this usually means a damaged file or one that is not a journal: move it aside and
    start with an empty journal (its unfinished requests are lost, which the log should say).
    """

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"request journal {path}: {message}")
        self.path = path


def _prepare_file(path: Path) -> None:
    directory = path.parent
    try:
        if not directory.exists():
            # Queued announcements say what happens in a home; only the bridge's user may
            # read them. An existing directory is left as the user set it up.
            directory.mkdir(parents=True, mode=0o700)
            os.chmod(directory, 0o700)  # mkdir applies the umask; 0700 exactly, not less
        # Created before SQLite opens it, so it is never briefly readable by others; SQLite
        # gives the -wal file the database file's mode.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        fsync_dir(directory)  # the new file's name survives a power cut, too
    except OSError as exc:
        raise JournalError(path, f"cannot create it: {exc}") from exc


def open_file(path: Path, lock_timeout_s: float) -> sqlite3.Connection:
    """The journal's file, created (mode 0600, its folder 0700) or checked and migrated, and
    locked for this process; raises JournalError when it cannot be."""
    _prepare_file(path)
    try:
        # isolation_level=None: transactions are begun and committed explicitly below.
        connection = sqlite3.connect(
            path, timeout=lock_timeout_s, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise JournalError(path, f"cannot open it: {exc}") from exc
    try:
        _configure(path, connection)
        _check_or_create_schema(path, connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _configure(path: Path, connection: sqlite3.Connection) -> None:
    try:
        # Exclusive: a second bridge on the same journal would resume the same unfinished
        # entries and speak them twice, so it is refused. Set before WAL, so the WAL index
        # lives in memory and no -shm file is needed.
        connection.execute("PRAGMA locking_mode = EXCLUSIVE")
        mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        # FULL, not WAL's usual NORMAL: NORMAL survives a crash of the bridge but may lose
        # the last commits on power loss or a kernel crash. accept() is followed by the ack,
        # after which the broker drops its copy, so a commit lost then is a request lost.
        # A lost finish() would speak a request twice. One fsync per commit buys both.
        connection.execute("PRAGMA synchronous = FULL")
        # Take the lock now, not at the first request, so a second bridge fails at start.
        connection.execute("BEGIN EXCLUSIVE")
        connection.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise JournalError(path, "in use by another process") from exc
        raise JournalError(path, f"cannot use it: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        raise JournalError(path, f"damaged or not an SQLite file ({exc})") from exc
    if str(mode).lower() != "wal":
        raise JournalError(path, f"cannot switch to WAL mode (got {mode!r})")


def _check_or_create_schema(path: Path, connection: sqlite3.Connection) -> None:
    try:
        app_id = connection.execute("PRAGMA application_id").fetchone()[0]
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id == 0 and version == 0 and tables == 0:
            # One transaction in the script itself: executescript() commits any open one.
            connection.executescript(
                f"BEGIN IMMEDIATE; {_SCHEMA}"
                f"PRAGMA application_id = {_APPLICATION_ID};"
                f"PRAGMA user_version = {_SCHEMA_VERSION}; COMMIT;"
            )
            _LOGGER.info("Created request journal %s", path)
            return
        if app_id != _APPLICATION_ID:
            raise JournalError(path, "an SQLite file, but not a tts_bridge journal")
        while version in _MIGRATIONS:
            connection.executescript(
                f"BEGIN IMMEDIATE; {_MIGRATIONS[version]}"
                f"PRAGMA user_version = {version + 1}; COMMIT;"
            )
            _LOGGER.info("Request journal %s migrated to format %d", path, version + 1)
            version += 1
        if version != _SCHEMA_VERSION:
            raise JournalError(
                path, f"journal format {version}, this version reads {_SCHEMA_VERSION}"
            )
        # A damaged page found now lets the bridge move the file aside before it acks
        # anything; found later, it would fail requests one by one. Linear in the file's
        # size, which max_entries keeps small.
        problems = [row[0] for row in connection.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise JournalError(path, "damaged: " + "; ".join(problems))
    except sqlite3.DatabaseError as exc:
        raise JournalError(path, f"damaged or not an SQLite file ({exc})") from exc
