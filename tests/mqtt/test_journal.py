"""Request journal: states, durability across SIGKILL, dedupe, pruning, threads, file safety."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fullfs import small_tmpfs
from tts_bridge.mqtt.journal import (
    AcceptResult,
    AcceptStatus,
    Journal,
    JournalError,
    Resumed,
    request_key,
)

TOPIC = "tts_bridge/say/kitchen"
TEXT = b"The washing machine has finished"
OK = {"status": "ok", "id": "r1", "data": {"target": "kitchen", "tier": "fast", "cached": False}}


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with Journal(tmp_path / "journal" / "requests.sqlite3") as opened:
        yield opened


def _accept(
    journal: Journal,
    key: str,
    *,
    dedupe: bool = True,
    payload: bytes = TEXT,
    received_at: float | None = None,
) -> AcceptResult:
    return journal.accept(
        key,
        TOPIC,
        payload,
        response_topic="client/reply",
        correlation_data=b"\x00corr",
        received_at=time.time() if received_at is None else received_at,
        dedupe=dedupe,
    )


def test_new_then_in_progress_then_done(journal: Journal) -> None:
    key = request_key(TOPIC, TEXT, request_id="r1")
    first = _accept(journal, key)
    assert first.status is AcceptStatus.NEW
    assert journal.outcome(key) is None

    again = _accept(journal, key)
    assert again == AcceptResult(AcceptStatus.IN_PROGRESS, first.entry_id)
    [entry] = journal.unfinished()
    assert (entry.entry_id, entry.key, entry.topic, entry.payload) == (
        first.entry_id,
        key,
        TOPIC,
        TEXT,
    )
    assert (entry.response_topic, entry.correlation_data) == ("client/reply", b"\x00corr")

    journal.finish(first.entry_id, OK)
    assert journal.unfinished() == []
    assert journal.outcome(key) == OK
    duplicate = _accept(journal, key)
    assert duplicate == AcceptResult(AcceptStatus.DONE, first.entry_id, OK)


def test_finish_twice_keeps_the_first_answer_and_unknown_entries_are_refused(
    journal: Journal,
) -> None:
    key = request_key(TOPIC, TEXT, request_id="r1")
    entry_id = _accept(journal, key).entry_id
    journal.finish(entry_id, OK)
    journal.finish(entry_id, {"status": "error", "id": "r1"})
    assert journal.outcome(key) == OK
    with pytest.raises(JournalError, match="no entry 9999"):
        journal.finish(9999, OK)


def test_request_keys() -> None:
    with_id = request_key(TOPIC, TEXT, request_id="r1")
    # A client id covers publisher retries, which reach the bridge with new packet ids.
    assert request_key(TOPIC, TEXT, request_id="r1", packet_id=7) == with_id
    assert request_key(TOPIC, TEXT, request_id="r2") != with_id
    assert request_key(TOPIC, TEXT, request_id=1) != request_key(TOPIC, TEXT, request_id="1")
    # An id reused with another text is another announcement.
    assert request_key(TOPIC, b"Dinner is ready", request_id="r1") != with_id
    assert request_key("tts_bridge/say/hall", TEXT, request_id="r1") != with_id
    # Without an id, only the packet id tells a redelivery from a repeated announcement.
    plain = request_key(TOPIC, TEXT, packet_id=7)
    assert plain == request_key(TOPIC, TEXT, packet_id=7)
    assert plain != request_key(TOPIC, TEXT, packet_id=8)
    assert plain != with_id
    # Field boundaries are unambiguous.
    assert request_key("ab", b"c", packet_id=1) != request_key("a", b"bc", packet_id=1)


def test_repeated_plain_announcements_are_spoken_and_redeliveries_are_not(
    journal: Journal,
) -> None:
    # Three identical announcements; mosquitto gives them consecutive packet ids, and a
    # redelivery keeps the original id (measured, see request_key).
    keys = [request_key(TOPIC, TEXT, packet_id=mid) for mid in (2, 3, 4)]
    fresh = [_accept(journal, key, dedupe=False) for key in keys]
    assert [r.status for r in fresh] == [AcceptStatus.NEW] * 3
    journal.finish(fresh[0].entry_id, OK)

    redelivered = [_accept(journal, key, dedupe=True) for key in keys]
    assert [(r.status, r.entry_id) for r in redelivered] == [
        (AcceptStatus.DONE, fresh[0].entry_id),
        (AcceptStatus.IN_PROGRESS, fresh[1].entry_id),
        (AcceptStatus.IN_PROGRESS, fresh[2].entry_id),
    ]

    # A packet id reused later for the same text: a new announcement, and its redelivery
    # matches the newest entry, not the old answered one.
    reused = _accept(journal, keys[0], dedupe=False)
    assert reused.status is AcceptStatus.NEW
    assert _accept(journal, keys[0], dedupe=True) == AcceptResult(
        AcceptStatus.IN_PROGRESS, reused.entry_id
    )
    assert [e.entry_id for e in journal.unfinished()] == [
        fresh[1].entry_id,
        fresh[2].entry_id,
        reused.entry_id,
    ]


def test_close_and_reopen_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    done_key = request_key(TOPIC, TEXT, request_id="done")
    open_key = request_key(TOPIC, TEXT, request_id="open")
    with Journal(path) as journal:
        done = _accept(journal, done_key)
        journal.finish(done.entry_id, OK)
        pending = _accept(journal, open_key)
        journal.prune()  # the finished entry is recent: kept
    with Journal(path) as journal:
        assert [e.key for e in journal.unfinished()] == [open_key]
        assert journal.outcome(done_key) == OK
        assert _accept(journal, done_key).status is AcceptStatus.DONE
        # Entry ids keep growing across restarts, so a stale id never finishes a new request.
        newer = _accept(journal, request_key(TOPIC, TEXT, request_id="new"))
        assert newer.entry_id > pending.entry_id


_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from tts_bridge.mqtt.journal import Journal, request_key

    journal = Journal(Path(sys.argv[1]))
    def accept(request_id):
        key = request_key("tts_bridge/say/kitchen", b"hello", request_id=request_id)
        return key, journal.accept(
            key, "tts_bridge/say/kitchen", b"hello", response_topic=None,
            correlation_data=None, received_at=time.time(), dedupe=True,
        )
    done_key, done = accept("answered")
    journal.finish(done.entry_id, {"status": "ok", "id": "answered"})
    open_key, pending = accept("accepted")
    # The bridge would ack now; this process dies instead, before anything else happens.
    print(json.dumps([done_key, open_key, pending.entry_id]), flush=True)
    time.sleep(60)
    """
)


