"""Packaging: the tested versions are pinned, and the metadata is the one current tools expect."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import soundfile
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


# -- the package on its own ----------------------------------------------------------------

PACKAGE_DATA = (
    "tts_bridge/py.typed",
    "tts_bridge/manifests/piper-en_US-joe-medium.json",
    "tts_bridge/manifests/hibari-heart.json",
    "tts_bridge/manifests/kokoro-v1.0-int8-part1.json",
    "tts_bridge/voicedata/kokoro/zf_xiaobei.bin",
    "tts_bridge/voicedata/kokoro/vocab.json",
    "tts_bridge/voicedata/kokoro/SHA256SUMS",
)
SPOKEN = {
    "joe": "The front door is open.",
    "heart": "The washing machine has finished.",
    "xiaobei": "前门开着。",
}


def _run(
    argv: list[str], env: dict[str, str] | None = None, timeout: int = 300, cwd: Path | None = None
) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd, check=False
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _wheel_names(folder: Path) -> set[str]:
    (wheel,) = folder.glob("tts_bridge-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


@pytest.mark.slow
def test_the_wheel_installs_alone_and_speaks(tmp_path: Path) -> None:
    """What PyPI gets: the wheel (and the sdist, which builds the same wheel) from the files in
    git, installed with pip into an empty venv, speaks with each bundled voice."""
    version = PYPROJECT["project"]["version"]
    source = tmp_path / "src"  # git's files only: nothing built or ignored in the checkout
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        if (REPO_ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    from_sdist, direct = tmp_path / "dist", tmp_path / "direct"
    _run([sys.executable, "-m", "build", "--outdir", str(from_sdist), str(source)])
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(direct), str(source)])
    assert [p.name for p in sorted(from_sdist.iterdir())] == [
        f"tts_bridge-{version}-py3-none-any.whl",
        f"tts_bridge-{version}.tar.gz",
    ]
    names = _wheel_names(from_sdist)
    assert names == _wheel_names(direct), "the sdist builds the wheel the tree builds"
    for data in PACKAGE_DATA:
        assert data in names, f"{data} is not in the wheel"
    assert not [n for n in names if n.startswith("tests/")]
    with tarfile.open(from_sdist / f"tts_bridge-{version}.tar.gz") as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"constraints.txt", "config.example.yaml", "pyproject.toml", "LICENSE"} <= members
    assert not [m for m in members if m.startswith("tests/")], "no partial copy of the tests"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    home = tmp_path / "home"
    # The machine's pip settings (index, certificates) stay; the package's own copy must speak,
    # so no PYTHONPATH, and a home of its own. pip's cache is the user's real one (the test
    # session's private XDG folders would start it empty): downloads are what takes long.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    env.setdefault("PIP_CACHE_DIR", str(real_home / ".cache" / "pip"))
    env |= {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "HF_HUB_OFFLINE": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    wheel = next(from_sdist.glob("*.whl"))
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile"]
    _run([*pip, "-c", str(CONSTRAINTS), str(wheel)], env=env, timeout=540)
    python = str(venv / "bin" / "python")
    # From a folder of its own: the checkout must not be on the import path ('' is the cwd).
    where = _run(
        [python, "-c", "import tts_bridge; print(tts_bridge.__file__)"], env=env, cwd=tmp_path
    )
    assert Path(where.strip()).is_relative_to(venv)
    assert _run([str(venv / "bin" / "tts-bridge"), "--version"], env=env, cwd=tmp_path).split() == [
        "tts-bridge",
        version,
    ]
    for voice, text in SPOKEN.items():
        out = tmp_path / f"{voice}.wav"
        say = [str(venv / "bin" / "tts-bridge"), "say", text, "--voice", voice, "-o", str(out)]
        _run(say, env=env, cwd=tmp_path)
        audio, rate = soundfile.read(out, dtype="float32")
        seconds = len(audio) / rate
        assert rate in (22050, 24000) and 0.6 < seconds < 6, f"{voice}: {seconds:.2f} s at {rate}"
        rms = float(np.sqrt(np.mean(np.square(audio))))
        assert 0.01 < rms < 0.7, f"{voice}: RMS {rms:.4f} is silence or noise"
        assert np.count_nonzero(np.abs(audio) > 0.01) > 0.2 * len(audio), f"{voice}: mostly silent"
