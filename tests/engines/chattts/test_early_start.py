"""The early start of a streamed ChatTTS ONNX generation (``onnx_early``): approximate pieces
from a preview of the streaming graphs before the first samples are final, then the exact
ones, on the tiny checkpoint (its lookahead is 8.5 codes: 9 + 6 mel frames of reach).

The planner runs with a clock the tests drive, so which pieces are previews is fixed by the
test; the engine runs with the real clock, and its tests state only what holds whatever the
timing: when the first piece comes (in codes), what is exact, the lengths, the last piece.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.support.chattts_tiny import NEEDS_CHATTTS_ONNX
from tts_bridge.audio import codec
from tts_bridge.config import load_settings
from tts_bridge.engines.chattts.common import ChatTTSOptions
from tts_bridge.engines.chattts.onnx_early import (
    SAMPLES_PER_CODE,
    EarlyStart,
    EarlyStream,
    crossfade,
    snr_db,
)
from tts_bridge.engines.chattts.onnx_engine import STREAM_CHUNK_CODES, ChatTTSOnnxEngine, audible
from tts_bridge.engines.chattts.onnx_format import precision_files, read_manifest
from tts_bridge.engines.chattts.onnx_model import ChatTTSOnnxModel, SamplingParams, code_prompt
from tts_bridge.engines.chattts.onnx_stream import StatefulStreamingDecoder
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.synthesis import AudioPart, Synthesizer

pytestmark = NEEDS_CHATTTS_ONNX

TEXT = "The front door is open."
PARITY = 1e-5
EARLY = EarlyStart(codes=4, context=2, crossfade=128)
"""Starts well before the tiny model's first exact piece (8 codes + 8.5 of lookahead), with a
context short enough that the previews really differ from the exact audio."""


@pytest.fixture(scope="module")
def model(tiny_export: Path) -> ChatTTSOnnxModel:
    return ChatTTSOnnxModel(
        tiny_export, precision_files(read_manifest(tiny_export), "int8"), threads=1
    )


@pytest.fixture(scope="module")
def hiddens(model: ChatTTSOnnxModel) -> npt.NDArray[np.float32]:
    """Real hidden states of a generation on the tiny model (120 codes)."""
    prompt = model.encode([code_prompt(model.cleaner(TEXT), 5, True)], None)
    params = SamplingParams(min_new_token=120, max_new_token=120)
    (result,) = model.generate(prompt, params, seed=3)
    return result.hiddens


def _decoder(model: ChatTTSOnnxModel) -> StatefulStreamingDecoder:
    decoder = model.stream_decoder()
    assert isinstance(decoder, StatefulStreamingDecoder)
    return decoder


class _Clock:
    """A clock that moves ``tick`` seconds each time it is read."""

    def __init__(self, tick: float) -> None:
        self.now = 0.0
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def _run(
    model: ChatTTSOnnxModel,
    hiddens: npt.NDArray[np.float32],
    settings: EarlyStart,
    tick: float,
    spy: Callable[[int, npt.NDArray[np.float32]], None] | None = None,
) -> tuple[EarlyStream, list[npt.NDArray[np.float32]], list[int]]:
    """Push every state one code at a time, then finish: the planner, its pieces, and the
    number of codes that existed when each piece came."""
    decoder = _decoder(model)
    if spy is not None:
        real = decoder.preview

        def recording(states: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
            out = real(states)
            spy(decoder.emitted, out)
            return out

        decoder.preview = recording  # type: ignore[method-assign,assignment]
    early = EarlyStream(decoder, settings, STREAM_CHUNK_CODES, clock=_Clock(tick))
    pieces, at = [], []
    for count in range(1, hiddens.shape[0] + 1):
        piece = early.push(hiddens[:count])
        if piece.size:
            pieces.append(piece)
            at.append(count)
    pieces.append(early.finish(hiddens))
    at.append(hiddens.shape[0])
    return early, pieces, at


# -- the preview ------------------------------------------------------------------------------


def test_a_preview_leaves_the_exact_stream_as_it_was(
    model: ChatTTSOnnxModel, hiddens: npt.NDArray[np.float32]
) -> None:
    whole = model.decode(hiddens)
    decoder = _decoder(model)
    pieces = []
    for count in range(5, hiddens.shape[0], 9):
        before = decoder.emitted
        preview = decoder.preview(hiddens[:count])
        # Up to the end the text would have if it ended here, from the first unsent sample.
        assert preview.size == 256 * (2 * count - 1) - before
        assert decoder.emitted == before
        pieces.append(decoder.push(hiddens[:count]))
        # The samples final by now are the exact ones in the preview too.
        final = pieces[-1].size
        assert np.abs(preview[:final] - pieces[-1]).max(initial=0.0) <= PARITY
    last = decoder.preview(hiddens)  # at the real end, the preview is the exact rest
    pieces.append(decoder.push(hiddens, final=True))
    assert np.abs(last - pieces[-1]).max() <= PARITY
    assert np.abs(np.concatenate(pieces) - whole).max() <= PARITY


def test_the_preview_is_approximate_near_its_end_and_better_with_context(
    model: ChatTTSOnnxModel, hiddens: npt.NDArray[np.float32]
) -> None:
    whole = model.decode(hiddens)
    end = 8 * SAMPLES_PER_CODE
    snrs = [snr_db(_decoder(model).preview(hiddens[: 8 + c])[:end], whole[:end]) for c in (1, 2, 4)]
    assert snrs[0] < 30 and snrs[0] < snrs[1] < snrs[2]


# -- the planner -------------------------------------------------------------------------------


def test_first_piece_after_codes_plus_context_then_exact_audio(
    model: ChatTTSOnnxModel, hiddens: npt.NDArray[np.float32]
) -> None:
    """A clock that hardly moves: playback never runs short, so after the first piece the
    planner waits for the exact decoder and crossfades into it."""
    whole = model.decode(hiddens)
    early, pieces, at = _run(model, hiddens, EARLY, tick=1e-6)
    assert at[0] == EARLY.codes + EARLY.context  # counted in codes, not time
    hold = EARLY.crossfade
    assert pieces[0].size == EARLY.codes * SAMPLES_PER_CODE - hold
    report = early.report
    assert (report.first_codes, report.previews) == (EARLY.first_codes, 1)
    assert report.stalls_s == 0.0  # the exact pieces came long before the audio ran out
    assert report.approximate == EARLY.codes * SAMPLES_PER_CODE
    # The second piece is the first exact one, as soon as its decoder reaches the held tail.
    lookahead = 9 + 6  # mel frames
    assert at[1] == -(-(report.approximate + 512 + 256 * lookahead) // 512)
    joined = np.concatenate(pieces)
    assert joined.size == whole.size
    cut = report.approximate
    assert np.abs(joined[cut:] - whole[cut:]).max() <= PARITY
    assert np.abs(early.exact - whole).max() <= PARITY
    # The held tail: the preview fading into the exact samples over the same span.
    preview = _decoder(model).preview(hiddens[: EARLY.first_codes])
    span = slice(cut - hold, cut)
    assert np.abs(joined[: cut - hold] - preview[: cut - hold]).max() <= PARITY
    assert np.abs(joined[span] - crossfade(preview[span], whole[span])).max() <= PARITY
    assert report.snr_db is not None
    assert report.snr_db == pytest.approx(snr_db(joined[:cut], whole[:cut]), abs=0.01)


def test_previews_while_playback_would_run_out(
    model: ChatTTSOnnxModel, hiddens: npt.NDArray[np.float32]
) -> None:
    """A clock that runs fast (each code takes longer than the audio it adds): a preview as
    soon as one would be as long as the first piece (every ``codes`` codes) until the exact
    decoder catches up (here: at the end), each crossfaded into the next."""
    whole = model.decode(hiddens)
    previews: list[tuple[int, npt.NDArray[np.float32]]] = []
    early, pieces, at = _run(
        model, hiddens, EARLY, tick=0.05, spy=lambda at, out: previews.append((at, out))
    )
    report = early.report
    assert report.previews == len(previews) > 10
    # Codes slower than real time: playback waited between pieces.
    assert report.stalls_s > 0.05 * EARLY.codes * (report.previews - 1) / 2
    every = range(EARLY.first_codes, hiddens.shape[0] + 1, EARLY.codes)
    assert at[: len(previews)] == list(every)[: len(previews)]
    assert all(p.size == EARLY.codes * SAMPLES_PER_CODE for p in pieces[1 : len(previews)])
    joined = np.concatenate(pieces)
    assert joined.size == whole.size
    cut = report.approximate
    assert np.abs(joined[cut:] - whole[cut:]).max() <= PARITY
    # Each piece ends where its held tail starts; the next piece begins with that tail
    # crossfaded into its own samples for the span (the next preview's, or exact ones).
    hold, start = EARLY.crossfade, 0
    for number, piece in enumerate(pieces[:-1]):
        end = start + piece.size
        if number + 1 < len(previews):
            (was_at, was), (next_at, nxt) = previews[number], previews[number + 1]
            old = was[end - was_at : end - was_at + hold]
            new = nxt[end - next_at : end - next_at + hold]
            assert np.abs(joined[end : end + hold] - crossfade(old, new)).max() <= PARITY
        start = end
    # The approximation is better than the crossfades' own error would allow if they jumped.
    assert report.snr_db is not None and report.snr_db > 10


def test_without_a_crossfade_every_sample_is_sent_once(
    model: ChatTTSOnnxModel, hiddens: npt.NDArray[np.float32]
) -> None:
    states = hiddens[:40]
    whole = model.decode(states)
    settings = EarlyStart(codes=3, context=1, crossfade=0)
    early, pieces, at = _run(model, states, settings, tick=0.03)
    assert early.report.previews > 3
    assert at[: early.report.previews] == list(range(4, 41, 3))[: early.report.previews]
    joined = np.concatenate(pieces)
    assert joined.size == whole.size
    cut = early.report.approximate
    assert np.abs(joined[cut:] - whole[cut:]).max() <= PARITY
    # Each preview piece is its preview's samples, cut where the next begins.
    previews = [_decoder(model).preview(states[:n])[: (n - 1) * SAMPLES_PER_CODE] for n in at]
    start = 0
    for piece, preview in zip(pieces[: early.report.previews], previews, strict=False):
        assert np.abs(piece - preview[start:]).max() <= PARITY
        start += piece.size


@pytest.mark.parametrize("length", [1, 3, 6, 7, 12])
def test_short_generations(
    model: ChatTTSOnnxModel, hiddens: npt.NDArray[np.float32], length: int
) -> None:
    """Ending before, at or just after the first piece: the rest is exact and nothing is lost."""
    states = hiddens[:length]
    whole = model.decode(states)
    early, pieces, _ = _run(model, states, EARLY, tick=1e-6)
    joined = np.concatenate(pieces)
    assert joined.size == whole.size
    cut = early.report.approximate
    assert (cut > 0) == (length >= EARLY.first_codes)
    assert np.abs(joined[cut:] - whole[cut:]).max(initial=0.0) <= PARITY


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="crossfade"):
        EarlyStart(codes=1, crossfade=512)
    with pytest.raises(ValueError, match="context"):
        EarlyStart(context=0)


# -- the engine --------------------------------------------------------------------------------


def _streamed(
    engine: ChatTTSOnnxEngine, options: ChatTTSOptions
) -> tuple[list[npt.NDArray[np.float32]], npt.NDArray[np.float32] | None, int | None]:
    """The chunks of a stream of ``TEXT``, what it returned, and the step count at its first
    audio."""
    chunks: list[npt.NDArray[np.float32]] = []
    steps_at_first = None
    stream = engine.synthesize_stream(TEXT, None, options)
    while True:
        try:
            chunk = next(stream)
        except StopIteration as done:
            return chunks, done.value, steps_at_first
        if chunk.size and steps_at_first is None:
            assert engine._loaded is not None  # white-box: the live step count of the loop
            steps_at_first = engine._loaded.model.times.steps
        chunks.append(chunk)


def test_engine_starts_early_and_returns_the_exact_audio(
    tiny_export: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = ChatTTSOnnxEngine(tiny_export, precision="int8", threads=1, early_start=EARLY)
    options = ChatTTSOptions(seed=5)
    # First without the silence filter (it drops samples, which would shift the positions).
    with monkeypatch.context() as patch:
        patch.setattr("tts_bridge.engines.chattts.onnx_engine.audible", lambda wave: wave)
        chunks, exact, steps_at_first = _streamed(engine, options)
        (raw,) = engine.synthesize(TEXT, None, options)
    assert steps_at_first == EARLY.first_codes
    report = engine.last_early_start
    assert report is not None and report.first_codes == EARLY.first_codes
    assert report.previews >= 1 and 0 < report.approximate < raw.size
    # The last piece is marked: every piece but the last is followed by an empty chunk.
    assert chunks[-1].size > 0
    assert all(a.size == 0 for b, a in itertools.pairwise(chunks) if b.size)
    joined = np.concatenate(chunks)
    assert joined.size == raw.size
    cut = report.approximate
    assert np.abs(joined[cut:] - raw[cut:]).max() <= PARITY
    assert exact is not None and np.abs(exact - raw).max() <= PARITY
    # With the filter: the stream ends in the exact audio's filtered tail, and the engine
    # returns the exact audio as ``synthesize`` gives it.
    chunks, exact, _ = _streamed(engine, options)
    (whole,) = engine.synthesize(TEXT, None, options)
    assert exact is not None and exact.size == whole.size
    assert np.abs(exact - whole).max() <= PARITY
    tail = audible(raw[cut:]).size
    assert np.abs(np.concatenate(chunks)[-tail:] - whole[-tail:]).max() <= PARITY
    engine.unload()


def test_exact_mode_streams_exact_pieces(tiny_export: Path) -> None:
    engine = ChatTTSOnnxEngine(tiny_export, precision="int8", threads=1, early_start=None)
    options = ChatTTSOptions(seed=5)
    stream = engine.synthesize_stream(TEXT, None, options)
    pieces = []
    try:
        while True:
            pieces.append(next(stream))
    except StopIteration as done:
        assert done.value is None  # nothing approximate: the pieces are the audio
    assert engine.last_early_start is None
    (whole,) = engine.synthesize(TEXT, None, options)
    joined = np.concatenate(pieces)
    assert joined.size == whole.size and np.abs(joined - whole).max() <= PARITY
    engine.unload()


def test_the_setting_reaches_the_engine_and_the_cache_holds_exact_audio(
    tiny_export: Path, tmp_path: Path
) -> None:
    def synthesizer(early: bool | None) -> Synthesizer:
        # Loudness off: the cache is compared with the engine's own exact audio.
        synthesis: dict[str, object] = {"onnx_threads": 1, "loudness_lufs": None}
        if early is not None:
            synthesis["chattts_early_start"] = early
        settings = load_settings(
            None,
            {
                "cache": {"dir": str(tmp_path / f"cache-{early}")},
                "models": {"dir": str(tmp_path / "models")},
                "synthesis": synthesis,
                "voices": {"door": {"engine": "chattts-onnx", "model": str(tiny_export)}},
                "default_voice": "door",
            },
            environ={},
        )
        return Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))

    for early in (False, None):  # off, and off by default
        off = synthesizer(early)
        engine = off.engines.voice("door").engine
        assert isinstance(engine, ChatTTSOnnxEngine) and engine.early_start is None
        off.cache.close()
    synth = synthesizer(True)
    try:
        voice = synth.engines.voice("door")
        engine = voice.engine
        assert isinstance(engine, ChatTTSOnnxEngine) and engine.early_start == EarlyStart()
        engine.early_start = EARLY  # one the tiny model notices
        options = synth.options_for(voice, {"seed": 4})
        parts: list[AudioPart] = []
        sentence = synth.sentence(
            voice, 0, TEXT, options, True, on_part=parts.append, streaming=True
        )
        assert engine.last_early_start is not None and engine.last_early_start.previews >= 1
        assert len(parts) >= 3 and [p.last for p in parts] == [False] * (len(parts) - 1) + [True]
        (whole,) = engine.synthesize(TEXT, voice.speaker, options)
        exact = codec.to_pcm16(whole)
        # The sentence and its cache entry are the exact audio, not the stream that went out.
        hit = synth.cache.get(synth._key(voice, TEXT, options))
        assert hit is not None
        assert np.abs(hit.pcm.astype(np.int32) - exact).max() <= 1
        assert np.array_equal(sentence.pcm, hit.pcm)
        streamed = np.concatenate([p.pcm for p in parts])
        assert streamed.size > 0
    finally:
        synth.cache.close()
