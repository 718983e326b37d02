"""A VITS voice (Piper's model) as two ONNX sessions, so that its audio can start before the
whole sentence is decoded.

A VITS model runs in one pass: the text encoder and the duration predictor make a latent
sequence, one frame per ``hop`` samples of audio (the "head"), then the flow and the decoder turn
it into audio (the "tail", most of the time). The tail is convolutional: a sample depends only on
nearby frames. So the tail can run on a window of the latent with a margin of frames either side
and give the window's audio, to within a hundred-thousandth of full scale, before the rest exists.
``VitsSplit`` cuts the model's graph at the tensors that flow into the tail (the latent, its mask
and, for a model with several speakers, the speaker embedding); the whole sentence through both
halves is the one-pass result exactly.

The cut is found in the graph, not named: Piper's exports call the modules ``flow`` and
``dec``, and the tail is everything downstream of the flow's input. A model that is not shaped
like this is not split (``split_model`` returns None) and runs in one pass.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tts_bridge.audio.pacing import PlayClock
from tts_bridge.system.durable import write_atomic

_LOGGER = logging.getLogger(__name__)

MARGIN_FRAMES = 32
"""Frames of context on each side of a window. The tail's receptive field is wider than this,
but what lies past it changes a window's audio by less than 1e-5 of full scale, a third of a
16-bit step (measured on joe: 24 frames leave 3e-4, 16 leave 2e-2, a click)."""
FIRST_WINDOW_FRAMES = 24
"""The first window: about 0.28 s of audio at Piper's 256-sample hop and 22,050 Hz, made in a
fraction of the sentence's time."""
DECAY = 0.8
"""How much of the decoding speed measured so far is kept at each new tail run."""


@dataclass(frozen=True)
class SplitModel:
    """The two halves of a VITS graph, serialized, and the tensors that join them."""

    head: bytes | Path
    """The head as a model's bytes, or the file it was written to."""
    tail: bytes | Path
    joins: tuple[str, ...]
    """The head's outputs, which are the tail's inputs, in order."""
    latent: str
    """The join that holds the frames (the flow's input); the others with a time axis are cut
    along with it."""


HEAD_FILE = "head.onnx"
TAIL_FILE = "tail.onnx"
META_FILE = "halves.json"
SPLIT_TIMEOUT_S = 300.0
"""How long cutting a model in a child process may take (seconds on a Raspberry Pi)."""


def cut_once(model: Path, folder: Path) -> SplitModel | None:
    """The model's halves kept in `folder` (one per model file: the caller names it by the
    model's hash): cut in a child process the first time, read from there at every later load.
    None when the model is not shaped like a Piper export. OSError when `folder` cannot be
    made."""
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        if meta is None:
            return None
        head, tail = folder / HEAD_FILE, folder / TAIL_FILE
        if head.is_file() and tail.is_file():
            return SplitModel(head, tail, tuple(meta["joins"]), str(meta["latent"]))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _LOGGER.warning("The halves of %s in %s are unreadable (%s): cut again", model, folder, exc)
    folder.mkdir(parents=True, exist_ok=True)
    split = split_model_apart(model, folder)
    if split is None or isinstance(split.head, Path):  # not when it was cut in memory
        meta = None if split is None else {"joins": split.joins, "latent": split.latent}
        write_atomic(folder / META_FILE, json.dumps(meta))  # last: the halves are complete
    return split


class CutError(Exception):
    """The child process cutting a model failed or hung: the model is used whole. It is not cut
    in the bridge instead: whatever broke the child (onnx's native code on an unusual CPU, a
    damaged file) could take the bridge with it."""


