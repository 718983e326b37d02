"""Piper's model in two halves: the same audio whole, and window by window within far less than
a sample's step, with the first window out long before the sentence is decoded (real joe)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tts_bridge.engines import piper, vits_split
from tts_bridge.engines.base import SynthesisOptions
from tts_bridge.engines.onnx_voice import new_session
from tts_bridge.engines.vits_split import (
    FIRST_WINDOW_FRAMES,
    HEAD_FILE,
    MARGIN_FRAMES,
    META_FILE,
    TAIL_FILE,
    VitsSplit,
    cut_once,
    split_model,
    split_model_apart,
)
from tts_bridge.system.threads import OnnxSessionPlan

PLAN = OnnxSessionPlan(intra_op_threads=1)
TEXT = "The washing machine in the basement has finished, and the dryer is still running."


@pytest.fixture(scope="module")
def engine() -> piper.PiperEngine:
    return piper.PiperEngine(None, "0" * 64, PLAN)


def _quiet_inputs(engine: piper.PiperEngine, text: str) -> dict[str, Any]:
    """The model's inputs for `text` without its random noise, so two runs are the same."""
    inputs: dict[str, Any] = next(engine.runtime().inputs(text, None, SynthesisOptions()))
    inputs["scales"] = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    return inputs


def test_the_cut_is_before_the_flow(engine: piper.PiperEngine) -> None:
    split = split_model(piper.bundled_model())
    assert split is not None
    assert split.latent in split.joins and len(split.joins) == 2  # the latent and its mask
    assert isinstance(split.tail, bytes)
    tail = onnx.load_from_string(split.tail)
    names = [node.name for node in tail.graph.node]
    assert any(n.startswith("/flow/") for n in names) and any(n.startswith("/dec/") for n in names)
    assert not any(n.startswith(("/enc_p/", "/dp/")) for n in names)


def test_both_halves_make_the_model_s_audio_exactly(engine: piper.PiperEngine) -> None:
    inputs = _quiet_inputs(engine, TEXT)
    whole = new_session(piper.bundled_model(), PLAN).run(None, inputs)[0].reshape(-1)
    halves = engine.runtime().halves
    assert halves is not None
    assert np.array_equal(halves.audio(inputs), whole)


@pytest.mark.parametrize("first", [8, FIRST_WINDOW_FRAMES, 60])
def test_windows_join_to_the_whole_sentence(engine: piper.PiperEngine, first: int) -> None:
    inputs = _quiet_inputs(engine, TEXT)
    halves = engine.runtime().halves
    assert halves is not None
    whole = halves.audio(inputs)
    windows = list(halves.windows(inputs, first=first))
    assert len(windows) > 1
    assert [last for _, last in windows] == [False] * (len(windows) - 1) + [True]
    hop = engine.runtime().voice.config.hop_length
    assert windows[0][0].size == first * hop
    joined = np.concatenate([audio for audio, _ in windows])
    assert joined.size == whole.size
    # Far below a 16-bit step (3e-5): no click where the windows meet.
    assert np.abs(joined - whole).max() < 1e-5


def test_without_a_margin_the_windows_would_click(engine: piper.PiperEngine) -> None:
    """The margin is what makes the windows join (this proves the test above can fail)."""
    inputs = _quiet_inputs(engine, TEXT)
    halves = engine.runtime().halves
    assert halves is not None
    whole = halves.audio(inputs)
    joined = np.concatenate([a for a, _ in halves.windows(inputs, margin=0)])
    assert np.abs(joined - whole).max() > 1e-3
    assert MARGIN_FRAMES > 0


def test_a_short_sentence_is_one_window(engine: piper.PiperEngine) -> None:
    halves = engine.runtime().halves
    assert halves is not None
    inputs = _quiet_inputs(engine, "Yes.")
    split = split_model(piper.bundled_model())
    assert split is not None
    latent = halves.head.run(None, inputs)[split.joins.index(split.latent)]
    frames = int(latent.shape[-1])
    windows = list(halves.windows(inputs, first=frames - MARGIN_FRAMES))
    assert len(windows) == 1 and windows[0][1]
    assert len(list(halves.windows(inputs, first=frames - MARGIN_FRAMES - 1))) == 2


def test_the_engine_streams_windows_and_says_when_more_follow(engine: piper.PiperEngine) -> None:
    chunks = list(engine.synthesize_stream(TEXT, None, SynthesisOptions()))
    audio = [c for c in chunks if c.size]
    assert len(audio) > 1
    # Each window but the last is followed by an empty chunk: the renderer sends it at once.
    assert [c.size == 0 for c in chunks] == [False, True] * (len(audio) - 1) + [False]
    assert all(c.dtype == np.float32 and np.abs(c).max() <= 1.0 for c in audio)


