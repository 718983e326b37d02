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


def _run_at_import(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import in `body`, however deeply nested, except under `if TYPE_CHECKING`."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _run_at_import(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, None) or []:
                    inner = (
                        child.body
                        if isinstance(child, ast.ExceptHandler | ast.match_case)
                        else [child]
                    )
                    yield from _run_at_import(inner)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that importing ``name`` imports directly."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _run_at_import(ast.parse(path.read_text(encoding="utf-8")).body):
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


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


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
    assert "tts_bridge.engines.catalog" in graph["tts_bridge.config"]
    assert "tts_bridge.config" in graph["tts_bridge.engines.registry"]
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_config_imports_no_engine() -> None:
    # Validation asks the engine kinds' declarations; an engine imports on call. The audio
    # formats are plain values (no codec is imported with them).
    reachable: set[str] = set()
    todo = ["tts_bridge.config"]
    graph = _graph()
    while todo:
        for target in graph[todo.pop()] - reachable:
            reachable.add(target)
            todo.append(target)
    assert reachable <= {
        "tts_bridge",
        "tts_bridge.engines",
        "tts_bridge.engines.base",
        "tts_bridge.engines.catalog",
        "tts_bridge.formats",
    }, sorted(reachable)


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