def split_model_apart(model: Path, folder: Path) -> SplitModel | None:
    """`split_model` in a child process, the halves written to files in `folder`. Reading a
    graph with onnx makes many small allocations that the allocator keeps after they are freed
    (about 80 MB for joe, which a Raspberry Pi feels); in a child they go with it, and the
    bridge never imports onnx. Where no child can be started, the model is cut here; a child
    that fails raises CutError."""
    command = [sys.executable, "-m", "tts_bridge.engines.vits_split", str(model), str(folder)]
    try:
        done = subprocess.run(command, capture_output=True, timeout=SPLIT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise CutError(f"cutting {model.name} took over {SPLIT_TIMEOUT_S:.0f} s") from None
    except OSError as exc:  # no child here (no interpreter to start, no process left)
        _LOGGER.warning("Cannot cut %s in a child process (%s): cut here", model.name, exc)
        return split_model(model)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[-300:]
        raise CutError(f"cutting {model.name} failed (exit {done.returncode}): {said}")
    try:
        meta = json.loads(done.stdout)
        if meta is None:
            return None
        joins, latent = tuple(meta["joins"]), str(meta["latent"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CutError(f"cutting {model.name} gave no halves ({exc})") from None
    return SplitModel(folder / HEAD_FILE, folder / TAIL_FILE, joins, latent)


def _write_split(argv: Sequence[str]) -> int:
    """The child's side of `split_model_apart`: the halves into the folder, and a JSON line on
    stdout (null, or the joins and the latent)."""
    split = split_model(Path(argv[0]))
    if split is None:
        print("null")
        return 0
    folder = Path(argv[1])
    assert isinstance(split.head, bytes) and isinstance(split.tail, bytes)
    (folder / HEAD_FILE).write_bytes(split.head)
    (folder / TAIL_FILE).write_bytes(split.tail)
    print(json.dumps({"joins": split.joins, "latent": split.latent}))
    return 0


def split_model(model: Path | bytes) -> SplitModel | None:
    """Cut a VITS model between the duration predictor and the flow; None when the graph is not
    shaped like a Piper export (then it is used whole)."""
    import onnx
    from onnx.utils import Extractor

    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    graph = proto.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    fixed = {init.name for init in graph.initializer}
    fixed |= {out for node in graph.node if node.op_type == "Constant" for out in node.output}
    outputs = [out.name for out in graph.output]
    if len(outputs) != 1:
        return None

    def downstream(*starts: str) -> list[Any]:
        # Nodes by identity: an export may leave names empty, or repeat them.
        seen: set[int] = set()
        todo = list(starts)
        while todo:
            for node in consumers[todo.pop()]:
                if id(node) not in seen:
                    seen.add(id(node))
                    todo.extend(node.output)
        return [node for node in graph.node if id(node) in seen]

    # The flow's entries: what its nodes read from before the flow (not from its own nodes,
    # named or not: the gated activations are exported without the module's prefix).
    flow = [node for node in graph.node if node.name.startswith("/flow/")]
    flowing = downstream(*(out for node in flow for out in node.output))
    after = {out for node in flowing for out in node.output}
    after |= {out for node in flow for out in node.output}
    entries = {
        name
        for node in flow
        for name in node.input
        if name and name not in after and name not in fixed and name in producer
    }
    # The latent is the entry with the smallest downstream: the mask and a speaker embedding
    # also feed the head (the durations' path, the duration predictor).
    best: tuple[int, str, list[Any]] | None = None
    for entry in sorted(entries):
        cone = downstream(entry)
        made = {out for node in cone for out in node.output}
        if outputs[0] in made and (best is None or len(cone) < best[0]):
            best = (len(cone), entry, cone)
    if best is None:
        return None
    _, latent, cone = best
    made = {out for node in cone for out in node.output}
    joins = sorted(
        {name for node in cone for name in node.input if name and name not in made | fixed}
    )
    graph_inputs = {i.name for i in graph.input}
    if latent not in joins or any(name in graph_inputs for name in joins):
        return None
    extractor = Extractor(proto)
    head = extractor.extract_model([i.name for i in graph.input], joins)
    tail = extractor.extract_model(joins, outputs)
    return SplitModel(head.SerializeToString(), tail.SerializeToString(), tuple(joins), latent)


class VitsSplit:
    """Both halves as sessions: the whole sentence (`audio`) or its audio window by window
    (`windows`)."""

    def __init__(self, split: SplitModel, head: Any, tail: Any, *, hop: int, rate: int) -> None:
        self._joins = split.joins
        self._latent = split.joins.index(split.latent)
        self.head = head
        self._tail = tail
        self._hop = hop
        self._rate = rate
        self._decoded_s = 0.0
        self._decoded_frames = 0.0

    @property
    def sessions(self) -> tuple[Any, Any]:
        return self.head, self._tail

    def audio(self, inputs: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        """The sentence's audio, as the model in one pass makes it."""
        joined = self.head.run(None, inputs)
        return self._run_tail(joined)

    def windows(
        self,
        inputs: dict[str, npt.NDArray[Any]],
        *,
        first: int = FIRST_WINDOW_FRAMES,
        margin: int = MARGIN_FRAMES,
    ) -> Iterator[tuple[npt.NDArray[np.float32], bool]]:
        """The sentence's audio in windows of frames, each with whether it is the last, and each
        decoded with `margin` frames of context either side; joined, they are `audio` but for a
        difference far below hearing.

        The first window is `first` frames. Each next one is as long as this machine can decode
        (at the speed of its recent decoding) in half the time left to play of the audio
        already made, so a listener who started with the first window does not wait for the
        next, and a fast machine decodes the rest in one window. A sentence too short to gain
        is one window.
        """
        joined = self.head.run(None, inputs)
        frames = int(joined[self._latent].shape[-1])
        if frames <= first + margin:
            yield self._run_tail(joined), True
            return
        start, size = 0, first
        playing = PlayClock()
        while start < frames:
            end = min(start + size, frames)
            if frames - end < first:  # no window shorter than the first after this one
                end = frames
            low, high = max(start - margin, 0), min(end + margin, frames)
            audio = self._run_tail([_frames(t, frames, low, high) for t in joined])
            yield audio[(start - low) * self._hop : (end - low) * self._hop], end == frames
            playing.sent((end - start) * self._hop / self._rate)
            size = max(first, int(playing.budget_s() / self._per_frame_s) - 2 * margin)
            start = end

    def _run_tail(self, joined: list[npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        feed = dict(zip(self._joins, joined, strict=True))
        began = time.perf_counter()
        audio = self._tail.run(None, feed)[0]
        # Seconds per frame of the recent runs, weighted by their frames (a short run's fixed
        # cost counts, but less than in its own ratio).
        self._decoded_s = DECAY * self._decoded_s + time.perf_counter() - began
        self._decoded_frames = DECAY * self._decoded_frames + int(joined[self._latent].shape[-1])
        return np.asarray(audio, dtype=np.float32).reshape(-1)

    @property
    def _per_frame_s(self) -> float:
        return self._decoded_s / max(self._decoded_frames, 1e-9)


def _frames(tensor: npt.NDArray[Any], frames: int, low: int, high: int) -> npt.NDArray[Any]:
    """A join cut to frames [low, high) when its last axis is the frames (the latent and its
    mask); as it is otherwise (a speaker embedding)."""
    if tensor.ndim and tensor.shape[-1] == frames and frames > 1:
        return tensor[..., low:high]
    return tensor


if __name__ == "__main__":
    raise SystemExit(_write_split(sys.argv[1:]))
