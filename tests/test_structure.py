"""The package's shape a newcomer can read: small modules, classes of one job, and a package
root that holds only the app, the entry point and what truly belongs everywhere.

Measured with ast on every module, so a module or class that grows past its bound fails here
with its size and place, before it becomes the next one to split."""

from __future__ import annotations

import ast
from pathlib import Path

import tts_bridge

PACKAGE = Path(tts_bridge.__file__).parent
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 400
MAX_ROOT_MODULES = 8
"""Modules directly in tts_bridge/ besides __init__ and __main__."""


def _modules(package: Path) -> list[Path]:
    return sorted(path for path in package.rglob("*.py") if "__pycache__" not in path.parts)


def oversized(package: Path) -> list[str]:
    """Every module over MAX_MODULE_LINES lines and class over MAX_CLASS_LINES, as
    "path: N lines" and "path:Class: N lines"."""
    found = []
    for path in _modules(package):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(package.parent).as_posix()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{where}: {lines} lines")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    found.append(f"{where}:{node.name}: {size} lines")
    return found


def root_modules(package: Path) -> list[str]:
    return sorted(
        path.name
        for path in package.glob("*.py")
        if path.name not in {"__init__.py", "__main__.py"}
    )


def test_no_module_over_700_lines_and_no_class_over_400() -> None:
    assert oversized(PACKAGE) == []


def test_the_package_root_holds_at_most_8_modules() -> None:
    loose = root_modules(PACKAGE)
    assert len(loose) <= MAX_ROOT_MODULES, loose


def test_the_measure_finds_a_long_module_and_a_long_class(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "inner").mkdir(parents=True)
    big_class = "class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES
    (package / "inner" / "classes.py").write_text(big_class)
    (package / "long.py").write_text("y = 2\n" * (MAX_MODULE_LINES + 1))
    (package / "fine.py").write_text(
        "class Small:\n    x = 1\n" + "z = 3\n" * (MAX_MODULE_LINES - 2)
    )
    assert oversized(package) == [
        f"pkg/inner/classes.py:Big: {MAX_CLASS_LINES + 1} lines",
        f"pkg/long.py: {MAX_MODULE_LINES + 1} lines",
    ]
    for name in "abcdefgh":
        (package / f"{name}.py").write_text("")
    (package / "__init__.py").write_text("")
    assert len(root_modules(package)) == 10  # fine, long, a..h: not __init__
