"""Synthesis scheduling: live requests first, background work only when the bridge is idle.

- Live jobs wait in a bounded queue served by `concurrency` worker threads, in arrival order.
  `submit_live` never blocks, so a flood is answered 'busy' instead of growing memory.
- Fast-tier jobs (`urgent`) have a lane of their own: one worker that needs no synthesis slot.
  They were routed there because the quality tier would miss the latency budget, so they must
  not wait for the quality job running in the slot (a ChatTTS sentence on torch takes seconds;
  hibari takes milliseconds and shares the CPUs with it).
- Background work (pre-rendering, quality upgrades, learned phrases) runs on one thread at a
  lower OS priority, one task at a time (a sentence, or a bounded batch of short ones: see
  idle.py), only when no live job is queued or running, the last live request is
  `idle_delay_s` old and other processes use at most `idle_max_load` cores.
- Live quality jobs and background tasks share `concurrency` synthesis slots. A live job that
  arrives during a background task waits for that one task at most: the background thread
  gives its slot up to any waiting live job before starting the next one. Engines that
  generate step by step (ChatTTS on ONNX or torch) stop a background task within one step
  instead (`interruptible`): the task leaves its sentences queued and they are rendered again
  at the next idle moment.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import psutil

from tts_bridge.engines.base import SynthesisInterruptedError, interruptible

_LOGGER = logging.getLogger(__name__)


@dataclass
class LiveJob:
    run: Callable[[], None]
    estimate_s: float = 0.0
    urgent: bool = False
    started: float | None = field(default=None, compare=False)


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
    ) -> None:
        # Unbounded underneath: the bound is enforced in submit_live, so that resumed journal
        # entries (already acknowledged to the broker) can always be queued.
        self._live: queue.SimpleQueue[LiveJob | None] = queue.SimpleQueue()
        self._fast: queue.SimpleQueue[LiveJob | None] = queue.SimpleQueue()
        self._max_queue = max_queue
        self._slots = threading.Semaphore(concurrency)
        self._lock = threading.Lock()
        self._running: list[LiveJob] = []
        self._queued_estimate = 0.0
        self._live_waiting = 0
        self._last_live = 0.0
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
        return self._live.qsize() + self._fast.qsize()

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._running)

    def backlog_s(self) -> float:
        """Estimated seconds until the live work already accepted in the slots is done (what a
        new quality job would wait for; fast-tier jobs run in their own lane)."""
        now = time.monotonic()
        with self._lock:
            running = sum(
                max(0.0, job.estimate_s - (now - (job.started or now)))
                for job in self._running
                if not job.urgent
            )
            return self._queued_estimate + running

    def wake_background(self) -> None:
        """Background work was added: look for it now rather than at the next poll."""
        self._wake.set()

    # live work

    def submit_live(
        self,
        run: Callable[[], None],
        estimate_s: float = 0.0,
        *,
        force: bool = False,
        urgent: bool = False,
    ) -> bool:
        """Queue a live job; False when the queue is full (unless `force`) or stopping.

        `urgent` (fast-tier) jobs run in their own lane, in order, without a synthesis slot.
        """
        if not self._accepting:
            return False
        with self._lock:
            if not force and self.depth >= self._max_queue:
                return False
            self._last_live = time.monotonic()
            if urgent:
                self._fast.put_nowait(LiveJob(run, estimate_s, urgent=True))
            else:
                self._queued_estimate += estimate_s
                self._live.put_nowait(LiveJob(run, estimate_s))
        return True

    def stop(self, timeout_s: float) -> bool:
        """Stop taking work, let queued live jobs finish; True if all finished in time."""
        self._accepting = False
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        for _ in self._workers:  # one stop marker per worker, after the queued jobs
            self._live.put_nowait(None)
        self._fast.put_nowait(None)
        workers = (*self._workers, self._fast_worker)
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))
        if self._idle_thread.is_alive():
            self._idle_thread.join(max(0.1, deadline - time.monotonic()))
        return not any(w.is_alive() for w in workers)

    def _live_loop(self) -> None:
        while (job := self._live.get()) is not None:
            with self._lock:
                self._queued_estimate = max(0.0, self._queued_estimate - job.estimate_s)
                self._live_waiting += 1
            self._slots.acquire()
            with self._lock:
                self._live_waiting -= 1
            try:
                self._run_live(job)
            finally:
                self._slots.release()

    def _fast_loop(self) -> None:
        while (job := self._fast.get()) is not None:
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
        return self._others.busy_cores() <= self._idle_max_load

    def _live_pending(self) -> bool:
        # Polled between generation steps: no lock (a stale answer costs one step at most).
        # Fast-lane jobs need no slot: a niced background task only shares the CPUs with them.
        return self._live_waiting > 0 or not self._live.empty()

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
