"""Synthesis work queue: bounded, served by worker threads (never the MQTT network thread)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

_LOGGER = logging.getLogger(__name__)

Job = Callable[[], None]


class Scheduler:
    """A bounded FIFO of jobs and a fixed pool of worker threads.

    `submit` never blocks: when the queue is full it returns False and the caller answers 'busy',
    so a flood of requests cannot grow memory without bound.
    """

    def __init__(self, workers: int, max_queue: int) -> None:
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._workers = [
            threading.Thread(target=self._run, name=f"synth-{i}", daemon=True)
            for i in range(workers)
        ]
        self._busy = 0
        self._lock = threading.Lock()
        self._accepting = True

    def start(self) -> None:
        for worker in self._workers:
            worker.start()

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    @property
    def active(self) -> int:
        with self._lock:
            return self._busy

    def submit(self, job: Job) -> bool:
        if not self._accepting:
            return False
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            return False
        return True

    def stop(self, timeout_s: float) -> bool:
        """Stop taking work, let queued jobs finish; True if all finished within the timeout."""
        self._accepting = False
        for _ in self._workers:
            try:  # one stop marker per worker, after the queued jobs
                self._queue.put(None, timeout=timeout_s)
            except queue.Full:
                break
        for worker in self._workers:
            worker.join(timeout_s)
        return not any(w.is_alive() for w in self._workers)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self._busy += 1
            try:
                job()
            except Exception:  # a job must report its own errors; this only keeps the worker
                _LOGGER.exception("Unhandled error in a synthesis job")
            finally:
                with self._lock:
                    self._busy -= 1
