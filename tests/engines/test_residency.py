"""Which engines stay in memory: the budget, least recently used ones unloaded for room, and
the loads and unloads told to whoever the pool was built with (the metrics)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from tts_bridge.config import Settings
from tts_bridge.engines.base import Engine
from tts_bridge.engines.registry import EnginePool
from tts_bridge.engines.residency import MemoryBudgetError, Residency


class Model:
    """Stands in for an engine: only what residency reads of one."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.name = "stand-in"  # no catalog kind: 100 MB of runtime on top of its files
        self.loaded = False

    def load(self) -> None:
        self.loaded = True

    def unload(self) -> None:
        self.loaded = False


def _models(residency: Residency, *names: str) -> list[Model]:
    models = [Model(name) for name in names]
    for model in models:
        residency.files_mb[model.identity] = 25.0  # x4 + 100 = 200 MB each
    return models


def _engines(models: list[Model]) -> list[Engine]:
    return [cast("Engine", model) for model in models]


def _load(residency: Residency, model: Model, everything: list[Model]) -> None:
    (engine,) = _engines([model])
    residency.used(engine)
    residency.make_room(engine, _engines([m for m in everything if m.loaded]))
    residency.load(engine)


def test_the_least_recently_used_model_makes_room_and_each_change_is_told() -> None:
    told: list[str] = []
    residency = Residency(
        450,
        on_load=lambda engine, seconds: told.append(f"load {engine.identity}"),
        on_unload=lambda engine: told.append(f"unload {engine.identity}"),
    )
    a, b, c = everything = _models(residency, "a", "b", "c")
    _load(residency, a, everything)
    _load(residency, b, everything)
    residency.used(cast("Engine", a))  # a used again: b is now the older
    _load(residency, c, everything)
    assert (a.loaded, b.loaded, c.loaded) == (True, False, True)
    assert told == ["load a", "load b", "unload b", "load c"]
    assert set(residency.load_seconds) == {"a", "b", "c"}


def test_a_model_larger_than_the_whole_budget_is_refused_and_nothing_unloaded() -> None:
    residency = Residency(150)
    (a,) = everything = _models(residency, "a")
    with pytest.raises(MemoryBudgetError, match=r"models\.memory_budget_mb"):
        _load(residency, a, everything)
    assert not a.loaded


def test_only_models_unused_for_the_idle_time_are_unloaded() -> None:
    residency = Residency(None)
    a, b = everything = _models(residency, "a", "b")
    _load(residency, a, everything)
    _load(residency, b, everything)
    assert residency.unload_idle(_engines([a, b]), 60.0, now=0.0) == []
    dropped = residency.unload_idle(_engines([a, b]), 0.0, now=1e12)
    assert dropped == ["a", "b"] and not a.loaded and not b.loaded


def test_the_pool_tells_the_loads_and_unloads_it_was_built_with(tmp_path: Path) -> None:
    loads: list[tuple[str, float]] = []
    unloads: list[str] = []
    settings = Settings.model_validate(
        {"models": {"dir": str(tmp_path)}, "synthesis": {"onnx_threads": 1}}
    )
    pool = EnginePool(
        settings,
        on_load=lambda engine, seconds: loads.append((engine.identity, seconds)),
        on_unload=lambda engine: unloads.append(engine.identity),
    )
    engine = pool.voice(None).engine
    pool.ensure_loaded(engine)
    assert [identity for identity, _ in loads] == [engine.identity]
    assert loads[0][1] == pool.load_seconds[engine.identity] > 0
    pool.unload_all()
    assert unloads == [engine.identity]


def test_a_model_is_listed_until_its_unload_has_freed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine drops its model before freeing it: a health report read in between must not
    give the process size as that of a process without the model."""
    settings = Settings.model_validate(
        {"models": {"dir": str(tmp_path)}, "synthesis": {"onnx_threads": 1}}
    )
    pool = EnginePool(settings)
    engine = pool.voice(None).engine
    pool.ensure_loaded(engine)
    listed: list[tuple[bool, list[str], list[str]]] = []
    unload = engine.unload

    def unload_and_look() -> None:
        unload()  # the model dropped; the collection and the heap trim come after
        listed.append((engine.loaded, pool.loaded(), list(pool.resident_mb())))

    monkeypatch.setattr(engine, "unload", unload_and_look)
    assert pool.unload_idle(0.0, now=1e12) == [engine.identity]
    assert listed == [(False, [engine.identity], [engine.identity])]
    assert pool.loaded() == [] and pool.resident_mb() == {}
