"""A release is one tag: the version written once and equal wherever it shows, the repository's
address written once, the add-on repository the release publishes, and workflows actionlint
accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.support.harness import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION: str = PYPROJECT["project"]["version"]
SOURCE: str = PYPROJECT["project"]["urls"]["Source"]
ADDON = REPO_ROOT / "addon" / "tts_bridge"
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
HEADING = re.compile(r"^## \[?(\d+\.\d+\.\d+)\]?", re.MULTILINE)


def changelog_versions(path: Path) -> list[str]:
    return HEADING.findall(path.read_text(encoding="utf-8"))


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [REPO_ROOT / name for name in listed.split("\0") if name]


def run_script(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


# -- one version ---------------------------------------------------------------------------


def test_the_version_is_written_in_pyproject_only_and_shown_everywhere() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    assert "version" not in PYPROJECT["project"].get("dynamic", [])
    config = yaml.safe_load((ADDON / "config.yaml").read_text(encoding="utf-8"))
    assert str(config["version"]) == VERSION
    assert changelog_versions(REPO_ROOT / "CHANGELOG.md")[0] == VERSION
    assert changelog_versions(ADDON / "CHANGELOG.md")[0] == VERSION
    # The images' version label: the default a local build gets (the release passes its own).
    defaults = {}
    for dockerfile in (ADDON / "Dockerfile", REPO_ROOT / "docker" / "Dockerfile"):
        text = dockerfile.read_text(encoding="utf-8")
        found = re.findall(r"^ARG BUILD_VERSION=(\S+)$", text, re.MULTILINE)
        if found:
            defaults[dockerfile] = found
    assert ADDON / "Dockerfile" in defaults, "the add-on image has a BUILD_VERSION default"
    for dockerfile, found in defaults.items():
        assert set(found) == {VERSION}, f"{dockerfile}: ARG BUILD_VERSION={found}"


def test_both_changelogs_list_the_same_releases_newest_first() -> None:
    root = changelog_versions(REPO_ROOT / "CHANGELOG.md")
    addon = changelog_versions(ADDON / "CHANGELOG.md")
    assert root == addon
    assert "0.1.0" in root
    keyed = [tuple(int(part) for part in v.split(".")) for v in root]
    assert keyed == sorted(keyed, reverse=True) and len(set(keyed)) == len(keyed)
    assert "Unreleased" not in (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_release_info_checks_the_tag_and_writes_the_section(tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    done = run_script("script/release-info", "--tag", f"v{VERSION}", "--notes", str(notes))
    assert done.returncode == 0, done.stderr
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert lines["version"] == VERSION and lines["repository"] == SOURCE
    owner, name = SOURCE.removeprefix("https://github.com/").split("/")
    assert lines["docker_image"] == f"ghcr.io/{owner}/{name}".lower()
    text = notes.read_text(encoding="utf-8")
    assert text.startswith("###") and "## [" not in text, "only the version's own section"
    assert "tts-bridge service install" in text
    wrong = run_script("script/release-info", "--tag", "v0.0.1")
    assert wrong.returncode == 1 and f"is not v{VERSION}" in wrong.stderr


# -- one address ---------------------------------------------------------------------------


def test_the_repository_address_is_written_once() -> None:
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", SOURCE)
    here = Path(__file__).resolve()
    for path in tracked_files():
        if path.resolve() == here or not path.is_file() or path.suffix in (".png", ".bin"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        assert not re.search(r"\bOWNER\b", text), f"{path}: an OWNER placeholder"
        if path.name != "pyproject.toml":
            assert SOURCE not in text, f"{path} writes the repository's address again"
    image = yaml.safe_load((ADDON / "config.yaml").read_text(encoding="utf-8")).get("image")
    if image:  # the add-on's prebuilt image lives in the repository owner's registry space
        owner = SOURCE.split("/")[3].lower()
        assert image.startswith(f"ghcr.io/{owner}/") and "{arch}" in image, image


def test_the_add_on_repository_holds_only_what_the_store_reads(tmp_path: Path) -> None:
    out = tmp_path / "addon-repo"
    done = run_script("script/addon-repo", str(out))
    assert done.returncode == 0, done.stderr
    top = sorted(p.name for p in out.iterdir())
    assert top == ["README.md", "repository.yaml", "tts_bridge"]
    assert not (REPO_ROOT / "repository.yaml").exists(), "the main branch is no store repository"
    repository = yaml.safe_load((out / "repository.yaml").read_text(encoding="utf-8"))
    assert repository["name"] and repository["url"] == f"{SOURCE}/tree/addon-repo"
    config = yaml.safe_load((out / "tts_bridge" / "config.yaml").read_text(encoding="utf-8"))
    source = yaml.safe_load((ADDON / "config.yaml").read_text(encoding="utf-8"))
    assert config["url"] == f"{SOURCE}/tree/v{VERSION}/addon/tts_bridge"
    assert {k: v for k, v in config.items() if k != "url"} == source
    assert f"{SOURCE}#addon-repo" in (out / "README.md").read_text(encoding="utf-8")
    assert not list(out.rglob("*.whl")) and not list(out.rglob("__pycache__"))
    # The add-on folder's files, all of them and nothing else (but the address).
    published = sorted(str(p.relative_to(out / "tts_bridge")) for p in out.glob("tts_bridge/**/*"))
    tracked = sorted(
        str(p.relative_to(ADDON))
        for p in [*tracked_files(), *(d for d in ADDON.rglob("*") if d.is_dir())]
        if p.is_relative_to(ADDON) and not p.name.endswith(".whl")
    )
    assert published == tracked
    assert run_script("script/addon-repo", str(out)).returncode == 2, "only into an empty folder"


def test_the_docs_read_the_address_from_pyproject() -> None:
    """mkdocs.yml names no address: its hook sets repo_url and fills {repository} in the pages
    from pyproject.toml (tests/test_docs_site.py checks the built pages)."""
    mkdocs = (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "repo_url" not in mkdocs and "docs/hooks/repository.py" in mkdocs
    pages = "".join(p.read_text("utf-8") for p in (REPO_ROOT / "docs").rglob("*.md"))
    assert "{repository}#addon-repo" in pages


# -- workflows -----------------------------------------------------------------------------


def _tool(name: str) -> str:
    found = Path(sys.executable).parent / name
    if found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (the dev extra installs it)")
    return path


def test_workflows_pass_actionlint() -> None:
    done = subprocess.run(
        [_tool("actionlint"), "-shellcheck", _tool("shellcheck"), "-no-color"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_fails_on_a_broken_workflow(tmp_path: Path) -> None:
    """The lint can fail: an unknown job in `needs` and a bad expression are found."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    bad = (WORKFLOWS / "ci.yml").read_text(encoding="utf-8")
    bad = bad.replace("runs-on: ubuntu-24.04", "needs: nowhere\n    runs-on: ${{ matrix.os }")
    (tmp_path / ".github" / "workflows" / "ci.yml").write_text(bad, encoding="utf-8")
    done = subprocess.run(
        [_tool("actionlint"), "-no-color"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "nowhere" in done.stdout, done.stdout + done.stderr


def test_ci_runs_the_readme_test_command() -> None:
    ci = yaml.safe_load((WORKFLOWS / "ci.yml").read_text(encoding="utf-8"))
    assert {"push", "pull_request"} <= set(ci[True])  # YAML 1.1 reads `on` as true
    runs = [step.get("run", "") for job in ci["jobs"].values() for step in job["steps"]]
    assert "./script/test" in runs
    assert "./script/test" in (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    python = [
        step["with"]["python-version"]
        for job in ci["jobs"].values()
        for step in job["steps"]
        if "setup-python" in step.get("uses", "")
    ]
    tested = re.search(r"# Python (\d+\.\d+)", (REPO_ROOT / "constraints.txt").read_text("utf-8"))
    assert tested and python == [tested.group(1)], "CI runs the Python the pins were tested on"


def test_the_release_workflow_publishes_everything_from_one_tag() -> None:
    text = (WORKFLOWS / "release.yml").read_text(encoding="utf-8")
    release = yaml.safe_load(text)
    assert release[True] == {"push": {"tags": ["v*"]}}
    jobs = release["jobs"]
    assert "python -m build" in text and "twine check --strict dist/*" in text
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}
    assert any("pypa/gh-action-pypi-publish" in s.get("uses", "") for s in jobs["pypi"]["steps"])
    docker = jobs["docker-image"]["strategy"]["matrix"]["include"]
    platforms = {entry["platform"] for entry in docker}
    assert platforms == {"linux/amd64", "linux/arm64"}
    arches = {entry["arch"] for entry in jobs["addon-image"]["strategy"]["matrix"]["include"]}
    config = yaml.safe_load((ADDON / "config.yaml").read_text(encoding="utf-8"))
    assert arches == set(config["arch"])
    assert "pypi" in jobs["addon-image"]["needs"], "the add-on image installs the PyPI release"
    assert "--notes-file notes.md" in text and "script/release-info --tag" in text
    assert "script/addon-repo" in text and "HEAD:addon-repo" in text
    assert "github-release" in jobs["addon-repo"]["needs"], "the store sees a finished release"
