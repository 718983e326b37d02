"""Background synthesis gives way to live work within one generation step.

Real models only: the tiny random ChatTTS checkpoint (tests/support/chattts_tiny.py), exported to
ONNX by
the project's exporter, drives both ChatTTS engines. The interrupt check is the scheduler's way in
(`tts_bridge.engines.base.interruptible`); here the tests install their own checks so that when
an engine stops is exact: a count of the steps it asked.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

from tests.support.chattts_tiny import NEEDS_CHATTTS_ONNX, tiny_hashes
from tts_bridge.engines.base import SynthesisInterruptedError, interruptible
from tts_bridge.engines.chattts.common import ChatTTSOptions
from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
from tts_bridge.engines.chattts.torch_engine import ChatTTSEngine
from tts_bridge.speech.scheduler import Scheduler

TEXT = "The front door is open."

pytestmark = NEEDS_CHATTTS_ONNX


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Path) -> Path:
    return tiny_checkpoint


@pytest.fixture(scope="module")
def onnx_engine(tiny_export_fp32: Path) -> Iterator[ChatTTSOnnxEngine]:
    engine = ChatTTSOnnxEngine(tiny_export_fp32, precision="fp32", threads=1)
    engine.load()
    yield engine
    engine.unload()


@pytest.fixture(scope="module")
def torch_engine(checkpoint: Path) -> Iterator[ChatTTSEngine]:
    engine = ChatTTSEngine(checkpoint, expected_sha256=tiny_hashes(checkpoint), threads=1)
    engine.load()
    yield engine
    engine.unload()


class CountingCheck:
    """An interrupt check that says "stop" from its `after`-th call on."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls > self.after


def _interrupted(run: Callable[[], object], check: CountingCheck) -> None:
    with interruptible(check), pytest.raises(SynthesisInterruptedError):
        run()


# -- the ONNX engine ----------------------------------------------------------------------------


def test_onnx_engine_stops_at_the_step_the_check_says(onnx_engine: ChatTTSOnnxEngine) -> None:
    options = ChatTTSOptions(seed=1)
    whole = np.concatenate(list(onnx_engine.synthesize(TEXT, None, options)))
    check = CountingCheck(after=5)
    _interrupted(lambda: list(onnx_engine.synthesize(TEXT, None, options)), check)
    # One check per step: it stopped at step 6, long before the sentence's end.
    assert check.calls == 6
    assert whole.size > 6 * 512
    # The engine is not left locked or half-loaded: the same call completes, with equal audio.
    again = np.concatenate(list(onnx_engine.synthesize(TEXT, None, options)))
    np.testing.assert_array_equal(again, whole)


@pytest.mark.parametrize("path", ["stream", "batch", "refine"])
def test_every_onnx_generation_path_can_be_interrupted(
    onnx_engine: ChatTTSOnnxEngine, path: str
) -> None:
    options = ChatTTSOptions(seed=1, refine_text=path == "refine")
    run: Callable[[], object] = {
        "stream": lambda: list(onnx_engine.synthesize_stream(TEXT, None, options)),
        "batch": lambda: onnx_engine.synthesize_batch([TEXT, "Lights on."], None, options),
        "refine": lambda: list(onnx_engine.synthesize(TEXT, None, options)),
    }[path]
    check = CountingCheck(after=2)
    _interrupted(run, check)
    assert check.calls == 3


def test_the_check_belongs_to_the_thread_that_installed_it(
    onnx_engine: ChatTTSOnnxEngine,
) -> None:
    """A live job on another thread is never interrupted by the background thread's check."""
    installed = threading.Event()
    release = threading.Event()

    def background() -> None:
        with interruptible(lambda: True):
            installed.set()
            release.wait(30)

    other = threading.Thread(target=background)
    other.start()
    try:
        assert installed.wait(30)
        audio = list(onnx_engine.synthesize(TEXT, None, ChatTTSOptions(seed=1)))
        assert sum(chunk.size for chunk in audio) > 0
    finally:
        release.set()
        other.join(30)


# -- the torch engine ---------------------------------------------------------------------------


def test_torch_engine_stops_inside_chattts_and_caches_nothing_partial(
    torch_engine: ChatTTSEngine,
) -> None:
    options = ChatTTSOptions(seed=1)
    check = CountingCheck(after=3)
    _interrupted(lambda: list(torch_engine.synthesize(TEXT, None, options)), check)
    # ChatTTS polled our flag inside its GPT loop (a few times per step), then the engine
    # refused the partial result it returned.
    assert check.calls >= 4
    audio = list(torch_engine.synthesize(TEXT, None, options))
    assert sum(chunk.size for chunk in audio) > 0


# -- the scheduler --------------------------------------------------------------------------------


class OneTask:
    """A background source with one ChatTTS generation that records how it ended."""

    def __init__(self, engine: ChatTTSOnnxEngine) -> None:
        self.engine = engine
        self.started = threading.Event()
        self.outcome: list[str] = []
        self._given = False

    def next_task(self) -> Callable[[], None] | None:
        if self._given:
            return None
        self._given = True
        return self._run

    def _run(self) -> None:
        self.started.set()
        try:
            for _ in range(200):  # far longer than the test: only an interruption ends it
                self.engine.synthesize_batch([TEXT], None, ChatTTSOptions(seed=1))
        except SynthesisInterruptedError:
            self.outcome.append("interrupted")
            raise
        self.outcome.append("finished")


def test_scheduler_interrupts_background_work_when_a_live_job_arrives(
    onnx_engine: ChatTTSOnnxEngine,
) -> None:
    source = OneTask(onnx_engine)
    scheduler = Scheduler(
        1, 8, background=source, idle_delay_s=0.0, idle_max_load=1000.0, idle_nice=0
    )
    scheduler.start()
    live_ran = threading.Event()
    try:
        assert source.started.wait(60)
        assert scheduler.submit_live(live_ran.set)
        assert live_ran.wait(60)
        assert source.outcome == ["interrupted"]
    finally:
        scheduler.stop(10)
