"""Rendering: a validated plan -> audio, sentence by sentence from the cache or the engine, at
the bridge's loudness, with the plan's pauses and chimes around the sentences.

It knows nothing of the doors, and runs on synthesis threads only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np

from tts_bridge.audio import codec
from tts_bridge.audio.pacing import PlayClock
from tts_bridge.config import Settings
from tts_bridge.engines.base import (
    Engine,
    EngineError,
    FloatAudio,
    Stages,
    SynthesisOptions,
    record_first,
    record_stage,
    timing_stages,
)
from tts_bridge.engines.registry import BackendFallbackError, EnginePool, Voice
from tts_bridge.speech.cache import CacheKey, SentenceCache
from tts_bridge.speech.chimes import ChimeError, ChimeLibrary
from tts_bridge.speech.clauses import by_clause
from tts_bridge.speech.engine_start import engine_starting
from tts_bridge.speech.front_text import FrontText
from tts_bridge.speech.loudness import LoudnessNormalizer, PieceLevel
from tts_bridge.speech.metrics import Metrics
from tts_bridge.speech.routing import CostEstimator
from tts_bridge.speech.validation import Plan, RequestError, options_for, options_for_plan
from tts_bridge.text.sentences import is_speakable, split_clauses

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class SentenceAudio:
    """One whole sentence: joined into a message, cached, or sent on its own."""

    index: int
    text: str
    pcm: codec.Int16Audio
    cached: bool


@dataclass(frozen=True)
class AudioPart:
    """A piece of audio as soon as it is made: one message on the stream topic.

    From `Renderer.sentence`, `seq` counts the sentence's parts and `last` marks its final
    part; `render_plan` renumbers them into the request's stream (see `StreamNumbering`).
    """

    seq: int
    sentence: int
    """Index of the sentence the audio belongs to."""
    pcm: codec.Int16Audio
    cached: bool
    last: bool


@dataclass(frozen=True)
class StreamLayout:
    """What an answer has around and between its sentences: before each sentence its pause (the
    first sentence's is the chime and its gap, if any), after the last one the closing chime."""

    before: tuple[codec.Int16Audio, ...]
    after: codec.Int16Audio

    def join(self, pieces: Sequence[codec.Int16Audio]) -> codec.Int16Audio:
        parts: list[codec.Int16Audio] = []
        for index, pcm in enumerate(pieces):
            parts += [self.before[index], pcm]
        parts.append(self.after)
        return np.concatenate(parts) if parts else codec.silence(1, 0)


class StreamNumbering:
    """Parts of successive sentences -> the request's stream messages: `seq` 0, 1, 2, ... across
    the request, `last` only on the last sentence's final part, what the layout puts before a
    sentence at the start of its first part and what it puts after the last sentence at the end
    of its final part, so that the messages joined are the one-WAV answer sample for sample."""

    def __init__(
        self, on_part: Callable[[AudioPart], None], sentences: int, layout: StreamLayout
    ) -> None:
        self._on_part = on_part
        self._sentences = sentences
        self._layout = layout
        self._next = 0

    def __call__(self, part: AudioPart) -> None:
        pcm = part.pcm
        before = self._layout.before[part.sentence] if part.seq == 0 else None
        last = part.last and part.sentence == self._sentences - 1
        after = self._layout.after if last else None
        if (before is not None and before.size) or (after is not None and after.size):
            pcm = np.concatenate([x for x in (before, pcm, after) if x is not None])
        self._on_part(dataclasses.replace(part, seq=self._next, pcm=pcm, last=last))
        self._next += 1


@dataclass
class Rendering:
    """A finished message and how it was made."""

    wav: bytes
    sample_rate: int
    duration_ms: int
    voice: str
    engine: str
    tier: str
    sentences: int
    cached_sentences: int
    synth_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    sentence_voices: tuple[str, ...] = ()
    """The voice of each sentence, when some were spoken by another voice than `voice` (a
    Chinese sentence in an English voice's request); empty when `voice` spoke them all."""
    pcm: codec.Int16Audio = field(default_factory=lambda: codec.silence(1, 0), repr=False)
    """The samples of `wav` (what other formats are encoded from)."""
    layout: StreamLayout | None = field(default=None, repr=False)
    """Pauses and chimes around the sentences (for `Renderer.sentence_parts`)."""

    @property
    def cached(self) -> bool:
        return self.cached_sentences == self.sentences


class EngineStats:
    """Synthesis time and audio produced per engine identity, for RTF in health reports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}
        self._audio: dict[str, float] = {}

    def add(self, identity: str, seconds: float, audio_seconds: float) -> None:
        with self._lock:
            self._seconds[identity] = self._seconds.get(identity, 0.0) + seconds
            self._audio[identity] = self._audio.get(identity, 0.0) + audio_seconds

    def rtf(self) -> dict[str, float]:
        with self._lock:
            return {
                k: round(v / self._audio[k], 4) for k, v in self._seconds.items() if self._audio[k]
            }


@dataclass(frozen=True)
class RenderParts:
    """What a renderer renders with, shared with the rest of the synthesizer."""

    engines: EnginePool
    cache: SentenceCache
    front: FrontText
    """The sentence a voice is given, and its cache key."""
    loudness: LoudnessNormalizer
    chimes: ChimeLibrary


class Renderer:
    """Renders plans with a voice, through the sentence cache."""

    def __init__(
        self,
        settings: Settings,
        parts: RenderParts,
        *,
        estimator: CostEstimator | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self.engines = parts.engines
        self.cache = parts.cache
        self.front = parts.front
        self.loudness = parts.loudness
        self.chimes = parts.chimes
        self.estimator = estimator or CostEstimator()
        self.stats = EngineStats()
        self.metrics = metrics
        """Where cache lookups and synthesis times are counted, when the service has metrics."""
        self._recent_gain: dict[str, float] = {}
        """Per voice, the last sentence's loudness gain: what the parts of a sentence streamed
        before its end are scaled by (its own gain is known only once it is complete)."""

    def normalized(self, voice: Voice, pcm: codec.Int16Audio) -> codec.Int16Audio:
        """A new sentence at the bridge's loudness (what is cached and answered)."""
        if not self.loudness.enabled or pcm.size == 0:
            return pcm
        started = time.perf_counter()
        pcm, gain = self.loudness.normalize(pcm, voice.engine.sample_rate)
        self._recent_gain[voice.name] = gain
        record_stage("loudness", time.perf_counter() - started)
        return pcm

    def _part_pcm(
        self, voice: Voice, level: PieceLevel, chunk: FloatAudio, *, whole: bool
    ) -> codec.Int16Audio:
        """A streamed part: the whole sentence at its own loudness, or a piece of one at the
        sentence's gain (see PieceLevel)."""
        pcm = codec.to_pcm16(chunk)
        return self.normalized(voice, pcm) if whole else level.piece(pcm)

    def _sentence_pcm(
        self, voice: Voice, level: PieceLevel, chunks: list[FloatAudio], exact: FloatAudio | None
    ) -> codec.Int16Audio:
        """A finished sentence at the bridge's loudness: what went out, when it went out in
        pieces; else the engine's audio normalized."""
        if level.sent_whole is not None and exact is None:
            return level.sent_whole  # normalized once, for its part
        if level.used:
            whole = level.whole(codec.to_pcm16(exact) if exact is not None else None)
            # The next streamed sentence starts at the gain this one needed as a whole (its
            # audio is out: measuring it no longer delays anyone).
            made = exact if exact is not None else np.concatenate(chunks)
            self._recent_gain[voice.name] = self.loudness.gain_to_target(
                codec.to_pcm16(made), voice.engine.sample_rate
            )
            return whole
        chunks = [exact] if exact is not None else chunks
        raw = codec.to_pcm16(np.concatenate(chunks)) if chunks else codec.silence(1, 0)
        return self.normalized(voice, raw)

    def is_cached(
        self, voice: Voice, sentence: str, options: SynthesisOptions | None = None
    ) -> bool:
        key = self.front.key(voice, sentence, options or options_for(voice))
        return self.cache.contains(key)

    def forget(self, voice: Voice, sentence: str, options: SynthesisOptions | None = None) -> bool:
        """Remove the sentence's audio for `voice` from the cache; whether it was there."""
        return self.cache.delete(self.front.key(voice, sentence, options or options_for(voice)))

    def uncached_cost_s(
        self,
        voice: Voice,
        sentences: list[str],
        options: SynthesisOptions | None = None,
        *,
        use_cache: bool = True,
    ) -> float:
        """Estimated compute for the sentences of this voice that are not cached yet
        (all of them when the request does not use the cache)."""
        options = options or options_for(voice)
        chars = sum(
            len(s) for s in sentences if not (use_cache and self.is_cached(voice, s, options))
        )
        return self.estimator.seconds(voice.engine.name, voice.engine.identity, chars)

    def sentence(
        self,
        voice: Voice,
        index: int,
        text: str,
        options: SynthesisOptions,
        use_cache: bool,
        *,
        on_part: Callable[[AudioPart], None] | None = None,
        streaming: bool = False,
    ) -> SentenceAudio:
        """One sentence from the cache, or synthesized (and then cached).

        `on_part` sees the audio while it is made: each chunk the engine yields, once the
        engine yields anything after it or ends, with `last` on the final one; a cached
        sentence is one part. Every sentence has a last part: an empty one if the engine made
        no audio, or none after its last piece.

        `streaming` (with `on_part`: the door streams this request) makes a sentence's audio
        go out before the sentence is complete, at one gain (see PieceLevel), the sentence
        cached being the parts joined, under its own key: an engine's optional
        `synthesize_stream` (same arguments and chunks as `synthesize`, but yielding audio
        while it is generated, each piece followed by an empty chunk when more will follow, so
        that no piece waits for the next) is used instead of `synthesize`; for an engine
        without one, a long sentence is rendered clause by clause (`split_clauses`). A stream
        that starts with approximate audio returns the exact audio at its end (ChatTTS ONNX's
        early start): that is what the sentence is, and what is cached; the parts were sent as
        they came.
        """
        key = self.front.key(voice, text, options)
        if use_cache:
            cached = self._from_cache(voice, key, index, text)
            if cached is not None:
                if on_part is not None:
                    on_part(AudioPart(0, index, cached.pcm, cached=True, last=True))
                self.cache.note_lookup(key, True)  # after the audio went: a write
                return cached
            self.cache.note_lookup(key, False)
        engine_starting()
        try:
            # Loaded before the clock starts: the cost estimate that routes live requests, and
            # the RTF statistics, are about synthesis (a first load took 4x a sentence's time).
            self.ensure_loaded(voice.engine)
        except BackendFallbackError:
            voice = self.engines.voice(voice.name)  # now on torch: another cache key
            return self.sentence(
                voice, index, text, options, use_cache, on_part=on_part, streaming=streaming
            )
        started = time.perf_counter()
        # A sentence the engine's text preparation leaves nothing to say in ("[laugh]" for
        # Piper) is silence.
        spoken = voice.engine.prepare_text(self.front.text(voice.engine, text))
        record_stage("front", time.perf_counter() - started)
        if spoken != text:
            _LOGGER.debug("Voice %s is given %r", voice.name, spoken[:120])
        chunks: list[FloatAudio] = []
        sent = 0
        level = PieceLevel(
            self.loudness, voice.engine.sample_rate, self._recent_gain.get(voice.name)
        )

        def release(chunk: FloatAudio, last: bool) -> None:
            nonlocal sent
            if on_part is not None:
                pcm = self._part_pcm(voice, level, chunk, whole=last and sent == 0)
                if last and sent == 0:  # the whole sentence went at its loudness: keep it
                    level.sent_whole = pcm
                on_part(AudioPart(sent, index, pcm, cached=False, last=last))
            sent += 1

        # Closed explicitly: a streaming engine holds its lock between chunks, so a failure
        # here (publishing a part) must end its generation now, on this thread.
        streaming = streaming and on_part is not None
        clause_wise = streaming and self._settings.synthesis.stream_clauses
        pieces = split_clauses(text) if clause_wise else [text]
        if not is_speakable(spoken):
            generation = _no_audio()
        elif len(pieces) > 1 and getattr(voice.engine, "synthesize_stream", None) is None:
            generation = by_clause(
                pieces, voice.engine.sample_rate, lambda text: self._whole(voice, text, options)
            )
        else:
            generation = self._synthesize(voice, spoken, options, stream=streaming)
        try:
            exact, stages = _drive(generation, chunks, release)
        except BackendFallbackError:
            # The pool moved the voice to torch (at a reload after an idle unload, before any
            # audio): another engine, so another cache key.
            voice = self.engines.voice(voice.name)
            return self.sentence(
                voice, index, text, options, use_cache, on_part=on_part, streaming=streaming
            )
        elapsed = time.perf_counter() - started
        if level.seconds:
            record_stage("loudness", level.seconds)
        pcm = self._sentence_pcm(voice, level, chunks, exact)
        self._account(voice, len(text), elapsed, pcm, stages)
        if pcm.size and use_cache:
            self._store(voice, key, pcm)
        return SentenceAudio(index, text, pcm, cached=False)

    def _store(self, voice: Voice, key: CacheKey, pcm: codec.Int16Audio) -> None:
        """A new sentence into the cache (after its audio went to the door)."""
        writing = time.perf_counter()
        self.cache.put(key, pcm, voice.tier, voice.engine.identity)
        record_stage("cache_write", time.perf_counter() - writing)

    def _from_cache(
        self, voice: Voice, key: CacheKey, index: int, text: str
    ) -> SentenceAudio | None:
        looked = time.perf_counter()
        hit = self.cache.read(key)
        record_stage("cache_read", time.perf_counter() - looked)
        found = hit is not None and hit.sample_rate == voice.engine.sample_rate
        if self.metrics is not None:
            self.metrics.cache_lookup(found)
        if hit is None or not found:
            return None
        return SentenceAudio(index, text, hit.pcm, cached=True)

    def _account(
        self,
        voice: Voice,
        chars: int,
        elapsed: float,
        pcm: codec.Int16Audio,
        stages: Stages,
    ) -> None:
        """Teach the estimator, add to the RTF statistics and the metrics."""
        self.estimator.observe(voice.engine.name, voice.engine.identity, chars, elapsed)
        audio_seconds = pcm.size / voice.engine.sample_rate
        self.stats.add(voice.engine.identity, elapsed, audio_seconds)
        if self.metrics is not None:
            # An engine without stages of its own (Piper, hibari) is one stage: synthesis.
            if not stages.seconds:
                stages = Stages({"synthesis": elapsed}, {"synthesis": 1})
            self.metrics.synthesized(voice.name, elapsed, audio_seconds, stages)

    def _synthesize(
        self, voice: Voice, spoken: str, options: SynthesisOptions, *, stream: bool
    ) -> Generator[FloatAudio, None, FloatAudio | None]:
        """The engine's chunks, and what its stream returns (see `sentence`); whatever goes
        wrong in the engine as EngineError (an error of the caller's, between chunks, is not
        the engine's and passes unchanged)."""
        engine = voice.engine
        streaming = getattr(engine, "synthesize_stream", None) if stream else None
        synthesize = streaming or engine.synthesize
        try:
            self.engines.ensure_loaded(engine)  # normally a no-op: `sentence` loaded it
            result: FloatAudio | None = yield from synthesize(spoken, voice.speaker, options)
            return result
        except EngineError:
            raise
        except Exception as exc:  # an engine bug must fail one request, not the bridge
            _LOGGER.exception("Engine %s failed", voice.engine.identity)
            raise EngineError(f"{voice.engine.name} failed: {type(exc).__name__}") from exc

    def _whole(self, voice: Voice, text: str, options: SynthesisOptions) -> FloatAudio | None:
        """`text` said whole by the voice (None: nothing in it to say)."""
        spoken = voice.engine.prepare_text(self.front.text(voice.engine, text))
        if not is_speakable(spoken):
            return None
        generation = self._synthesize(voice, spoken, options, stream=False)
        with contextlib.closing(generation):
            audio = [chunk for chunk in generation if chunk.size]
        return np.concatenate(audio) if audio else np.zeros(0, dtype=np.float32)

    def ensure_loaded(self, engine: Engine) -> None:
        """`engines.ensure_loaded`, a failure of the engine's own code as EngineError."""
        try:
            self.engines.ensure_loaded(engine)
        except EngineError:
            raise
        except Exception as exc:  # an engine bug must fail one request, not the bridge
            _LOGGER.exception("Engine %s failed to load", engine.identity)
            raise EngineError(f"{engine.name} failed to load: {type(exc).__name__}") from exc

    def sentence_parts(
        self,
        pieces: Sequence[SentenceAudio],
        sample_rate: int,
        layout: StreamLayout | None = None,
    ) -> list[AudioPart]:
        """Whole sentences as the stream messages `render_plan` would have sent for engines
        that make each sentence in one chunk (one message per sentence); `layout` is the
        rendering's (pauses and chimes), by default the sentence pause alone."""
        parts: list[AudioPart] = []
        if layout is None:
            pause = self._pause(sample_rate)
            before = tuple(pause if i else codec.silence(1, 0) for i in range(len(pieces)))
            layout = StreamLayout(before, codec.silence(1, 0))
        numbering = StreamNumbering(parts.append, len(pieces), layout)
        for piece in pieces:
            numbering(AudioPart(0, piece.index, piece.pcm, piece.cached, last=True))
        return parts

    def _pause(self, sample_rate: int) -> codec.Int16Audio:
        return codec.silence(sample_rate, self._settings.synthesis.sentence_pause_ms)

    def render_plan(
        self,
        plan: Plan,
        voice: Voice,
        *,
        use_cache: bool = True,
        on_sentence: Callable[[SentenceAudio], None] | None = None,
        on_part: Callable[[AudioPart], None] | None = None,
        volume: float | None = None,
        streaming: bool = False,
    ) -> Rendering:
        """Render a validated plan with `voice` (the plan's own voice or its fast tier).

        `on_sentence` sees each sentence once it is complete. `on_part` sees the audio as it
        is made, as the request's stream messages (`StreamNumbering`): one per sentence, or,
        with `streaming`, several for a sentence made in pieces (see `sentence`: the first
        sentence, and a later one only when the audio before it would end before it is made
        whole, at the voice's estimated speed); joined, they
        are the rendering's audio (`volume` aside), but for the approximate start of a stream
        that has one (see `sentence`): the rendering has the exact audio."""
        options = options_for_plan(voice, plan)
        sample_rate = voice.engine.sample_rate
        layout = self.layout(plan, sample_rate)
        playing = PlayClock()
        numbering = None
        if on_part is not None:
            handed = playing.counting(on_part, lambda part: part.pcm.size / sample_rate)
            numbering = StreamNumbering(handed, len(plan.sentences), layout)
        pieces: list[codec.Int16Audio] = []
        cached = 0
        started = time.perf_counter()
        for index, sentence in enumerate(plan.sentences):
            other = plan.others[index] if plan.others else None
            if other is not None and other is not voice:
                piece = self._sentence_by(
                    other, plan, index, sample_rate=sample_rate, use_cache=use_cache
                )
                if numbering is not None:
                    numbering(AudioPart(0, index, piece.pcm, piece.cached, last=True))
            else:
                at_rate = _at_rate(options, plan.rates[index] if plan.rates else 1.0)
                # In pieces only if the audio before it would end before it is made whole:
                # pieces cost work (Piper's window margins) and intelligibility (clauses).
                in_pieces = streaming and playing.budget_s() < self.estimator.seconds(
                    voice.engine.name, voice.engine.identity, len(sentence)
                )
                piece = self.sentence(
                    voice,
                    index,
                    sentence,
                    at_rate,
                    use_cache,
                    on_part=numbering,
                    streaming=in_pieces,
                )
            cached += piece.cached
            if on_sentence is not None:
                on_sentence(piece)
            pieces.append(piece.pcm)
        if not any(p.size for p in pieces):
            raise RequestError("nothing_speakable", "the voice produced no audio for this text")
        pcm = layout.join(pieces)
        if volume is not None and volume != 1.0:  # after the cache: it stores full-scale audio
            pcm = np.asarray(np.clip(np.round(pcm * volume), -32768, 32767), dtype="<i2")
        encoding = time.perf_counter()
        wav = codec.encode_wav(pcm, sample_rate)
        record_stage("encode", time.perf_counter() - encoding)
        return Rendering(
            wav=wav,
            sample_rate=sample_rate,
            duration_ms=codec.duration_ms(pcm.size, sample_rate),
            voice=voice.name,
            engine=voice.engine.name,
            tier=voice.tier,
            sentences=len(plan.sentences),
            cached_sentences=cached,
            synth_seconds=time.perf_counter() - started,
            sentence_voices=tuple((o or voice).name for o in plan.others),
            pcm=pcm,
            layout=layout,
        )

    def layout(self, plan: Plan, sample_rate: int) -> StreamLayout:
        """The plan's pauses and chimes at `sample_rate` (raises RequestError for a chime file
        that does not decode)."""
        count = len(plan.sentences)
        if plan.gaps_ms:
            gaps = [codec.silence(sample_rate, ms) for ms in plan.gaps_ms]
        else:
            pause = self._pause(sample_rate)
            gaps = [codec.silence(1, 0), *([pause] * max(count - 1, 0)), codec.silence(1, 0)]
        gap = codec.silence(sample_rate, self._settings.chimes.gap_ms)
        try:
            if plan.chime:
                gaps[0] = np.concatenate([self.chimes.pcm(plan.chime, sample_rate), gap, gaps[0]])
            if plan.chime_after:
                after = self.chimes.pcm(plan.chime_after, sample_rate)
                gaps[-1] = np.concatenate([gaps[-1], gap, after])
        except ChimeError as exc:
            raise RequestError(exc.code, str(exc)) from None
        return StreamLayout(tuple(gaps[:count]), gaps[count])

    def _sentence_by(
        self, other: Voice, plan: Plan, index: int, *, sample_rate: int, use_cache: bool
    ) -> SentenceAudio:
        """A sentence spoken by another voice than the request's, at the request's rate (one
        part when streamed: resampled whole, so the stream joins to the one-WAV answer)."""
        options = _at_rate(options_for_plan(other, plan), plan.rates[index] if plan.rates else 1.0)
        piece = self.sentence(other, index, plan.sentences[index], options, use_cache)
        pcm = codec.resample(piece.pcm, other.engine.sample_rate, sample_rate)
        return dataclasses.replace(piece, pcm=pcm)


def _at_rate(options: SynthesisOptions, rate: float) -> SynthesisOptions:
    """`options` with the speed times `rate`, within the engine's allowed range."""
    if rate == 1.0:
        return options
    low, high = options.ranges["speed"].low, options.ranges["speed"].high
    return dataclasses.replace(options, speed=min(max(options.speed * rate, low), high))


def _drive(
    generation: Generator[FloatAudio, None, FloatAudio | None],
    chunks: list[FloatAudio],
    release: Callable[[FloatAudio, bool], None],
) -> tuple[FloatAudio | None, Stages]:
    """Run an engine's generation to its end: each chunk into `chunks`, and to `release` once
    the engine yields anything after it or ends (`last` on the final one, an empty one if no
    audio came). Returns what the stream returns and the engine's own stages; the time spent
    in the engine alone goes to the request's `engine` stage."""
    held: FloatAudio | None = None  # the newest piece, until we know whether it is the last
    engine_s = 0.0  # in the engine's generation only, not in what is done with its parts
    first_s: float | None = None  # engine_s when its first piece was released
    exact: FloatAudio | None = None
    with contextlib.closing(generation), timing_stages() as stages:
        while True:
            asked = time.perf_counter()
            try:
                chunk = next(generation)
            except StopIteration as done:
                exact = done.value
                break
            finally:
                engine_s += time.perf_counter() - asked
            chunks.append(chunk)
            if held is not None:
                first_s = engine_s if first_s is None else first_s
                release(held, False)
                held = None
            if chunk.size:
                held = chunk
    record_stage("engine", engine_s)  # out of the sentence's own stages, into the request's
    record_first("engine_first", engine_s if first_s is None else first_s)
    release(held if held is not None else np.zeros(0, dtype=np.float32), True)
    return exact, stages


def _no_audio() -> Generator[FloatAudio, None, FloatAudio | None]:
    """An engine's generation of a text with nothing to say."""
    yield from ()
    return None
