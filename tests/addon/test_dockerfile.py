"""The add-on's Dockerfile as the Supervisor builds it from a clean clone: the add-on folder is the
whole build context, so everything it copies is committed there (the tested pins and the venv
trimmer are copies of the repository's, kept equal here), and the package comes from the index
at BUILD_VERSION. The trimmer itself runs here on a real venv. script/docker-check builds and
runs the image where a Docker daemon answers."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.dockerfile import instructions
from tests.support.harness import REPO_ROOT

ADDON = REPO_ROOT / "addon" / "tts_bridge"
DOCKERFILE = ADDON / "Dockerfile"
SLIM = REPO_ROOT / "docker" / "slim-venv.sh"


def git_tracked(folder: Path) -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--", str(folder.relative_to(REPO_ROOT))],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {str(Path(p).relative_to(folder.relative_to(REPO_ROOT))) for p in listed}


def test_the_addon_folder_keeps_a_copy_of_the_tested_pins() -> None:
    """script/constraints writes both files; the add-on's build cannot reach the root's."""
    copy = (ADDON / "constraints.txt").read_text(encoding="utf-8")
    assert copy == (REPO_ROOT / "constraints.txt").read_text(encoding="utf-8")


def test_the_addon_folder_keeps_a_copy_of_the_venv_trimmer() -> None:
    assert (ADDON / "slim-venv.sh").read_bytes() == SLIM.read_bytes()


def test_everything_the_build_copies_is_committed_in_the_addon_folder() -> None:
    """A clean clone builds: no COPY of a file that a script makes or git ignores."""
    tracked = git_tracked(ADDON)
    sources = []
    for keyword, arguments in instructions(DOCKERFILE):
        if keyword in {"COPY", "ADD"}:
            words = [w for w in shlex.split(arguments) if not w.startswith("--")]
            sources += words[:-1]
    assert sources, "the Dockerfile copies the pins and the trimmer"
    for source in sources:
        assert source in tracked, f"COPY {source}: not committed in addon/tts_bridge"
    assert not (ADDON / "wheels").exists()
    ignored = subprocess.run(
        [
            "git",
            "check-ignore",
            "--no-index",
            *(f"addon/tts_bridge/{p}" for p in ("a.whl", "wheels/b")),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert ignored == [], "nothing in the add-on folder is git-ignored build input"


def test_it_installs_the_released_package_at_the_addon_version() -> None:
    args = [a for k, a in instructions(DOCKERFILE) if k == "ARG"]
    assert 'PIP_EXTRA_INDEX_URL=""' in args, "an extra index is possible and empty by default"
    assert any(re.fullmatch(r"BUILD_VERSION=\d+\.\d+\.\d+", a) for a in args)
    assert "BUILD_FROM=ghcr.io/home-assistant/amd64-base-debian:bookworm" in args
    run = " ".join(a for k, a in instructions(DOCKERFILE) if k == "RUN")
    installs = [" ".join(i.split()) for i in re.findall(r"pip install [^;]*", run)]
    # The released package at the add-on's version, with the tested pins; never a local file.
    assert installs == [
        'pip install -c /tmp/build/constraints.txt --no-compile "tts-bridge==${BUILD_VERSION}"'
    ]
    assert "sh /tmp/build/slim-venv.sh /opt/venv" in run
    env = " ".join(a for k, a in instructions(DOCKERFILE) if k == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    labels = " ".join(a for k, a in instructions(DOCKERFILE) if k == "LABEL")
    assert 'io.hass.version="${BUILD_VERSION}"' in labels


def _pyc_flags(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[4:8], "little")


def test_the_trimmer_on_a_real_venv(tmp_path: Path) -> None:
    """Run the real script: pip goes, dependencies' tests and the unused parts go, the bridge's
    modules stay, and everything left is byte-compiled once with hashes that are not checked."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    files = {
        "numpy/__init__.py": "",
        "numpy/_core/tests/test_x.py": "",
        "numpy/_core/include/numpy/ndarrayobject.h": "",
        "numpy/distutils/__init__.py": "",
        "numpy/f2py/__init__.py": "",
        "numpy/_core/umath.pyi": "",
        "jieba/__init__.py": "",
        "jieba/finalseg/__init__.py": "",
        "jieba/posseg/__init__.py": "",
        "jieba/lac_small/__init__.py": "",
        "jieba/analyse/__init__.py": "",
        "misaki/__init__.py": "",
        "misaki/zh.py": "X = 1\n",
        "misaki/data/__init__.py": "",
        "misaki/data/us_gold.json": "{}",
        "zeroconf/_core.pyx": "",
        "zeroconf/_core.c": "",
        "onnxruntime/__init__.py": "",
        "onnxruntime/transformers/__init__.py": "",
        # The Python module has the runtime linked in: the C API library beside it is unused.
        "onnxruntime/capi/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so": "libc.so.6",
        "onnxruntime/capi/libonnxruntime.so.1.32.0": "",
        "build/lib/proces/__init__.py": "",
        "piper/__init__.py": "",
        "piper/voice.py": "",
        "piper/train/__init__.py": "",
        "tts_bridge/__init__.py": "VALUE = 41 + 1\n",
        "tts_bridge/engines/piper.py": "",
        "torch/include/ATen/ATen.h": "",
    }
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text, encoding="utf-8")
    stale = site / "tts_bridge" / "__pycache__" / "__init__.cpython-311.opt-1.pyc"
    stale.parent.mkdir()
    stale.write_bytes(b"stale")

    done = subprocess.run(
        ["sh", str(SLIM), str(venv)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr

    left = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    assert not [p for p in left if p.split("/")[0] in {"pip", "setuptools", "pkg_resources"}]
    assert not list((venv / "bin").glob("pip*"))
    for gone in (
        "numpy/_core/tests/test_x.py",
        "numpy/_core/umath.pyi",
        "numpy/_core/include/numpy/ndarrayobject.h",
        "numpy/distutils/__init__.py",
        "piper/train/__init__.py",
        "jieba/posseg/__init__.py",
        "jieba/lac_small/__init__.py",
        "jieba/analyse/__init__.py",
        "misaki/data/us_gold.json",
        "zeroconf/_core.pyx",
        "zeroconf/_core.c",
        "onnxruntime/transformers/__init__.py",
        "onnxruntime/capi/libonnxruntime.so.1.32.0",
        "build/lib/proces/__init__.py",
    ):
        assert gone not in left, gone
    for kept in (
        "numpy/__init__.py",
        "numpy/f2py/__init__.py",
        "jieba/finalseg/__init__.py",
        "misaki/zh.py",
        "misaki/data/__init__.py",
        "piper/voice.py",
        "tts_bridge/engines/piper.py",
        "torch/include/ATen/ATen.h",
    ):
        assert kept in left, kept
    assert not stale.exists(), "pip's byte code is replaced, not kept beside the new one"
    compiled = sorted(p for p in left if p.endswith(".pyc"))
    sources = sorted(p for p in left if p.endswith(".py"))
    assert len(compiled) == len(sources), "one .pyc per module, no duplicates"
    tag = sys.implementation.cache_tag
    pyc = site / "tts_bridge" / "__pycache__" / f"__init__.{tag}.pyc"
    assert _pyc_flags(pyc) == 0b01, "hash-based and unchecked: no time stamp to go stale"
    # The compiled module is the one Python loads, without writing anything.
    shown = subprocess.run(
        [str(python), "-c", "import tts_bridge, misaki.zh; print(tts_bridge.VALUE, misaki.zh.X)"],
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": ""},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.split() == ["42", "1"]


def test_the_prebuilt_image_is_named_per_architecture() -> None:
    """config.yaml's `image` as the Supervisor validates it (RE_DOCKER_IMAGE_BUILD): with it the
    Supervisor pulls {arch} filled in instead of building this folder."""
    config = yaml.safe_load((ADDON / "config.yaml").read_text(encoding="utf-8"))
    image = config["image"]
    assert re.fullmatch(r"^([a-zA-Z\-\.:\d{}]+/)*?([\-\w{}]+)/([\-\w{}]+)$", image), image
    assert "{arch}" in image and ":" not in image.split("/")[-1], "the tag is the version"
