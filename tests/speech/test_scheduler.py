"""The scheduler's lanes: live quality jobs in the synthesis slots, fast-tier jobs beside them.

Jobs here block on events, so the order of events is forced rather than timed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from tts_bridge.speech.scheduler import AGING_S, LiveJob, Scheduler, Ticket

WAIT_S = 10.0


class Blocker:
    """A job that reports it started, then waits until released."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.started = threading.Event()
        self.release = threading.Event()
        self._log = log

    def __call__(self) -> None:
        self._log.append(f"{self.name} start")
        self.started.set()
        assert self.release.wait(WAIT_S)
        self._log.append(f"{self.name} end")


class OneTask:
    """A background source with a single task that records when it ran."""

    def __init__(self) -> None:
        self.ran = threading.Event()
        self.asked = threading.Event()

    def next_task(self) -> Callable[[], None] | None:
        self.asked.set()
        if self.ran.is_set():
            return None
        return self.ran.set


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    made = Scheduler(1, 3, idle_delay_s=0.0, idle_max_load=1000.0, idle_nice=0)
    made.start()
    yield made
    made.stop(WAIT_S)


def test_a_fast_job_does_not_wait_for_the_quality_job_in_the_slot(scheduler: Scheduler) -> None:
    log: list[str] = []
    quality, fast = Blocker("quality", log), Blocker("fast", log)
    assert scheduler.submit_live(quality, Ticket(5.0))
    assert quality.started.wait(WAIT_S)
    assert scheduler.submit_live(fast, Ticket(0.1), urgent=True)
    # The only slot is held by the quality job, yet the fast job starts.
    assert fast.started.wait(WAIT_S), log
    fast.release.set()
    quality.release.set()
    assert scheduler.stop(WAIT_S)
    assert log.index("fast start") < log.index("quality end"), log


def test_quality_jobs_still_take_turns_in_the_slot(scheduler: Scheduler) -> None:
    log: list[str] = []
    first, second = Blocker("first", log), Blocker("second", log)
    assert scheduler.submit_live(first)
    assert first.started.wait(WAIT_S)
    assert scheduler.submit_live(second)
    assert not second.started.wait(0.3)  # one slot: it waits
    first.release.set()
    assert second.started.wait(WAIT_S)
    second.release.set()
    assert scheduler.stop(WAIT_S)
    assert log == ["first start", "first end", "second start", "second end"]


def test_backlog_counts_the_slots_work_not_the_fast_lane(scheduler: Scheduler) -> None:
    log: list[str] = []
    running, fast = Blocker("running", log), Blocker("fast", log)
    assert scheduler.submit_live(running, Ticket(4.0))
    assert running.started.wait(WAIT_S)
    queued = Blocker("queued", log)
    assert scheduler.submit_live(queued, Ticket(2.0))
    assert scheduler.submit_live(fast, Ticket(3.0), urgent=True)
    assert fast.started.wait(WAIT_S)
    # What a new quality job would wait for: the running job's rest and the queued one.
    assert 5.0 < scheduler.backlog_s() <= 6.0
    assert scheduler.active == 2  # health still shows both
    for job in (fast, running, queued):
        job.release.set()


def test_the_queue_bound_counts_both_lanes() -> None:
    made = Scheduler(1, 2, idle_delay_s=0.0, idle_max_load=1000.0, idle_nice=0)
    log: list[str] = []
    # Not started: every job stays queued.
    assert made.submit_live(Blocker("q1", log))
    assert made.submit_live(Blocker("f1", log), urgent=True)
    assert made.depth == 2
    assert not made.submit_live(Blocker("q2", log))
    assert not made.submit_live(Blocker("f2", log), urgent=True)
    assert made.submit_live(Blocker("resumed", log), urgent=True, force=True)
    assert made.depth == 3


def test_stop_finishes_queued_jobs_of_both_lanes() -> None:
    made = Scheduler(1, 8, idle_delay_s=0.0, idle_max_load=1000.0, idle_nice=0)
    done: list[str] = []
    for name, urgent in (("q1", False), ("f1", True), ("q2", False), ("f2", True)):
        assert made.submit_live(lambda name=name: done.append(name), urgent=urgent)  # type: ignore[misc]
    made.start()
    assert made.stop(WAIT_S)
    assert sorted(done) == ["f1", "f2", "q1", "q2"]
    assert not made.submit_live(lambda: None, urgent=True)


def test_background_work_waits_while_a_fast_job_runs() -> None:
    source = OneTask()
    made = Scheduler(1, 8, background=source, idle_delay_s=0.0, idle_max_load=1000.0, idle_nice=0)
    log: list[str] = []
    fast = Blocker("fast", log)
    assert made.submit_live(fast, urgent=True)
    made.start()
    try:
        assert fast.started.wait(WAIT_S)
        # The idle thread polls every 0.2 s; it must not take its task while live work runs.
        assert not source.ran.wait(1.0)
        fast.release.set()
        assert source.ran.wait(WAIT_S)
    finally:
        fast.release.set()
        made.stop(WAIT_S)


# -- priority, shares and admission --------------------------------------------------------


def _order_of(made: Scheduler, jobs: list[tuple[str, dict[str, object]]]) -> list[str]:
    """Queue `jobs` on a stopped scheduler (one slot), then run them: the order they ran in."""
    ran: list[str] = []
    for name, kwargs in jobs:
        urgent = bool(kwargs.pop("urgent", False))
        work = Ticket(**kwargs)  # type: ignore[arg-type]
        assert made.submit_live(lambda name=name: ran.append(name), work, urgent=urgent)  # type: ignore[misc]
    made.start()
    assert made.stop(WAIT_S)
    return ran


