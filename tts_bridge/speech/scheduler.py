"""Synthesis scheduling: who goes first when the bridge is busy, and who is told "busy".

- Every live request has a priority: alert > high > normal > low (idle work runs below all of
  them, see below). A smoke alarm must not wait behind a weather report.
- Two lanes. The quality lane runs in `concurrency` synthesis slots. The fast lane has one worker
  of its own that needs no slot: jobs routed to the fast voice (the quality tier would miss the
  latency budget, so they must not wait for a quality job rendering in the slot: a ChatTTS
  sentence on torch takes seconds, hibari milliseconds) and cache hits (they cost milliseconds).
- In a lane the next job is the best of: alerts, then cache hits, then high, normal, low; within
  one rank the shortest estimate first (short announcements are not held up by a long text),
  then arrival order. A job moves up one rank per AGING_S waited (never above cache hits), so a
  long or low job is never starved by a stream of short or higher ones.
- Admission never blocks: a flood is answered "busy" instead of growing memory, and the answer
  names the limit it hit. The live queue holds `max_queue` jobs; one door (mqtt, hermes, wyoming,
  http) may fill `door_share` of it and one client address `peer_share`, so a single Wyoming
  client cannot fill it and the house's own MQTT announcements keep their place. A cache hit is
  not refused (short of a memory ceiling far above the queue); an alert ignores the shares and
  has a reserve as large as the queue.
- Background work (pre-rendering, quality upgrades, learned phrases) runs on one thread at a
  lower OS priority, one task at a time (a sentence, or a bounded batch of short ones: see
  idle.py), only when no live job is queued or running, the last live request is
  `idle_delay_s` old and other processes use at most `idle_max_load` cores.
- Live quality jobs and background tasks share the synthesis slots. A live job that arrives
  during a background task waits for that one task at most: the background thread gives its
  slot up to any waiting live job before starting the next one. Engines that generate step by
  step (ChatTTS on ONNX or torch) stop a background task within one step instead
  (`interruptible`): the task leaves its sentences queued for the next idle moment.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

import psutil

from tts_bridge.engines.base import SynthesisInterruptedError, interruptible

_LOGGER = logging.getLogger(__name__)

Priority = Literal["alert", "high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = get_args(Priority)
"""From the most urgent down."""


def as_priority(value: object) -> Priority | None:
    """`value` when it names a priority, else None (each door answers invalid_priority in its
    own error shape)."""
    return next((priority for priority in PRIORITIES if value == priority), None)


Lane = Literal["quality", "fast"]
LANES: tuple[Lane, ...] = get_args(Lane)
AGING_S = 10.0
"""A queued job moves up one rank per this many seconds of waiting."""
CACHED_CEILING = 4
"""Cache hits are admitted while fewer than this many times max_queue jobs are queued."""
_RANK = {"alert": 0, "cached": 1, "high": 2, "normal": 3, "low": 4}


@dataclass(frozen=True)
class Admission:
    """The scheduler's answer to a live job: accepted, or the limit that refused it."""

    accepted: bool
    limit: str | None = None
    """The setting whose bound was reached (limits.max_queue, limits.door_share,
    limits.peer_share), or "stopping"; None when accepted."""
    message: str = ""
    """For people: what was full, and that a retry later may work."""

    def __bool__(self) -> bool:
        return self.accepted


ACCEPTED = Admission(True)


class Admittable(Protocol):
    """What the scheduler reads of a job to admit and order it (a pipeline's SpeechJob is
    one): its cost, priority, origin and whether the cache answers it."""

    @property
    def estimate_s(self) -> float: ...

    @property
    def priority(self) -> Priority: ...

    @property
    def door(self) -> str:
        """The front end it came through: its share of the queue."""
        ...

    @property
    def peer(self) -> str | None:
        """The client's address, where the door knows it: its share of the queue."""
        ...

    @property
    def cached(self) -> bool:
        """The cache answers it: milliseconds of work, in the fast lane."""
        ...


@dataclass(frozen=True)
class Ticket:
    """An `Admittable` of its own, for work that is not a speech job."""

    estimate_s: float = 0.0
    priority: Priority = "normal"
    door: str = "other"
    peer: str | None = None
    cached: bool = False


PLAIN = Ticket()
"""A normal-priority job of no estimated cost from no door in particular."""


