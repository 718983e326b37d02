"""Packaging: the tested versions are pinned, and the metadata is the one current tools expect."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from tests.support.harness import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CONSTRAINTS = REPO_ROOT / "constraints.txt"


def test_this_venv_matches_the_constraints() -> None:
    """What the tests run on is what constraints.txt installs (CI runs script/setup first)."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "script" / "constraints"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_constraints_pin_every_direct_dependency_exactly() -> None:
    pins = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[requirement.name.lower().replace("_", "-")] = spec.version
    direct = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    for name, group in PYPROJECT["project"]["optional-dependencies"].items():
        if name != "bench":  # installed by hand for the recogniser benchmark only
            direct += [Requirement(r) for r in group]
    for requirement in direct:
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside pyproject.toml's {requirement.specifier}"
        )
    assert "tts-bridge" not in pins, "the project itself is not a constraint"


def test_installs_use_the_constraints() -> None:
    setup = (REPO_ROOT / "script" / "setup").read_text(encoding="utf-8")
    assert re.search(r"pip install .*-c constraints\.txt -e ", setup)
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile").read_text(encoding="utf-8")
    assert dockerfile.count("pip install -c constraints.txt") == 2


def test_pep639_license_metadata_and_a_bounded_build_backend() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "MIT"
    for pattern in project["license-files"]:
        assert list(Path(REPO_ROOT).glob(pattern)), f"license-files {pattern} matches nothing"
    (backend,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    assert backend.name == "setuptools"
    # 77 is the first setuptools that reads PEP 639's license expression and license-files.
    assert not backend.specifier.contains("76.1.0")
    assert backend.specifier.contains("77.0.3")
    upper = [s for s in backend.specifier if s.operator in ("<", "<=")]
    assert upper, "the build requirement has an upper bound"
    assert Version(upper[0].version) > Version("77")