def _tiny_model(path: Path) -> Path:
    """A model that is not a VITS export: one Mul."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [None])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [None])
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    node = helper.make_node("Mul", ["input", "two"], ["output"], name="/scale/Mul")
    graph = helper.make_graph([node], "tiny", [x], [y], initializer=[two])
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_a_model_of_another_shape_is_not_split(tmp_path: Path) -> None:
    assert split_model(_tiny_model(tmp_path / "tiny.onnx")) is None


def test_split_halves_are_ordinary_sessions(engine: piper.PiperEngine) -> None:
    split = split_model(piper.bundled_model())
    assert split is not None
    halves = VitsSplit(
        split, new_session(split.head, PLAN), new_session(split.tail, PLAN), hop=256, rate=22050
    )
    head, tail = halves.sessions
    assert [i.name for i in head.get_outputs()] == list(split.joins)
    assert [i.name for i in tail.get_inputs()] == list(split.joins)


def test_the_head_never_spins_and_the_tail_follows_the_plan() -> None:
    spinning = "session.intra_op.allow_spinning"
    engine = piper.PiperEngine(None, "0" * 64, OnnxSessionPlan(intra_op_threads=2, spinning=True))
    head, tail = engine.runtime().sessions
    assert head.get_session_options().get_session_config_entry(spinning) == "0"
    assert tail.get_session_options().get_session_config_entry(spinning) == "1"


def test_the_model_is_cut_in_a_child_and_the_bridge_never_imports_onnx() -> None:
    script = (
        "import sys\n"
        "from tts_bridge.engines.piper import PiperEngine\n"
        "from tts_bridge.engines.base import SynthesisOptions\n"
        "from tts_bridge.system.threads import OnnxSessionPlan\n"
        "engine = PiperEngine(None, '0' * 64, OnnxSessionPlan(intra_op_threads=1))\n"
        f"chunks = list(engine.synthesize_stream({TEXT!r}, None, SynthesisOptions()))\n"
        "print(sum(1 for c in chunks if c.size), 'onnx' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    windows, imported = done.stdout.split()
    assert int(windows) > 1 and imported == "False", done.stderr


def test_a_child_cuts_the_same_halves(tmp_path: Path) -> None:
    here = split_model(piper.bundled_model())
    apart = split_model_apart(piper.bundled_model(), tmp_path)
    assert here is not None and apart is not None
    assert (apart.joins, apart.latent) == (here.joins, here.latent)
    assert apart.head == tmp_path / HEAD_FILE and apart.tail == tmp_path / TAIL_FILE
    assert (tmp_path / HEAD_FILE).read_bytes() == here.head
    assert (tmp_path / TAIL_FILE).read_bytes() == here.tail


def test_without_a_child_the_model_is_cut_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    with caplog.at_level(logging.WARNING, logger="tts_bridge.engines.vits_split"):
        split = split_model_apart(piper.bundled_model(), tmp_path)
    assert split is not None and isinstance(split.head, bytes)
    assert len([r for r in caplog.records if "child process" in r.getMessage()]) == 1


@pytest.mark.parametrize("kept", [True, False])
def test_a_child_that_crashes_leaves_the_model_whole_and_the_bridge_running(
    kept: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The child dies as onnx's native code can on an unusual CPU (SIGILL): cutting in the
    # bridge instead would take the bridge with it.
    def crashed(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(command, -4, b"", b"Illegal instruction")

    def not_here(model: Any) -> Any:
        raise AssertionError("the model was cut in the bridge")

    monkeypatch.setattr(subprocess, "run", crashed)
    monkeypatch.setattr(vits_split, "split_model", not_here)
    monkeypatch.setattr(piper, "split_model", not_here)
    folder = tmp_path / "halves" if kept else None
    engine = piper.PiperEngine(None, "0" * 64, PLAN, folder)
    with caplog.at_level(logging.WARNING, logger="tts_bridge.engines.piper"):
        assert engine.runtime().halves is None
    assert [c for c in engine.synthesize_stream(TEXT, None, SynthesisOptions()) if c.size]
    warned = [r.getMessage() for r in caplog.records if "used whole" in r.getMessage()]
    assert len(warned) == 1 and "exit -4" in warned[0] and "Illegal instruction" in warned[0]
    if kept:  # nothing recorded: the next load tries again
        assert not (folder / META_FILE).exists()  # type: ignore[operator]


def test_a_model_is_cut_once_and_its_halves_read_at_later_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "halves"
    first = cut_once(piper.bundled_model(), folder)
    assert first is not None and (folder / META_FILE).is_file()

    def no_child(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("cut again")

    monkeypatch.setattr(subprocess, "run", no_child)
    again = cut_once(piper.bundled_model(), folder)
    assert again == first
    # A later load of the engine builds its sessions from the folder, without a child.
    engine = piper.PiperEngine(None, "0" * 64, PLAN, folder)
    assert len([c for c in engine.synthesize_stream(TEXT, None, SynthesisOptions()) if c.size]) > 1


def test_damaged_halves_are_cut_again(tmp_path: Path) -> None:
    folder = tmp_path / "halves"
    assert cut_once(piper.bundled_model(), folder) is not None
    (folder / META_FILE).write_text("{not json", encoding="utf-8")
    assert cut_once(piper.bundled_model(), folder) is not None
    (folder / TAIL_FILE).write_bytes(b"garbage")  # a session cannot be made of it
    engine = piper.PiperEngine(None, "0" * 64, PLAN, folder)
    assert [c for c in engine.synthesize(TEXT, None, SynthesisOptions()) if c.size]
    assert not folder.exists()  # dropped, so the next load cuts it again


def test_the_cut_does_not_rely_on_node_names_outside_the_flow() -> None:
    """An export may leave node names empty: only the flow's prefix is read."""
    model = onnx.load(str(piper.bundled_model()))
    for node in model.graph.node:
        if not node.name.startswith("/flow/"):
            node.name = ""
    unnamed = split_model(model.SerializeToString())
    named = split_model(piper.bundled_model())
    assert unnamed is not None and named is not None
    assert (unnamed.joins, unnamed.latent) == (named.joins, named.latent)
