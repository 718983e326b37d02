"""The package's import graph has no cycles, and nothing outside the command line imports it.

Read from the source with ``ast``: every import a module can run — at module level, inside
``if``/``try``/``with`` blocks and inside functions (an import on call is a dependency all the
same) — but not under ``if TYPE_CHECKING``, which only the type checker runs. A cycle means two
rooms of the package depend on each other; `cli/` is the top floor, and a module that imports it
drives a command-line handler instead of the function behind it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tts_bridge

PACKAGE = Path(tts_bridge.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_at_import(
    body: list[ast.stmt], type_only: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import in `body`, however deeply nested, except under `if TYPE_CHECKING` (unless
    ``type_only``: then those too, the imports the type checker follows)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and not type_only:
            yield from _run_at_import(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, None) or []:
                    inner = (
                        child.body
                        if isinstance(child, ast.ExceptHandler | ast.match_case)
                        else [child]
                    )
                    yield from _run_at_import(inner, type_only)


def _imports(name: str, path: Path, modules: dict[str, Path], type_only: bool = False) -> set[str]:
    """The package's modules that importing ``name`` imports directly (with ``type_only``,
    also those it imports for the type checker only)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _run_at_import(ast.parse(path.read_text(encoding="utf-8")).body, type_only):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            targets.add(submodule if submodule in modules else base)
    return {t for t in targets if t in modules and t != name}


def _graph(type_only: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules, type_only) for name, path in modules.items()}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    found: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()] - found:
            found.add(target)
            todo.append(target)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_package_imports_without_cycles() -> None:
    graph = _graph()
    # The walk sees the package: the modules and the edges this test exists for.
    assert {
        "tts_bridge.config",
        "tts_bridge.engines.catalog",
        "tts_bridge.engines.registry",
    } <= set(graph)
    assert "tts_bridge.config" in graph["tts_bridge.engines.registry"]
    assert "tts_bridge.engines.settings" in graph["tts_bridge.engines.catalog"]
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_settings_and_the_engines_form_no_circle_even_for_the_type_checker() -> None:
    # Once config <-> engines.catalog <-> engines.registry <-> hardware went round, type-only
    # imports included; now the rooms' settings sit below everything that reads them.
    graph = _graph(type_only=True)
    assert "tts_bridge.system.threads" in graph["tts_bridge.engines.catalog"]  # type-only: seen
    assert "tts_bridge.engines.registry" not in graph["tts_bridge.engines.catalog"]
    rooms = {"tts_bridge.config", "tts_bridge.settings_base", "tts_bridge.system.threads"}
    rooms |= {name for name in graph if name.endswith(".settings")}
    rooms |= {"tts_bridge.engines.catalog", "tts_bridge.engines.registry"}
    for name in sorted(rooms):
        assert name not in _reachable(graph, name), f"{name} imports itself round a circle"
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def _engine_modules(names: set[str]) -> list[str]:
    return sorted(
        n
        for n in names
        if n.startswith("tts_bridge.engines.") and n != "tts_bridge.engines.settings"
    )


def test_config_imports_no_engine() -> None:
    # The engines check their voices through rules the catalog installs in the engines room's
    # settings: config composes the rooms' settings and reaches no engine, not even for the
    # type checker. The audio formats are plain values (no codec is imported with them).
    for graph in (_graph(), _graph(type_only=True)):
        reachable = _reachable(graph, "tts_bridge.config")
        assert not _engine_modules(reachable), _engine_modules(reachable)
        settings = {n for n in reachable if n.endswith(".settings")}
        packages = {n.rpartition(".")[0] for n in settings}
        assert reachable - settings - packages <= {
            "tts_bridge",
            "tts_bridge.audio.formats",
            "tts_bridge.settings_base",
        }, sorted(reachable)
        # Each room's settings module is there to be composed.
        assert {
            f"tts_bridge.{room}.settings"
            for room in ("mqtt", "web", "wyoming", "speech", "text", "engines")
        } <= settings
        # The hardware plan is read without the settings; nothing the engines use needs them.
        assert "tts_bridge.config" not in _reachable(graph, "tts_bridge.system.threads")


def test_the_engine_check_finds_an_engine_import(tmp_path: Path) -> None:
    # The checker itself: an engine module reached through a settings module is found.
    graph = {
        "tts_bridge.config": {"tts_bridge.engines.settings"},
        "tts_bridge.engines.settings": {"tts_bridge.engines.base"},
        "tts_bridge.engines.base": set(),
    }
    reachable = _reachable(graph, "tts_bridge.config")
    assert _engine_modules(reachable) == ["tts_bridge.engines.base"]


def test_nothing_outside_the_command_line_imports_it() -> None:
    graph = _graph()
    offenders = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if not name.startswith("tts_bridge.cli") and name != "tts_bridge.__main__"
        for target in targets
        if target == "tts_bridge.cli" or target.startswith("tts_bridge.cli.")
    )
    assert not offenders, offenders


def test_a_cycle_is_found() -> None:
    # The checker itself: a cycle three modules long, and none in a chain.
    cycle = _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert cycle == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_relative_and_submodule_imports_are_edges(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import two\n")
    (pkg / "sub" / "two.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from ..one import thing\n"
        "if TYPE_CHECKING:\n    from pkg.three import X\n"
        "def f():\n    import pkg.three\n"
    )
    (pkg / "sub" / "four.py").write_text("def g():\n    if True:\n        from pkg import one\n")
    (pkg / "one.py").write_text("import pkg.sub.two\nthing = 1\n")
    (pkg / "three.py").write_text("")
    modules = {"pkg": pkg / "__init__.py", "pkg.sub": pkg / "sub" / "__init__.py"}
    modules |= {
        "pkg.sub.four": pkg / "sub" / "four.py",
        "pkg.sub.two": pkg / "sub" / "two.py",
        "pkg.one": pkg / "one.py",
        "pkg.three": pkg / "three.py",
    }
    assert _imports("pkg.sub", modules["pkg.sub"], modules) == {"pkg.sub.two"}
    # A function-level import is an edge; one under TYPE_CHECKING is not.
    assert _imports("pkg.sub.two", modules["pkg.sub.two"], modules) == {"pkg.one", "pkg.three"}
    assert _imports("pkg.sub.four", modules["pkg.sub.four"], modules) == {"pkg.one"}
    assert _imports("pkg.one", modules["pkg.one"], modules) == {"pkg.sub.two"}
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycle(graph) == ["pkg.one", "pkg.sub.two", "pkg.one"]


DOORS = ("mqtt", "wyoming", "web")


def _door_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "tts_bridge" and parts[1] in DOORS else None


def test_no_door_imports_another_door() -> None:
    """The doors meet in the speech core: what two doors share (the answer's audio URL, say)
    lives there or in a neutral module. Type-only imports count too."""
    offenders = []
    for name, path in _modules().items():
        door = _door_of(name)
        if door is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            offenders += [f"{name} -> {t}" for t in targets if _door_of(t) not in (None, door)]
    assert not offenders, offenders
    # The check sees a door's imports at all.
    assert _door_of("tts_bridge.web.server") == "web" and _door_of("tts_bridge.speech") is None
