"""Which engines are resident: loads on a thread of normal priority, within the memory budget.

Before a model loads, its need is estimated (the last measured resident size, else the size of
its files times a factor); least recently used engines are unloaded until it fits the budget,
and a model that cannot fit even alone is refused with a clear error rather than risking the
out-of-memory killer. After loading, the measured RSS growth becomes the engine's resident size.
The engine pool (registry.py) decides which engine a voice uses; this module only when it is in
memory.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

from tts_bridge.engines import catalog
from tts_bridge.engines.base import Engine, EngineError

_LOGGER = logging.getLogger(__name__)

# Resident memory per byte of model file before a measurement exists (onnxruntime and torch
# keep roughly one copy of the weights plus their runtime; measured 3-4x for Piper and hibari).
_FILE_TO_RSS = 4.0


class MemoryBudgetError(EngineError):
    """A model that cannot fit the memory budget even with every other model unloaded."""


def files_mb(path: Path) -> float:
    """The size of a model file or folder, in MiB."""
    if path.is_dir():
        total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    else:
        total = path.stat().st_size
    return total / 2**20


class Residency:
    """Loads, measures and unloads engines within `memory_budget_mb` (None: no budget).

    `on_load` is told each load and its seconds, `on_unload` each unload (the metrics)."""

    def __init__(
        self,
        memory_budget_mb: int | None,
        *,
        on_load: Callable[[Engine, float], None] | None = None,
        on_unload: Callable[[Engine], None] | None = None,
    ) -> None:
        self.memory_budget_mb = memory_budget_mb
        self.on_load = on_load
        self.on_unload = on_unload
        self.files_mb: dict[str, float] = {}
        """Each engine's model size on disk (identity -> MiB): its need before a measurement."""
        self._resident_mb: dict[str, float] = {}
        self.load_seconds: dict[str, float] = {}
        """How long each engine's last load took (identity -> seconds)."""
        self._last_used: dict[str, float] = {}
        self._releasing: set[str] = set()
        """Engines being unloaded whose memory is not handed back yet (see ``unload``)."""
        self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="model-load")
        # Start its thread now, from the constructing (normal-priority) thread: an executor
        # starts threads on first use, from whichever thread submits.
        self._loader.submit(lambda: None).result()

    def on_loader(self, make: Callable[[], Any]) -> Any:
        """``make()`` run on the loader thread (normal priority, see ``load``)."""
        return self._loader.submit(make).result()

    def used(self, engine: Engine) -> None:
        """`engine` is about to be used: the last to be unloaded for room."""
        self._last_used[engine.identity] = time.monotonic()

    def resident_mb(self, loaded: Iterable[Engine]) -> dict[str, float]:
        """Measured resident size of each of the `loaded` engines."""
        return {e.identity: self._resident_mb.get(e.identity, 0.0) for e in loaded}

    def _need_mb(self, engine: Engine) -> float:
        measured = self._resident_mb.get(engine.identity)
        if measured:
            return measured
        spec = catalog.find(engine.name)
        runtime = spec.runtime_mb if spec is not None else 100.0
        return self.files_mb.get(engine.identity, 0.0) * _FILE_TO_RSS + runtime

    def make_room(self, engine: Engine, loaded: Iterable[Engine]) -> None:
        """Unload the least recently used of `loaded` until `engine` fits the budget; raises
        MemoryBudgetError when it cannot fit even alone."""
        budget = self.memory_budget_mb
        if budget is None:
            return
        need = self._need_mb(engine)
        if need > budget:
            raise MemoryBudgetError(
                f"{engine.name} model needs about {need:.0f} MB; the memory budget is "
                f"{budget} MB (models.memory_budget_mb)"
            )
        others = sorted(loaded, key=lambda e: self._last_used.get(e.identity, 0))
        while others and need + sum(self._need_mb(e) for e in others) > budget:
            victim = others.pop(0)
            _LOGGER.info(
                "Unloading %s to make room for %s (budget %d MB)",
                victim.identity,
                engine.identity,
                budget,
            )
            self.unload(victim)

    def load(self, engine: Engine) -> None:
        """Load `engine` on the loader thread and measure it (what it raises passes through)."""
        before = psutil.Process().memory_info().rss
        started = time.perf_counter()
        # On the loader thread (normal priority): runtimes start their worker threads while
        # loading, and threads inherit the niceness of the thread creating them. Loaded from
        # the idle thread (nice +10), every later live request would compute on deprioritized
        # threads.
        self._loader.submit(engine.load).result()
        grown = max(0.0, (psutil.Process().memory_info().rss - before) / 2**20)
        if grown > 1:
            self._resident_mb[engine.identity] = grown
        self.load_seconds[engine.identity] = time.perf_counter() - started
        if self.on_load is not None:
            self.on_load(engine, self.load_seconds[engine.identity])
        _LOGGER.info(
            "Loaded %s in %.2f s (+%.0f MB resident)",
            engine.identity,
            self.load_seconds[engine.identity],
            grown,
        )

    def releasing(self, engine: Engine) -> bool:
        """`engine` is being unloaded and its memory is not back yet: still resident."""
        return engine.identity in self._releasing

    def unload(self, engine: Engine) -> None:
        # An engine drops its model before freeing it (a collection, the heap trimmed), which
        # takes a while: until then it counts as resident, or a report could say a model is
        # unloaded beside a process size that still holds it.
        self._releasing.add(engine.identity)
        try:
            engine.unload()
            gc.collect()
        finally:
            self._releasing.discard(engine.identity)
        if self.on_unload is not None:
            self.on_unload(engine)

    def unload_idle(self, loaded: Iterable[Engine], idle_s: float, now: float) -> list[str]:
        """Unload those of `loaded` unused for `idle_s` seconds; returns their identities."""
        dropped = []
        for engine in loaded:
            if now - self._last_used.get(engine.identity, now) >= idle_s:
                self.unload(engine)
                dropped.append(engine.identity)
        return dropped
