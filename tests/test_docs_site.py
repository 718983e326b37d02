"""The manual builds and says what the code does: `mkdocs build --strict` passes (no broken link
or anchor, no page outside the nav, no missing include), the README stays a short front door
whose links work, and every error code the bridge can answer with is on the error codes page."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.harness import REPO_ROOT

PACKAGE = REPO_ROOT / "tts_bridge"
ERRORS_PAGE = REPO_ROOT / "docs" / "reference" / "errors.md"
_LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
_CODE_RE = re.compile(r"[a-z]+(?:_[a-z0-9]+)*")


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (script/setup --dev)")
    pytest.importorskip("material", reason="the docs extra is not installed (script/setup --dev)")
    site = tmp_path / "site"
    config = REPO_ROOT / "mkdocs.yml"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=tmp_path,  # includes are found from the config's folder, wherever mkdocs runs
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The includes were expanded, not shown as text: the example configuration, the README's
    # examples and the changelog are on their pages.
    config_page = (site / "reference" / "configuration" / "index.html").read_text("utf-8")
    assert "idle_unload_s" in config_page and "--8&lt;--" not in config_page
    assert "mosquitto_rr" in (site / "usage" / "try-it" / "index.html").read_text("utf-8")
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert f"[{version['version']}]" in (site / "changelog" / "index.html").read_text("utf-8")
    # The repository's address comes from pyproject.toml (docs/hooks/repository.py).
    source = version["urls"]["Source"]
    assert f'href="{source}"' in (site / "index.html").read_text("utf-8")
    addon_page = (site / "install" / "addon" / "index.html").read_text("utf-8")
    assert f"{source}#addon-repo" in addon_page and "{repository}" not in addon_page
    pages = {p.relative_to(REPO_ROOT / "docs") for p in (REPO_ROOT / "docs").rglob("*.md")}
    for page in pages:
        built = site / page.with_suffix("") / "index.html"
        if page.name == "index.md":
            built = site / page.parent / "index.html"
        assert built.is_file(), f"{page} was not built"


def test_the_readme_is_a_short_front_door() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    # CI runs the test command (.ci/run); the two commands are the first thing a reader sees.
    first_block = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block[1].splitlines()]
    assert commands == ["./script/run", "./script/test"]
    assert readme.index(first_block[0]) < readme.index("\n## ")


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_links_outside_the_site_resolve(name: str) -> None:
    """mkdocs checks the pages' links; these files live outside docs/, so their relative links
    are checked here."""
    text = (REPO_ROOT / name).read_text(encoding="utf-8")
    targets = [t for t in _LINK_RE.findall(text) if not re.match(r"[a-z]+:", t)]
    assert targets or name != "README.md", "the README links to the manual's pages"
    for target in targets:
        path = target.split("#")[0]
        assert (REPO_ROOT / path).exists(), f"{name} links to {target}, which does not exist"


def _error_codes() -> dict[str, str]:
    """Every machine code the package answers with -> where it is raised: the first argument
    of an ...Error(...) or _refuse(...) call, an api_response's code, a ..._CODE constant."""
    found: dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        if "bench" in path.parts or "cli" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = str(path.relative_to(REPO_ROOT))
        for node in ast.walk(tree):
            candidates: list[ast.expr] = []
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name.endswith("Error") and node.args:
                    candidates.append(node.args[0])
                elif name == "_refuse" and len(node.args) >= 2:
                    candidates.append(node.args[1])
                elif name == "api_response" and len(node.args) >= 5:
                    candidates.append(node.args[4])
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.endswith("_CODE") for t in node.targets
            ):
                candidates.append(node.value)
            for arg in candidates:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and _CODE_RE.fullmatch(arg.value)
                ):
                    found.setdefault(arg.value, f"{where}:{arg.lineno}")
    return found


def test_every_error_code_is_documented() -> None:
    codes = _error_codes()
    # The scan must see the codes raised in each door and in the core, or it proves nothing.
    assert {"invalid_json", "unknown_request", "malformed_event", "poison_request"} <= set(codes)
    assert {"synthesis_failed", "url_unavailable", "busy", "not_authorized"} <= set(codes)
    documented = set(re.findall(r"`([a-z_0-9]+)`", ERRORS_PAGE.read_text(encoding="utf-8")))
    missing = {code: where for code, where in codes.items() if code not in documented}
    assert not missing, f"error codes missing from {ERRORS_PAGE.name}: {missing}"


def test_shell_examples_are_pasteable() -> None:
    """A line in a shell example runs as pasted: optional parts are separate lines, not
    `[--voice heart]` (which the shell passes on as a literal argument)."""
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    for page in pages:
        blocks = re.findall(r"```(?:sh|bash)\n(.*?)```", page.read_text("utf-8"), re.S)
        for line in (line for block in blocks for line in block.splitlines()):
            code = line.split(" #")[0]
            assert not re.search(r"\[--?[A-Za-z]", code), f"{page.name}: {line}"
