"""A tiny randomly initialised ChatTTS checkpoint in the real asset layout, for tests.

The real weights (about 1.1 GB) come from a model hub this project never contacts, so the tests
drive the real ``chattts`` code with this stand-in: ``write_random_checkpoint`` at the ``TINY``
size (``tests.support.random_checkpoint`` describes the files and the speaker
statistics' format; the bench writes its full-size checkpoint with the same writer).

Run as a script to write one: ``python -m tests.support.chattts_tiny DEST`` (from the clone).

The ChatTTS tests share their set-up through this module too: the ``NEEDS_CHATTTS`` and
``NEEDS_CHATTTS_ONNX`` skip markers, ``tiny_hashes`` (the expected hashes of a checkpoint's
files), ``export_tiny`` (the real exporter, optionally with INT8 quantization),
``chattts_reference`` (ChatTTS itself on a checkpoint) and ``run_torch_free`` (a snippet in a
fresh interpreter, with a report of the heavy modules it imported).

Building a checkpoint and exporting it take seconds each, and a dozen test modules need one, so
``TinyModels`` builds each variant once per test session; the session fixtures below
(registered for every test by ``tests/conftest.py``) hand them out. They are shared: treat them
as read-only, and copy one (``shutil.copytree``) before changing it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.random_checkpoint import TINY, write_random_checkpoint
from tts_bridge.engines.chattts.torch_engine import CHECKPOINT_FILES, SPK_STAT_FILE, ChatTTSEngine
from tts_bridge.engines.manifests import sha256_file

REPO_ROOT = Path(__file__).resolve().parents[2]

HIDDEN_SIZE = TINY.hidden_size
NUM_LAYERS = TINY.num_layers


def make_tiny_checkpoint(
    dest: Path, seed: int = 0, *, hidden_size: int = HIDDEN_SIZE, num_layers: int = NUM_LAYERS
) -> Path:
    """Write a tiny random ChatTTS checkpoint under ``dest``; returns ``dest``.

    The same arguments write byte-identical files, so their hashes are stable. A larger
    ``hidden_size``/``num_layers`` (the real model: 768 x 20) makes a checkpoint of measurable
    size, e.g. to watch memory come back after unloading; ``hidden_size`` must be a multiple of 16.
    """
    size = dataclasses.replace(TINY, hidden_size=hidden_size, num_layers=num_layers)
    return write_random_checkpoint(dest, size, seed)


# -- shared test set-up -------------------------------------------------------------------------

NEEDS_CHATTTS = pytest.mark.skipif(
    importlib.util.find_spec("ChatTTS") is None,
    reason="needs the 'chattts' extra (torch, ChatTTS)",
)

NEEDS_CHATTTS_ONNX = pytest.mark.skipif(
    importlib.util.find_spec("ChatTTS") is None
    or importlib.util.find_spec("onnx") is None
    or importlib.util.find_spec("onnxruntime") is None,
    reason="needs the 'chattts' extra plus onnx (the exporter) and onnxruntime",
)

HEAVY_MODULES = ("torch", "torchaudio", "transformers", "ChatTTS", "vocos", "numba", "onnx")
"""Top-level packages the ONNX engine must run without."""

_REPORT_HEAVY = f"""
import json as _json, sys as _sys
_heavy = sorted(n for n in _sys.modules if n.split(".")[0] in {HEAVY_MODULES!r})
print(_json.dumps({{**report, "heavy": _heavy}}))
"""


def tiny_hashes(checkpoint: Path) -> dict[str, str]:
    """The sha256 of every file ChatTTS loads from ``checkpoint`` (the expected hashes)."""
    return {rel: sha256_file(checkpoint / rel) for rel in (*CHECKPOINT_FILES, SPK_STAT_FILE)}


def export_tiny(checkpoint: Path, dest: Path, *, quantize: bool = False) -> Path:
    """Export ``checkpoint`` to ONNX under ``dest`` with the real exporter (its hashes checked),
    then add the INT8 variant if ``quantize``; returns ``dest``."""
    from tts_bridge.engines.chattts.export import export_chattts

    export_chattts(checkpoint, dest, expected_sha256=tiny_hashes(checkpoint))
    if quantize:
        from tts_bridge.engines.chattts.quantize import quantize_onnx

        quantize_onnx(dest)
    return dest


def chattts_reference(checkpoint: Path, threads: int) -> Iterator[Any]:
    """Yield ChatTTS's own ``Chat`` (torch) loaded from ``checkpoint`` by the torch engine, then
    unload it: the reference the ONNX code is compared with (``yield from`` it in a fixture)."""
    engine = ChatTTSEngine(checkpoint, expected_sha256=tiny_hashes(checkpoint), threads=threads)
    engine.load()
    yield engine._loaded.chat  # type: ignore[union-attr]  # white-box: ChatTTS's own objects
    engine.unload()


def run_torch_free(code: str, *args: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter from the repository root, with ``args`` as its
    ``sys.argv[1:]``; it must succeed and set ``report`` to a JSON-able dict.

    Returns that dict plus ``"heavy"``: the modules of HEAVY_MODULES' packages imported by the
    end of the run (sorted; empty when the code ran torch-free).
    """
    result = subprocess.run(
        [sys.executable, "-c", code + _REPORT_HEAVY, *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


# -- built once per test session ------------------------------------------------------------------


class TinyModels:
    """Tiny checkpoints and their ONNX exports, each built on first use and then reused.

    Everything lives under one session temporary folder, keyed by the arguments: the same
    ``make_tiny_checkpoint`` arguments give the same checkpoint (byte for byte), so sharing one
    between tests changes no result. The INT8 export is the FP32 export copied and quantized,
    as ``export_tiny(..., quantize=True)`` would leave it.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._built: dict[tuple[object, ...], Path] = {}

    def checkpoint(
        self, seed: int = 0, *, hidden_size: int = HIDDEN_SIZE, num_layers: int = NUM_LAYERS
    ) -> Path:
        """The checkpoint ``make_tiny_checkpoint`` writes for these arguments (read-only)."""
        key = ("checkpoint", seed, hidden_size, num_layers)
        return self._once(
            key,
            lambda dest: make_tiny_checkpoint(
                dest, seed, hidden_size=hidden_size, num_layers=num_layers
            ),
            self._folder(seed, hidden_size, num_layers) / "tiny",
        )

    def export(
        self,
        seed: int = 0,
        *,
        hidden_size: int = HIDDEN_SIZE,
        num_layers: int = NUM_LAYERS,
        quantize: bool = True,
    ) -> Path:
        """That checkpoint exported to ONNX, with the INT8 variant if ``quantize`` (read-only)."""
        folder = self._folder(seed, hidden_size, num_layers)
        checkpoint = self.checkpoint(seed, hidden_size=hidden_size, num_layers=num_layers)
        fp32 = self._once(
            ("export", seed, hidden_size, num_layers, False),
            lambda dest: export_tiny(checkpoint, dest),
            folder / "export-fp32",
        )
        if not quantize:
            return fp32
        return self._once(
            ("export", seed, hidden_size, num_layers, True),
            lambda dest: _quantized_copy(fp32, dest),
            folder / "export",
        )

    def _folder(self, seed: int, hidden_size: int, num_layers: int) -> Path:
        return self._root / f"seed{seed}-{hidden_size}x{num_layers}"

    def _once(self, key: tuple[object, ...], build: Callable[[Path], Path], dest: Path) -> Path:
        if key not in self._built:
            if dest.exists():  # a build that failed half-way: start again
                shutil.rmtree(dest)
            self._built[key] = build(dest)
        return self._built[key]


def _quantized_copy(export: Path, dest: Path) -> Path:
    from tts_bridge.engines.chattts.quantize import quantize_onnx

    shutil.copytree(export, dest)
    quantize_onnx(dest)
    return dest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """The session's tiny ChatTTS checkpoints and exports (see ``TinyModels``)."""
    return TinyModels(tmp_path_factory.mktemp("chattts-tiny"))


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_models: TinyModels) -> Path:
    """The tiny checkpoint of seed 0 (read-only; skipped without the 'chattts' extra)."""
    if importlib.util.find_spec("ChatTTS") is None:
        pytest.skip("needs the 'chattts' extra (torch, ChatTTS)")
    return tiny_models.checkpoint()


@pytest.fixture(scope="session")
def tiny_export(tiny_models: TinyModels, tiny_checkpoint: Path) -> Path:
    """``tiny_checkpoint`` exported to ONNX and quantized: FP32 and INT8 (read-only)."""
    return tiny_models.export()


@pytest.fixture(scope="session")
def tiny_export_fp32(tiny_models: TinyModels, tiny_checkpoint: Path) -> Path:
    """``tiny_checkpoint`` exported to ONNX, FP32 only (read-only)."""
    return tiny_models.export(quantize=False)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.support.chattts_tiny DEST")
    print(make_tiny_checkpoint(Path(sys.argv[1])))