@dataclass(eq=False)
class LiveJob:
    run: Callable[[], None]
    estimate_s: float = 0.0
    urgent: bool = False
    priority: Priority = "normal"
    door: str = "other"
    peer: str | None = None
    cached: bool = False
    forced: bool = False
    seq: int = 0
    queued_at: float = 0.0
    started: float | None = field(default=None, compare=False)

    @property
    def lane(self) -> Lane:
        return "fast" if self.urgent or self.cached else "quality"

    @property
    def kind(self) -> str:
        """What ranks it: its priority, or "cached" (a cache hit that is not an alert)."""
        return "cached" if self.cached and self.priority != "alert" else self.priority

    def order(self, now: float) -> tuple[int, float, int]:
        rank = _RANK[self.kind]
        if rank > _RANK["cached"]:
            aged = int((now - self.queued_at) // AGING_S)
            rank = max(_RANK["cached"], rank - aged)
        return rank, self.estimate_s, self.seq


class BackgroundSource(Protocol):
    """Where idle work comes from (see idle.IdleWork)."""

    def next_task(self) -> Callable[[], None] | None:
        """The next background sentence to render, or None when there is nothing to do."""
        ...


class OthersCpu:
    """CPU used by other processes, in cores, over the time since the last call.

    Not the load average: it counts this process's own synthesis and decays over minutes, so
    idle work would either stall behind itself or run while Home Assistant is busy.
    """

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._last = self._sample()
        self._value = 0.0

    def _sample(self) -> tuple[float, float, float]:
        system = psutil.cpu_times()
        busy = sum(system) - system.idle - getattr(system, "iowait", 0.0)
        own = self._process.cpu_times()
        return time.monotonic(), busy, own.user + own.system

    def busy_cores(self, min_interval_s: float = 0.5) -> float:
        now = time.monotonic()
        if now - self._last[0] < min_interval_s:
            return self._value
        sample = self._sample()
        elapsed = sample[0] - self._last[0]
        others = (sample[1] - self._last[1]) - (sample[2] - self._last[2])
        self._value = max(0.0, others / elapsed) if elapsed > 0 else 0.0
        self._last = sample
        return self._value


class Scheduler:
    def __init__(
        self,
        concurrency: int,
        max_queue: int,
        *,
        background: BackgroundSource | None = None,
        idle_delay_s: float = 5.0,
        idle_max_load: float | None = None,
        idle_nice: int = 10,
        door_share: float = 1.0,
        peer_share: float = 1.0,
    ) -> None:
        # The bound is enforced in submit_live, not by the lanes: resumed journal entries
        # (already acknowledged to the broker) can always be queued (`force`).
        self._lanes: dict[Lane, list[LiveJob]] = {lane: [] for lane in LANES}
        self._max_queue = max_queue
        self._door_cap = max(1, math.ceil(door_share * max_queue))
        self._peer_cap = max(1, math.ceil(peer_share * max_queue))
        self._slots = threading.Semaphore(concurrency)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._seq = 0
        self._running: list[LiveJob] = []
        self._queued_estimate = 0.0
        self._live_waiting = 0
        self._last_live = 0.0
        self._refusals: Counter[str] = Counter()
        self._background = background
        self._idle_delay_s = idle_delay_s
        cores = len(os.sched_getaffinity(0))
        self._idle_max_load = idle_max_load if idle_max_load is not None else cores / 2
        self._others = OthersCpu()
        self._idle_nice = idle_nice
        self._accepting = True
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.background_running = False
        self._workers = [
            threading.Thread(target=self._live_loop, name=f"synth-{i}", daemon=True)
            for i in range(concurrency)
        ]
        self._fast_worker = threading.Thread(target=self._fast_loop, name="synth-fast", daemon=True)
        self._idle_thread = threading.Thread(target=self._idle_loop, name="idle", daemon=True)

    def start(self) -> None:
        for worker in (*self._workers, self._fast_worker):
            worker.start()
        if self._background is not None:
            self._idle_thread.start()

    # state for routing and health

    @property
    def depth(self) -> int:
        """Live jobs queued (both lanes), not yet running. No lock: a list's length is read
        atomically, and callers hold the lock already."""
        return sum(len(jobs) for jobs in self._lanes.values())

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._running)

    def backlog_s(self) -> float:
        """Estimated seconds until the live work already accepted in the slots is done (what a
        new quality job would wait for; fast-lane jobs run beside it)."""
        now = time.monotonic()
        with self._lock:
            running = sum(
                max(0.0, job.estimate_s - (now - (job.started or now)))
                for job in self._running
                if job.lane == "quality"
            )
            return self._queued_estimate + running

    def lanes(self) -> dict[str, dict[str, int]]:
        """Queued jobs per lane and rank (alert, cached, high, normal, low), for health."""
        with self._lock:
            return {
                lane: {kind: sum(1 for j in jobs if j.kind == kind) for kind in _RANK}
                for lane, jobs in self._lanes.items()
            }

    def doors(self) -> dict[str, int]:
        """Queued jobs per door, for health."""
        with self._lock:
            return dict(Counter(j.door for jobs in self._lanes.values() for j in jobs))

    def refusals(self) -> dict[str, int]:
        """Jobs refused "busy" so far, per limit."""
        with self._lock:
            return dict(self._refusals)

    def wake_background(self) -> None:
        """Background work was added: look for it now rather than at the next poll."""
        self._wake.set()

    # live work

    def submit_live(
        self,
        run: Callable[[], None],
        work: Admittable = PLAIN,
        *,
        force: bool = False,
        urgent: bool = False,
    ) -> Admission:
        """Queue `run` for the job `work` describes, or say which limit refuses it (never
        blocks).

        `urgent` (fast-tier) and cached jobs run in the fast lane, without a synthesis slot.
        `force` (a resumed request, already acknowledged) skips every limit but stopping.
        """
        if not self._accepting:
            return Admission(False, "stopping", "the bridge is stopping; retry later")
        now = time.monotonic()
        estimate_s = work.estimate_s
        with self._cond:
            if not force:
                refusal = self._refusal(work)
                if refusal is not None:
                    assert refusal.limit is not None
                    self._refusals[refusal.limit] += 1
                    return refusal
            self._seq += 1
            job = LiveJob(
                run,
                estimate_s,
                urgent=urgent,
                priority=work.priority,
                door=work.door,
                peer=work.peer,
                cached=work.cached,
                forced=force,
                seq=self._seq,
                queued_at=now,
            )
            self._lanes[job.lane].append(job)
            if job.lane == "quality":
                self._queued_estimate += estimate_s
            self._last_live = now
            self._cond.notify_all()
        return ACCEPTED

    def _refusal(self, work: Admittable) -> Admission | None:
        """Which limit a new job would break (called with the lock held)."""
        depth = self.depth
        if work.cached:
            # Milliseconds of work: refusing it saves nothing. The ceiling only bounds memory
            # under a flood of them.
            if depth < CACHED_CEILING * self._max_queue:
                return None
            return Admission(
                False,
                "limits.max_queue",
                f"the bridge is busy: {depth} requests are queued, cache hits included "
                f"({CACHED_CEILING} x limits.max_queue); retry later",
            )
        if work.priority == "alert":
            if depth < 2 * self._max_queue:
                return None
            return Admission(
                False,
                "limits.max_queue",
                f"the bridge is busy: {depth} requests are queued, alerts included "
                "(limits.max_queue, and as many again for alerts); retry later",
            )
        if depth >= self._max_queue:
            return Admission(
                False,
                "limits.max_queue",
                f"the bridge is busy: {depth} requests are queued "
                f"(limits.max_queue: {self._max_queue}); retry later",
            )
        return self._share_refusal(work.door, work.peer)

    def _share_refusal(self, door: str, peer: str | None) -> Admission | None:
        # The client's own share first: the more precise answer when both are full.
        counted = [j for jobs in self._lanes.values() for j in jobs if _shares_count(j)]
        from_peer = sum(1 for j in counted if j.peer == peer) if peer is not None else 0
        if from_peer >= self._peer_cap:
            return Admission(
                False,
                "limits.peer_share",
                f"the bridge is busy: {from_peer} requests from {peer} are queued, one "
                f"client's share of the queue (limits.peer_share: {self._peer_cap} of "
                f"{self._max_queue}); retry later",
            )
        from_door = sum(1 for j in counted if j.door == door)
        if from_door >= self._door_cap:
            return Admission(
                False,
                "limits.door_share",
                f"the bridge is busy: {from_door} {door} requests are queued, this door's "
                f"share of the queue (limits.door_share: {self._door_cap} of "
                f"{self._max_queue}); retry later",
            )
        return None

    def stop(self, timeout_s: float) -> bool:
        """Stop taking work, let queued live jobs finish; True if all finished in time."""
        self._accepting = False
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._cond.notify_all()  # workers finish what is queued, then end
        workers = (*self._workers, self._fast_worker)
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))
        if self._idle_thread.is_alive():
            self._idle_thread.join(max(0.1, deadline - time.monotonic()))
        return not any(w.is_alive() for w in workers)

    def _wait_for(self, lane: Lane) -> bool:
        """Wait (lock held) until the lane has a job; False when stopping with none left."""
        while not self._lanes[lane]:
            if self._stop.is_set():
                return False
            self._cond.wait()
        return True

    def _pop(self, lane: Lane) -> LiveJob | None:
        """The lane's next job (lock held): see the module's docstring for the order."""
        jobs = self._lanes[lane]
        if not jobs:
            return None
        now = time.monotonic()
        job = min(jobs, key=lambda j: j.order(now))
        jobs.remove(job)
        if lane == "quality":
            self._queued_estimate = max(0.0, self._queued_estimate - job.estimate_s)
        return job

    def _live_loop(self) -> None:
        while True:
            with self._cond:
                if not self._wait_for("quality"):
                    return
                self._live_waiting += 1
            # The job is chosen once the slot is ours, so an alert that arrives while a
            # background task holds the slot still goes first.
            self._slots.acquire()
            with self._cond:
                self._live_waiting -= 1
                job = self._pop("quality")
            try:
                if job is not None:  # another worker may have taken it
                    self._run_live(job)
            finally:
                self._slots.release()

    def _fast_loop(self) -> None:
        while True:
            with self._cond:
                if not self._wait_for("fast"):
                    return
                job = self._pop("fast")
            if job is not None:
                self._run_live(job)

    def _run_live(self, job: LiveJob) -> None:
        with self._lock:
            job.started = time.monotonic()
            self._running.append(job)
        try:
            job.run()
        except Exception:  # a job reports its own errors; this only keeps the worker alive
            _LOGGER.exception("Unhandled error in a synthesis job")
        finally:
            with self._lock:
                self._running.remove(job)
                self._last_live = time.monotonic()

    # background work

    def _idle_now(self) -> bool:
        with self._lock:
            if self._running or self._live_waiting or self.depth:
                return False
            if time.monotonic() - self._last_live < self._idle_delay_s:
                return False
        try:
            return self._others.busy_cores() <= self._idle_max_load
        except OSError as exc:  # /proc unreadable (out of descriptors): not idle, try later
            _LOGGER.debug("Cannot read the CPU load: %s", exc)
            return False

    def _live_pending(self) -> bool:
        # Polled between generation steps: no lock (a stale answer costs one step at most).
        # Fast-lane jobs need no slot: a niced background task only shares the CPUs with them.
        return self._live_waiting > 0 or bool(self._lanes["quality"])

    def _lower_priority(self) -> None:
        # Linux niceness is per thread: only this thread (and threads it starts) is lowered.
        try:
            tid = threading.get_native_id()
            os.setpriority(
                os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + self._idle_nice
            )
        except (OSError, AttributeError) as exc:
            _LOGGER.debug("Could not lower the idle thread's priority: %s", exc)

    def _idle_loop(self) -> None:
        assert self._background is not None
        self._lower_priority()
        while not self._stop.is_set():
            if not self._idle_now():
                self._wake.wait(0.2)
                self._wake.clear()
                continue
            task = self._background.next_task()
            if task is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            self._run_background(task)

    def _run_background(self, task: Callable[[], None]) -> None:
        while not self._stop.is_set():
            self._slots.acquire()
            with self._lock:
                live_first = self._live_pending()
            if not live_first:
                break
            self._slots.release()  # a live job is waiting: it goes first
            time.sleep(0.01)
        else:
            return
        self.background_running = True
        try:
            # An engine that generates step by step stops within a step when a live job
            # arrives (the task then leaves its work queued for the next idle moment).
            with interruptible(self._live_pending):
                task()
        except SynthesisInterruptedError:
            _LOGGER.debug("Background task gave way to live work")
        except Exception:
            _LOGGER.exception("Background task failed")
        finally:
            self.background_running = False
            self._slots.release()


def _shares_count(job: LiveJob) -> bool:
    """Whether a queued job counts against its door's and peer's shares: alerts, cache hits
    and resumed requests do not (they are never refused for a share)."""
    return not (job.forced or job.cached or job.priority == "alert")