def test_sigkill_right_after_accept_leaves_the_entry_unfinished(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        done_key, open_key, entry_id = json.loads(line)
        # While the first process lives, a second bridge on the same journal is refused.
        with pytest.raises(JournalError, match="in use by another process"):
            Journal(path, lock_timeout_s=0.2)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()

    with Journal(path) as journal:
        [entry] = journal.unfinished()
        assert (entry.entry_id, entry.key, entry.payload) == (entry_id, open_key, b"hello")
        assert journal.outcome(done_key) == {"status": "ok", "id": "answered"}
        # The broker's redelivery of the unacked request finds it in progress.
        assert _accept(journal, open_key).status is AcceptStatus.IN_PROGRESS


def test_prune_drops_old_and_surplus_answers_never_unfinished(tmp_path: Path) -> None:
    with Journal(tmp_path / "requests.sqlite3", keep_done_s=60, max_entries=2) as journal:
        keys = [request_key(TOPIC, TEXT, request_id=f"r{i}") for i in range(5)]
        results = [_accept(journal, key) for key in keys]
        for result in results[:4]:
            journal.finish(result.entry_id, OK)

        now = time.time()
        assert journal.prune(now) == 2  # four answers, two allowed: the oldest two go
        assert [journal.outcome(k) is not None for k in keys] == [False, False, True, True, False]
        # Expired answers no longer count as duplicates, pruned or not.
        late = _accept(journal, keys[2], received_at=now + 120)
        assert late.status is AcceptStatus.NEW

        assert journal.prune(now + 120) == 2  # the answers for keys[2] and keys[3] expired
        assert [e.key for e in journal.unfinished()] == [keys[4], keys[2]]
        assert journal.prune(now + 10**9) == 0


def test_concurrent_accepts_of_one_key_make_one_entry(journal: Journal) -> None:
    key = request_key(TOPIC, TEXT, request_id="r1")
    threads_n = 12
    barrier = threading.Barrier(threads_n)
    results: list[AcceptResult] = []
    results_lock = threading.Lock()

    def accept() -> None:
        barrier.wait()
        result = _accept(journal, key)
        with results_lock:
            results.append(result)

    threads = [threading.Thread(target=accept) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    statuses = [r.status for r in results]
    assert statuses.count(AcceptStatus.NEW) == 1
    assert statuses.count(AcceptStatus.IN_PROGRESS) == threads_n - 1
    assert len({r.entry_id for r in results}) == 1
    assert len(journal.unfinished()) == 1


def test_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    directory = tmp_path / "state" / "journal"
    path = directory / "requests.sqlite3"
    old_umask = os.umask(0)
    try:
        with Journal(path) as journal:
            _accept(journal, request_key(TOPIC, TEXT, request_id="r1"))
            wal = Path(f"{path}-wal")
            assert wal.exists()
            assert stat.S_IMODE(wal.stat().st_mode) == 0o600
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    garbage = b"this is not a database\n" * 400
    path.write_bytes(garbage)
    with pytest.raises(JournalError, match="not an SQLite file") as caught:
        Journal(path)
    assert caught.value.path == path
    assert str(path) in str(caught.value)
    assert path.read_bytes() == garbage  # the bridge moves it aside; nothing was overwritten


def test_a_damaged_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    with Journal(path) as journal:
        for i in range(300):
            _accept(journal, request_key(TOPIC, TEXT, request_id=f"r{i}"), payload=TEXT * 20)
    page_size = 4096
    assert path.stat().st_size > 5 * page_size
    with path.open("r+b") as damaged:
        damaged.seek(3 * page_size)
        damaged.write(b"\xa5" * page_size)
    with pytest.raises(JournalError, match="damaged") as caught:
        Journal(path)
    assert caught.value.path == path


def test_another_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE settings (key TEXT, value TEXT)")
    other.commit()
    other.close()
    with pytest.raises(JournalError, match="not a tts_bridge journal"):
        Journal(path)


def test_a_closed_journal_raises(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "requests.sqlite3")
    journal.close()
    journal.close()
    with pytest.raises(JournalError, match="closed"):
        journal.unfinished()


# -- storage faults: the journal degrades, the request is still answered ----------------------


def test_full_disk_accepts_unjournaled_then_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_tmpfs(tmp_path / "fs") as fs:
        journal = Journal(fs.root / "journal.sqlite3")
        served = request_key(TOPIC, TEXT, request_id="before")
        before = _accept(journal, served)
        assert before.status is AcceptStatus.NEW and before.ack_now
        fs.fill()
        caplog.set_level(logging.WARNING, logger="tts_bridge.mqtt.journal")
        results = [
            _accept(journal, request_key(TOPIC, TEXT, request_id=f"full-{i}")) for i in range(5)
        ]
        assert {r.status for r in results} == {AcceptStatus.UNJOURNALED}
        assert not any(r.ack_now for r in results)  # ack after the answer is out
        journal.finish(results[0].entry_id, OK)  # entry 0: nothing to record, no error
        journal.finish(before.entry_id, OK)  # kept in memory until it can be written
        health = journal.health()
        assert health["degraded"] == "disk full"
        assert health["write_errors"] >= 6 and health["unrecorded_answers"] == 1
        warned = [r for r in caplog.records if "cannot be written" in r.getMessage()]
        assert len(warned) == 1  # one per condition, not per request
        # A redelivery of the answered request is answered from memory, not served again.
        duplicate = _accept(journal, served)
        assert (duplicate.status, duplicate.outcome) == (AcceptStatus.DONE, OK)

        fs.free()
        after = _accept(journal, request_key(TOPIC, TEXT, request_id="after"))
        assert after.status is AcceptStatus.NEW
        # Five accepts, one finish and the duplicate's accept failed while the disk was full.
        assert journal.health() == {"degraded": None, "write_errors": 7, "unrecorded_answers": 0}
        assert any("writable again" in r.getMessage() for r in caplog.records)
        journal.close()
        with Journal(fs.root / "journal.sqlite3") as reopened:
            # The answer given while the disk was full was written once space returned.
            assert [e.entry_id for e in reopened.unfinished()] == [after.entry_id]
            assert reopened.outcome(served) == OK


def test_an_attempt_is_counted_when_synthesis_starts_not_at_resume(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with Journal(path) as journal:
        poison_payload = b'{"text": "hi", "options": {"speed": 0.005}}'
        poison = _accept(
            journal, request_key(TOPIC, poison_payload, request_id="p"), payload=poison_payload
        )
        later = _accept(journal, request_key(TOPIC, TEXT, request_id="q"))
        last = _accept(journal, request_key(TOPIC, TEXT, request_id="r"))
        journal.started(poison.entry_id)  # and the process dies in its synthesis
    seen = []
    for run in range(2):  # two more starts; the poison one stops each
        with Journal(path) as journal:
            resumed = journal.resume(max_attempts=3)
            assert resumed.poison == []
            seen.append(
                (
                    [(e.entry_id, e.attempts) for e in resumed.entries],
                    [(e.entry_id, e.attempts) for e in resumed.suspects],
                )
            )
            if run == 0:  # the waiting ones are served first, and finish
                journal.started(later.entry_id)
                journal.finish(later.entry_id, OK)
                journal.finish(last.entry_id, OK)  # a cache hit: no synthesis, no attempt
            journal.started(poison.entry_id)
    assert seen == [
        ([(later.entry_id, 0), (last.entry_id, 0)], [(poison.entry_id, 1)]),
        ([], [(poison.entry_id, 2)]),
    ]
    with Journal(path) as journal:
        resumed = journal.resume(max_attempts=3)
        assert (resumed.entries, resumed.suspects) == ([], [])
        [entry] = resumed.poison
        assert (entry.entry_id, entry.attempts, entry.payload) == (
            poison.entry_id,
            3,
            poison_payload,
        )
        journal.finish(entry.entry_id, {"status": "error", "code": "poison_request"})
    with Journal(path) as journal:
        assert journal.resume() == Resumed([], [], [])
        assert journal.unfinished() == []


def test_waiting_entries_keep_their_count_and_a_batch_is_each_a_suspect(
    journal: Journal,
) -> None:
    keys = [request_key(TOPIC, TEXT, request_id=f"n{i}") for i in range(5)]
    ids = [_accept(journal, key).entry_id for key in keys]
    journal.started(ids[4])  # in synthesis at an earlier crash, and at this one again
    journal.started(ids[4])
    # Two in synthesis at once (two slots, or the fast lane) when the process dies; two waiting.
    journal.started(ids[1])
    journal.started(ids[3])
    for _ in range(3):  # starts that die before any synthesis began again change nothing
        resumed = journal.resume(max_attempts=3)
        assert [(e.entry_id, e.attempts) for e in resumed.entries] == [(ids[0], 0), (ids[2], 0)]
        # Fewest attempts first: the one that stopped the process twice goes last.
        assert [(e.entry_id, e.attempts) for e in resumed.suspects] == [
            (ids[1], 1),
            (ids[3], 1),
            (ids[4], 2),
        ]
        assert resumed.poison == []
    journal.started(ids[1])  # retried alone, and it finishes
    journal.finish(ids[1], OK)
    journal.started(ids[3])  # retried alone, it stops the process: 2
    journal.started(ids[3])  # ... and again: the limit
    resumed = journal.resume(max_attempts=3)
    assert [(e.entry_id, e.attempts) for e in resumed.poison] == [(ids[3], 3)]
    assert [e.entry_id for e in resumed.entries] == [ids[0], ids[2]]
    assert [e.entry_id for e in resumed.suspects] == [ids[4]]
    journal.started(0)  # an unjournaled request: nothing to count
    journal.finish(ids[0], OK)
    journal.started(ids[0])  # finished: nothing changes
    assert [e.attempts for e in journal.unfinished()] == [0, 3, 2]


def test_outcome_with_a_lone_surrogate_is_recorded(journal: Journal) -> None:
    result = _accept(journal, request_key(TOPIC, TEXT, request_id="s"))
    journal.finish(result.entry_id, {"status": "error", "id": "\ud800", "code": "x"})
    assert journal.outcome(request_key(TOPIC, TEXT, request_id="s")) == {
        "status": "error",
        "id": "\ud800",
        "code": "x",
    }


_V1_SCHEMA = """
CREATE TABLE entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, topic TEXT NOT NULL,
    payload BLOB NOT NULL, response_topic TEXT, correlation_data BLOB,
    received_at REAL NOT NULL, finished_at REAL, outcome TEXT
);
CREATE INDEX entries_by_key ON entries (key, id);
CREATE INDEX entries_unfinished ON entries (id) WHERE finished_at IS NULL;
PRAGMA application_id = 1414812490;
PRAGMA user_version = 1;
INSERT INTO entries (key, topic, payload, received_at) VALUES ('k', 'tts_bridge/say', X'6869', 1.0);
"""


def test_a_format_1_journal_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as old:
        old.executescript(_V1_SCHEMA)
    with Journal(path) as journal:
        [entry] = journal.unfinished()
        assert (entry.key, entry.payload, entry.attempts) == ("k", b"hi", 0)
        assert [e.attempts for e in journal.resume().entries] == [0]
        journal.started(entry.entry_id)
        assert [e.attempts for e in journal.unfinished()] == [1]
    with Journal(path) as journal:
        assert [e.attempts for e in journal.resume().suspects] == [1]
    with contextlib.closing(sqlite3.connect(path)) as reread:
        assert reread.execute("PRAGMA user_version").fetchone() == (2,)
