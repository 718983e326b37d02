"""The ChatTTS bench finds its random checkpoint writer in the clone's tests/support, and an
installed bridge without that folder says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import random_checkpoint as writer
from tts_bridge.bench import checkpoint


def test_the_writer_comes_from_the_clones_tests_support() -> None:
    assert checkpoint.random_checkpoint() is writer
    assert (checkpoint.clone_root() / checkpoint.WRITER).resolve() == Path(writer.__file__)


def test_without_a_clone_the_bench_says_where_the_writer_lives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "clone_root", lambda: tmp_path)
    with pytest.raises(checkpoint.NoCloneError, match=r"tests/support/random_checkpoint\.py"):
        checkpoint.random_checkpoint()


def test_the_writer_is_not_in_the_package() -> None:
    import tts_bridge

    package = Path(tts_bridge.__file__).parent
    assert not list(package.rglob("random_checkpoint.py"))
