"""From GPT hidden states to audio: the ISTFT in numpy and the streaming decoders.

The decoder and Vocos are stacks of non-causal convolutions and the ISTFT overlaps frames, so
the last samples decoded from a prefix of a text still change when more codes arrive. To stream
a sentence while it is generated, this module works out which samples are final and decodes
only what it must:

* ``StatefulStreamingDecoder`` runs the export's streaming step graphs (``StreamStage``): each
  push decodes only the new frames, the layers' caches carrying the context;
* ``StreamingDecoder`` serves exports without them: each push decodes a window (the new frames
  plus the context they read, measured by ``measure_reach``).

Both join to the one-shot decode (``istft`` of the one-shot graphs) up to float rounding. The
decoders see the loaded model only through ``DecodingModel``, so this module does not depend
on the model that builds them.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tts_bridge.engines.base import EngineError, FloatAudio, record_stage
from tts_bridge.engines.chattts.onnx_format import STREAM_PADS_KEY

__all__ = [
    "DecodingModel",
    "Reach",
    "StatefulStreamingDecoder",
    "StreamStage",
    "StreamState",
    "StreamingDecoder",
    "istft",
    "measure_reach",
]


class DecodingModel(Protocol):
    """What the streaming decoders need of the loaded model (``ChatTTSOnnxModel``)."""

    hop_length: int
    window: npt.NDArray[np.float32]

    @property
    def reach(self) -> tuple[Reach, Reach]:
        """The decoder's and Vocos's reach in mel frames."""

    def run_decoder(self, hidden: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The decoder, one shot: (1, hidden, steps) -> mel (1, mels, 2 x steps)."""

    def run_vocos(
        self, mel: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Vocos, one shot: mel (1, mels, frames) -> magnitude and phase."""


def _as_float32(value: Any) -> npt.NDArray[np.float32]:
    return np.asarray(value, dtype=np.float32)


def istft(
    magnitude: npt.NDArray[np.float32],
    phase: npt.NDArray[np.float32],
    window: npt.NDArray[np.float32],
    hop_length: int,
) -> FloatAudio:
    """``torch.istft(mag * e^(i phase), n_fft, hop, window=window, center=True)`` in numpy.

    Frames are inverse-FFT'd, windowed and overlap-added; the sum is divided by the overlapped
    squared window and ``n_fft // 2`` samples are trimmed from each end (``center=True``).
    """
    n_fft = window.size
    frames = magnitude.shape[1]
    chunks = _frames(magnitude, phase, window)
    total = n_fft + hop_length * (frames - 1)
    signal = np.zeros(total, dtype=np.float32)
    envelope = np.zeros(total, dtype=np.float32)
    squared = window * window
    for index in range(frames):
        start = index * hop_length
        signal[start : start + n_fft] += chunks[:, index]
        envelope[start : start + n_fft] += squared
    half = n_fft // 2
    body = slice(half, total - half)
    return np.asarray(signal[body] / envelope[body], dtype=np.float32)


def _frames(
    magnitude: npt.NDArray[np.float32],
    phase: npt.NDArray[np.float32],
    window: npt.NDArray[np.float32],
) -> npt.NDArray[np.float32]:
    """Spectrum frames (bins, frames) -> windowed time frames (n_fft, frames)."""
    spectrum = (magnitude * np.cos(phase)) + 1j * (magnitude * np.sin(phase))
    chunks = np.fft.irfft(spectrum.astype(np.complex64), n=window.size, axis=0).astype(np.float32)
    chunks *= window[:, None]
    return chunks


@dataclass(frozen=True)
class Reach:
    """How many frames one output frame of a convolution stack reads on each side of itself."""

    left: int
    right: int


def measure_reach(
    run: Callable[[npt.NDArray[np.float32]], Sequence[npt.NDArray[np.float32]]],
    channels: int,
    frames_per_input: int,
    inputs: int = 64,
) -> Reach:
    """A graph's reach, read from how NaN spreads through it.

    ``run`` maps (1, channels, n) inputs to outputs (1, *, n x frames_per_input). The first and
    the last input of a sequence are NaN; every output that reads one of them, however small
    its weight, turns NaN, so the reach is the architecture's own (a changed value would be
    lost in rounding behind a residual connection, and the reach measured short of the
    architecture's). The sequence doubles until the two NaN regions are apart.
    """
    while True:
        probe = np.zeros((1, channels, inputs), dtype=np.float32)
        probe[:, :, [0, -1]] = np.nan
        reached = np.zeros(inputs * frames_per_input, dtype=bool)
        with np.errstate(invalid="ignore"):
            for output in run(probe):
                reached |= np.asarray(np.isnan(output[0]).any(axis=0), dtype=bool)
        clean = np.flatnonzero(~reached)
        if clean.size:
            # Outputs 0 .. clean[0] - 1 read the first input's frames (0 .. per - 1), and
            # clean[-1] + 1 .. end the last input's frames (n - per .. n - 1).
            left = int(clean[0]) - frames_per_input
            right = reached.size - frames_per_input - int(clean[-1]) - 1
            return Reach(left=left, right=right)
        inputs *= 2


class _OverlapAdd:
    """The ISTFT of spectrum frames that arrive in order: frames are overlap-added into a
    running buffer as the one-shot ``istft`` adds them, and samples leave once complete."""

    def __init__(self, model: DecodingModel) -> None:
        self._hop: int = model.hop_length
        self._window = model.window
        self._squared = self._window * self._window
        self._half: int = self._window.size // 2
        self._frames_done = 0
        """Spectrum frames overlap-added so far."""
        n_fft = self._window.size
        self._signal = np.zeros(n_fft, dtype=np.float32)
        self._envelope = np.zeros(n_fft, dtype=np.float32)
        self._origin = 0
        """Index (in the centre-padded signal) of ``_signal[0]``."""
        self._emitted = self._half
        """Padded index of the next sample to return: output sample 0 is padded index n_fft/2."""

    def _overlap(self, magnitude: npt.NDArray[np.float32], phase: npt.NDArray[np.float32]) -> None:
        """Add the next spectrum frames, each (bins, frames)."""
        chunks = _frames(magnitude, phase, self._window)
        target = self._frames_done + chunks.shape[1]
        n_fft = self._window.size
        needed = target * self._hop + n_fft - self._hop - self._origin
        if needed > self._signal.size:
            grow = needed - self._signal.size
            self._signal = np.concatenate([self._signal, np.zeros(grow, dtype=np.float32)])
            self._envelope = np.concatenate([self._envelope, np.zeros(grow, dtype=np.float32)])
        for index in range(chunks.shape[1]):
            at = (self._frames_done + index) * self._hop - self._origin
            self._signal[at : at + n_fft] += chunks[:, index]
            self._envelope[at : at + n_fft] += self._squared
        self._frames_done = target

    def _limit(self, codes: int, final: bool) -> int:
        """Padded index up to which the samples are complete."""
        if final:
            return self._window.size + self._hop * (2 * codes - 1) - self._half if codes else 0
        return self._frames_done * self._hop

    @property
    def emitted(self) -> int:
        """Output samples returned so far."""
        return self._emitted - self._half

    def _scratch(self) -> _OverlapAdd:
        """A copy whose overlap-add does not touch this one's buffers."""
        scratch = copy.copy(self)
        scratch._signal = self._signal.copy()
        scratch._envelope = self._envelope.copy()
        return scratch

    def _take(self, limit: int) -> FloatAudio:
        if limit <= self._emitted:
            return np.zeros(0, dtype=np.float32)
        begin, end = self._emitted - self._origin, limit - self._origin
        out = np.asarray(self._signal[begin:end] / self._envelope[begin:end], dtype=np.float32)
        self._signal = self._signal[end:]
        self._envelope = self._envelope[end:]
        self._origin = self._emitted = limit
        return out


class StreamingDecoder(_OverlapAdd):
    """Hidden states that arrive a few at a time -> the audio samples that can no longer change
    (for exports without the streaming graphs; see ``StatefulStreamingDecoder``).

    The decoder and Vocos are stacks of non-causal convolutions (zero padded at both ends) and
    the ISTFT overlaps frames, so the last samples decoded from a prefix change when more codes
    arrive. Only final samples are returned: those whose whole receptive field, mel frame to
    waveform, lies in the prefix (``DecodingModel.reach``).
    Each graph runs on a window, the new frames plus the context on either side they read, so
    the cost of a generation stays linear in its length. Mel frames once final are kept for
    Vocos's left context; spectrum frames are overlap-added into a running buffer as the one-shot
    ``istft`` adds them, in the same order.

    The concatenated output equals ``ChatTTSOnnxModel.decode`` of the full sequence (up to
    float rounding in the graphs' window sizes; the tests hold it to 1e-5).
    """

    def __init__(self, model: DecodingModel) -> None:
        super().__init__(model)
        self._model = model
        self._decoder_reach, self._vocos_reach = model.reach
        self._mel: npt.NDArray[np.float32] | None = None
        """Final mel frames from ``_mel_start`` to ``_mel_done`` (1, mels, frames)."""
        self._mel_start = 0
        self._mel_done = 0

    @property
    def lookahead_codes(self) -> float:
        """How many codes the final audio trails the generated codes by."""
        frames = self._decoder_reach.right + self._vocos_reach.right
        return (frames * self._hop + self._half) / (2 * self._hop)

    def ready(self, codes: int) -> int:
        """How many samples in all are final once ``codes`` codes exist (more may follow)."""
        frames = 2 * codes - self._decoder_reach.right - self._vocos_reach.right
        return max(0, frames * self._hop - self._half)

    def push(self, hiddens: npt.NDArray[np.float32], *, final: bool = False) -> FloatAudio:
        """The samples that became final with ``hiddens`` (every state so far, (steps, hidden));
        ``final`` says no state will follow, so every remaining sample is returned."""
        codes = hiddens.shape[0]
        total = 2 * codes
        mel_target = total if final else max(0, total - self._decoder_reach.right)
        if mel_target > self._mel_done:
            self._extend_mel(hiddens, mel_target)
        frame_target = mel_target if final else max(0, mel_target - self._vocos_reach.right)
        if frame_target > self._frames_done:
            self._add_frames(frame_target, mel_end=mel_target)
        return self._take(self._limit(codes, final))

    def _extend_mel(self, hiddens: npt.NDArray[np.float32], target: int) -> None:
        # The window starts on a code (two mel frames each) far enough left that the decoder's
        # zero padding there does not reach the first new frame.
        first_code = max(0, self._mel_done - self._decoder_reach.left) // 2
        window = np.ascontiguousarray(hiddens[first_code:].T[None, :, :], dtype=np.float32)
        mel = self._model.run_decoder(window)
        offset = 2 * first_code
        new = mel[:, :, self._mel_done - offset : target - offset]
        keep_from = max(0, self._frames_done - self._vocos_reach.left)
        if self._mel is None:
            self._mel = new
        else:
            old = self._mel[:, :, keep_from - self._mel_start :]
            self._mel = np.concatenate([old, new], axis=2)
            self._mel_start = keep_from
        self._mel_done = target

    def _add_frames(self, target: int, mel_end: int) -> None:
        assert self._mel is not None
        # From far enough left that Vocos's zero padding does not reach the first new frame, to
        # the last final mel frame (which the newest spectrum frame reads, and no further).
        start = max(0, self._frames_done - self._vocos_reach.left)
        mel = self._mel[:, :, start - self._mel_start : mel_end - self._mel_start]
        magnitude, phase = self._model.run_vocos(np.ascontiguousarray(mel))
        begin, stop = self._frames_done - start, target - start
        self._overlap(magnitude[0, :, begin:stop], phase[0, :, begin:stop])


class StreamStage:
    """One streaming step graph (``decoder_stream.onnx`` or ``vocos_stream.onnx``, see the
    exporter's docs): its session, and each cache's channels and padding."""

    def __init__(self, session: Any, frames_per_input: int) -> None:
        self._session = session
        self.frames_per_input = frames_per_input
        inputs = session.get_inputs()
        self._input_names = [i.name for i in inputs]
        meta = session.get_modelmeta().custom_metadata_map
        try:
            self.pads = [int(p) for p in meta[STREAM_PADS_KEY].split(",")]
        except (KeyError, ValueError) as exc:
            raise EngineError(f"a streaming graph lacks its '{STREAM_PADS_KEY}' metadata") from exc
        self.channels = [int(i.shape[1]) for i in inputs[2:]]
        if len(self.channels) != len(self.pads):
            raise EngineError("a streaming graph's caches do not match its 'pads' metadata")
        self.delay = sum(self.pads)
        """Frames the stack's output trails its input by (its one-sided reach)."""
        self._outputs = len(session.get_outputs()) - len(self.pads)

    def start(self) -> StreamState:
        """Fresh state for one text: each cache holds its p zero frames of left padding."""
        caches = [
            np.zeros((1, c, p), dtype=np.float32)
            for c, p in zip(self.channels, self.pads, strict=True)
        ]
        return StreamState(self, caches)

    def once(self, data: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
        """The one-shot graph's outputs for ``data`` (1, channels, n >= 1): one flushed push."""
        outputs = self.start().push(data, final=True)
        if outputs is None:
            raise EngineError("nothing to decode")
        return outputs

    def run(
        self, data: npt.NDArray[np.float32], caches: list[Any], final: bool
    ) -> tuple[list[npt.NDArray[np.float32]], list[Any]]:
        flush = np.zeros((1, 1 if final else 0), dtype=np.float32)
        feeds = dict(zip(self._input_names, [data, flush, *caches], strict=True))
        outputs = self._session.run(None, feeds)
        return [_as_float32(o) for o in outputs[: self._outputs]], outputs[self._outputs :]


class StreamState:
    """One text's pass through a ``StreamStage``: inputs are held back until the first push
    covers the stack's delay (every layer must then get more frames than its padding)."""

    def __init__(self, stage: StreamStage, caches: list[Any]) -> None:
        self.stage = stage
        self._caches = caches
        self._pending: list[npt.NDArray[np.float32]] = []
        self._pending_frames = 0
        self._started = False
        self._done = False

    def push(
        self, data: npt.NDArray[np.float32] | None, final: bool
    ) -> list[npt.NDArray[np.float32]] | None:
        """Feed new inputs (1, channels, n), if any; the outputs that became final, or None."""
        if self._done:
            raise EngineError("this stream has already been flushed")
        if data is not None and data.shape[2]:
            self._pending.append(data)
            self._pending_frames += data.shape[2] * self.stage.frames_per_input
        if final:
            self._done = True
            if not self._started and not self._pending_frames:
                return None
        elif not self._pending_frames or (
            not self._started and self._pending_frames <= self.stage.delay
        ):
            return None
        outputs, self._caches = self.stage.run(self._joined(self._pending), self._caches, final)
        self._pending = []
        self._pending_frames = 0
        self._started = True
        return outputs

    def peek(self, data: npt.NDArray[np.float32] | None) -> list[npt.NDArray[np.float32]] | None:
        """The outputs a final push of ``data`` would give now (as if the text ended after
        it: the layers' right zero padding), leaving this state as it is; None if nothing was
        ever fed. The graphs are functions of their cache inputs, so the caches are shared."""
        if self._done:
            raise EngineError("this stream has already been flushed")
        pending = [*self._pending, data] if data is not None and data.shape[2] else self._pending
        if not self._started and not pending:
            return None
        outputs, _ = self.stage.run(self._joined(pending), self._caches, True)
        return outputs

    def _joined(self, pending: list[npt.NDArray[np.float32]]) -> npt.NDArray[np.float32]:
        if not pending:  # a flush with nothing new: only the right padding is decoded
            width = self.stage.channels[0] * self.stage.frames_per_input
            return np.zeros((1, width, 0), dtype=np.float32)
        joined = pending[0] if len(pending) == 1 else np.concatenate(pending, axis=2)
        return np.ascontiguousarray(joined)


class StatefulStreamingDecoder(_OverlapAdd):
    """``StreamingDecoder``'s job on the streaming step graphs: each push runs the decoder on
    the new hidden states only and Vocos on the new mel frames only, the layers' caches carrying
    the context, so streaming costs about what decoding the text whole does. The final push
    flushes both stacks (each layer's right padding). Same interface and output as
    ``StreamingDecoder`` (the one-shot ``decode`` up to float rounding; tests hold it to 1e-5).
    """

    def __init__(self, decoder: StreamState, vocos: StreamState, model: DecodingModel) -> None:
        super().__init__(model)
        self._decoder = decoder
        self._vocos = vocos
        self._fed = 0
        """Hidden states given to the decoder so far."""

    @property
    def lookahead_codes(self) -> float:
        """How many codes the final audio trails the generated codes by."""
        frames = self._decoder.stage.delay + self._vocos.stage.delay
        return (frames * self._hop + self._half) / (2 * self._hop)

    def ready(self, codes: int) -> int:
        """How many samples in all are final once ``codes`` codes exist (more may follow)."""
        frames = 2 * codes - self._decoder.stage.delay - self._vocos.stage.delay
        return max(0, frames * self._hop - self._half)

    def push(self, hiddens: npt.NDArray[np.float32], *, final: bool = False) -> FloatAudio:
        """The samples that became final with ``hiddens`` (every state so far, (steps, hidden));
        ``final`` says no state will follow, so every remaining sample is returned."""
        codes = hiddens.shape[0]
        new = np.ascontiguousarray(hiddens[self._fed :].T[None, :, :], dtype=np.float32)
        self._fed = codes
        started = time.perf_counter()
        mel = self._decoder.push(new, final)
        decoded = time.perf_counter()
        record_stage("decoder", decoded - started)
        if mel is not None or final:
            spectrum = self._vocos.push(mel[0] if mel is not None else None, final)
            record_stage("vocoder", time.perf_counter() - decoded)
            if spectrum is not None:
                magnitude, phase = spectrum
                self._overlap(magnitude[0], phase[0])
        return self._take(self._limit(codes, final))

    def preview(self, hiddens: npt.NDArray[np.float32]) -> FloatAudio:
        """The audio from ``emitted`` on as if the text ended after ``hiddens`` (every state
        so far): both stacks flushed on copies of their state, the spectrum overlap-added into
        a copy of the ISTFT buffer. Nothing of this decoder changes; the samples near the end
        are approximate (they miss the codes still to come), those farther back close to final.
        """
        codes = hiddens.shape[0]
        if not codes:
            return np.zeros(0, dtype=np.float32)
        new = np.ascontiguousarray(hiddens[self._fed :].T[None, :, :], dtype=np.float32)
        mel = self._decoder.peek(new)
        spectrum = self._vocos.peek(mel[0] if mel is not None else None)
        scratch = self._scratch()
        if spectrum is not None:
            magnitude, phase = spectrum
            scratch._overlap(magnitude[0], phase[0])
        return scratch._take(scratch._limit(codes, True))