def test_alert_before_high_before_normal_before_low() -> None:
    made = Scheduler(1, 16, idle_nice=0)
    ran = _order_of(
        made,
        [
            ("low", {"priority": "low"}),
            ("normal", {"priority": "normal"}),
            ("alert", {"priority": "alert"}),
            ("high", {"priority": "high"}),
        ],
    )
    assert ran == ["alert", "high", "normal", "low"]


def test_within_a_priority_shorter_work_goes_first_then_arrival() -> None:
    made = Scheduler(1, 16, idle_nice=0)
    ran = _order_of(
        made,
        [
            ("long", {"estimate_s": 9.0}),
            ("short", {"estimate_s": 0.5}),
            ("medium", {"estimate_s": 2.0}),
            ("short too", {"estimate_s": 0.5}),
        ],
    )
    assert ran == ["short", "short too", "medium", "long"]


def test_cache_hits_come_after_alerts_only_and_run_beside_the_slot() -> None:
    made = Scheduler(1, 16, idle_nice=0)
    ran = _order_of(
        made,
        [
            ("high", {"priority": "high", "urgent": True}),
            ("hit", {"priority": "low", "cached": True}),
            ("alert", {"priority": "alert", "urgent": True}),
        ],
    )
    assert ran == ["alert", "hit", "high"]  # all three in the fast lane


def test_waiting_moves_a_job_up_so_nothing_starves() -> None:
    now = 1000.0
    old_low = LiveJob(lambda: None, 9.0, priority="low", seq=1, queued_at=now - 3 * AGING_S)
    new_normal = LiveJob(lambda: None, 0.1, priority="normal", seq=2, queued_at=now)
    new_alert = LiveJob(lambda: None, 0.1, priority="alert", seq=3, queued_at=now)
    hit = LiveJob(lambda: None, 0.0, cached=True, seq=4, queued_at=now)
    ordered = sorted([new_normal, old_low, new_alert, hit], key=lambda j: j.order(now))
    # Aged past normal and high, but never past a cache hit or an alert.
    assert ordered == [new_alert, hit, old_low, new_normal]
    ancient = LiveJob(lambda: None, 9.0, priority="low", seq=5, queued_at=now - 1e6)
    assert ancient.order(now)[0] == hit.order(now)[0]


def test_each_door_and_each_peer_has_a_share_of_the_queue() -> None:
    made = Scheduler(1, 8, door_share=0.5, peer_share=0.25)  # door 4, peer 2; not started
    assert made.submit_live(lambda: None, Ticket(door="wyoming", peer="10.0.0.5"))
    assert made.submit_live(lambda: None, Ticket(door="wyoming", peer="10.0.0.5"))
    refused = made.submit_live(lambda: None, Ticket(door="wyoming", peer="10.0.0.5"))
    assert not refused and refused.limit == "limits.peer_share", refused
    assert "10.0.0.5" in refused.message and "limits.peer_share" in refused.message
    assert made.submit_live(lambda: None, Ticket(door="wyoming", peer="10.0.0.6"))
    assert made.submit_live(lambda: None, Ticket(door="wyoming", peer="10.0.0.6"))
    refused = made.submit_live(lambda: None, Ticket(door="wyoming", peer="10.0.0.7"))
    assert refused.limit == "limits.door_share" and "wyoming" in refused.message, refused
    # The other doors keep their place.
    for _ in range(4):
        assert made.submit_live(lambda: None, Ticket(door="mqtt"))
    refused = made.submit_live(lambda: None, Ticket(door="http", peer="10.0.0.8"))
    assert refused.limit == "limits.max_queue", refused
    # A cache hit is never refused; an alert has a reserve as large as the queue.
    assert made.submit_live(lambda: None, Ticket(door="wyoming", peer="10.0.0.5", cached=True))
    for _ in range(7):
        assert made.submit_live(lambda: None, Ticket(door="mqtt", priority="alert"))
    refused = made.submit_live(lambda: None, Ticket(door="mqtt", priority="alert"))
    assert refused.limit == "limits.max_queue", refused
    assert made.refusals() == {
        "limits.peer_share": 1,
        "limits.door_share": 1,
        "limits.max_queue": 2,
    }
    assert made.doors() == {"wyoming": 5, "mqtt": 11}
    lanes = made.lanes()
    assert lanes["quality"]["normal"] == 8 and lanes["quality"]["alert"] == 7
    assert lanes["fast"]["cached"] == 1
    # Cache hits have a ceiling too, far above the queue: memory stays bounded.
    while made.depth < 4 * 8:
        assert made.submit_live(lambda: None, Ticket(door="http", cached=True))
    refused = made.submit_live(lambda: None, Ticket(door="http", cached=True))
    assert refused.limit == "limits.max_queue", refused
    assert made.refusals()["limits.max_queue"] == 3


def test_a_resumed_request_skips_every_limit_but_stopping() -> None:
    made = Scheduler(1, 1, door_share=0.5, peer_share=0.5)
    assert made.submit_live(lambda: None, Ticket(door="mqtt"))
    assert made.submit_live(lambda: None, Ticket(door="mqtt"), force=True)
    made.start()
    assert made.stop(WAIT_S)
    stopped = made.submit_live(lambda: None, force=True)
    assert not stopped and stopped.limit == "stopping"
