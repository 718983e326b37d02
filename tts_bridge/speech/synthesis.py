"""Text to one WAV: split into sentences, take each from the cache or an engine, join them.

This is the one rendering path for the bridge, the `say` command and the benchmark; it knows
nothing of MQTT. It runs on synthesis threads only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tts_bridge import audio
from tts_bridge.config import Settings
from tts_bridge.engines.base import (
    BatchEngine,
    Engine,
    EngineError,
    FloatAudio,
    Stages,
    SynthesisOptions,
    timing_stages,
)
from tts_bridge.engines.registry import BackendFallbackError, EnginePool, Voice
from tts_bridge.speech.cache import CacheKey, SentenceCache
from tts_bridge.speech.chimes import ChimeError, ChimeLibrary
from tts_bridge.speech.loudness import LoudnessNormalizer, PieceLevel
from tts_bridge.speech.metrics import Metrics
from tts_bridge.speech.pronunciations import Pronunciations
from tts_bridge.speech.routing import CostEstimator
from tts_bridge.text.english import for_english_voice
from tts_bridge.text.normalize import detect_language, normalize
from tts_bridge.text.sentences import (
    clean,
    has_cjk,
    is_speakable,
    split_sentences,
)
from tts_bridge.text.ssml import Script, SsmlError, is_ssml
from tts_bridge.text.ssml import parse as parse_ssml

_LOGGER = logging.getLogger(__name__)


_SENTENCE_ENDS = (".", "!", "?", "。", "！", "？", "…")
_SSML_MARKUP_FACTOR = 4
"""An SSML document may be this many times the text limit (its markup is not spoken)."""


class RequestError(Exception):
    """A request that cannot be served; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SentenceAudio:
    """One whole sentence: joined into a message, cached, or sent on its own."""

    index: int
    text: str
    pcm: audio.Int16Audio
    cached: bool


@dataclass(frozen=True)
class AudioPart:
    """A piece of audio as soon as it is made: one message on the stream topic.

    From `Synthesizer.sentence`, `seq` counts the sentence's parts and `last` marks its final
    part; `render_plan` renumbers them into the request's stream (see `StreamNumbering`).
    """

    seq: int
    sentence: int
    """Index of the sentence the audio belongs to."""
    pcm: audio.Int16Audio
    cached: bool
    last: bool


@dataclass(frozen=True)
class StreamLayout:
    """What an answer has around and between its sentences: before each sentence its pause (the
    first sentence's is the chime and its gap, if any), after the last one the closing chime."""

    before: tuple[audio.Int16Audio, ...]
    after: audio.Int16Audio

    def join(self, pieces: Sequence[audio.Int16Audio]) -> audio.Int16Audio:
        parts: list[audio.Int16Audio] = []
        for index, pcm in enumerate(pieces):
            parts += [self.before[index], pcm]
        parts.append(self.after)
        return np.concatenate(parts) if parts else audio.silence(1, 0)


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
    pcm: audio.Int16Audio = field(default_factory=lambda: audio.silence(1, 0), repr=False)
    """The samples of `wav` (what other formats are encoded from)."""
    layout: StreamLayout | None = field(default=None, repr=False)
    """Pauses and chimes around the sentences (for `Synthesizer.sentence_parts`)."""

    @property
    def cached(self) -> bool:
        return self.cached_sentences == self.sentences


def prepare_text(text: str, max_chars: int) -> list[str]:
    """Validate and split user text; raises RequestError with a user-facing reason."""
    if not text.strip():
        raise RequestError("empty_text", "the text is empty")
    cleaned = clean(text)
    if len(cleaned) > max_chars:
        raise RequestError(
            "text_too_long", f"the text has {len(cleaned)} characters; the limit is {max_chars}"
        )
    if not cleaned or not is_speakable(cleaned):
        raise RequestError(
            "nothing_speakable", "the text has no letters or digits to speak (only symbols?)"
        )
    return [s for s in split_sentences(cleaned) if is_speakable(s)]


@dataclass(frozen=True)
class Plan:
    """A validated request: the voice asked for, the sentences and the language spoken."""

    voice: Voice
    sentences: list[str]
    language: str | None
    overrides: dict[str, object]
    """The request's own synthesis options (applied to whichever voice answers)."""
    options: SynthesisOptions
    """The options for `voice`, validated."""
    others: tuple[Voice | None, ...] = ()
    """Per sentence, the voice that speaks it instead of the rendering voice because that one
    does not speak its language (None: the rendering voice); empty when there is none."""
    chime: str | None = None
    """The chime before the speech."""
    chime_after: str | None = None
    """The chime after the speech."""
    gaps_ms: tuple[int, ...] = ()
    """Silence before each sentence and after the last (len(sentences) + 1; SSML breaks);
    empty = the configured sentence pause between sentences."""
    rates: tuple[float, ...] = ()
    """Per sentence, a factor on the speed (SSML prosody rate); empty = 1 for all."""


@dataclass(frozen=True)
class Announcement:
    """How a request is presented beyond its words: chimes (a name, "" for none, None for the
    default: the preset's, else the door's `default_chime`)."""

    chime: str | None = None
    chime_after: str | None = None
    default_chime: str | None = None
    """The say target's chime (targets.<t>.chime)."""
    default_chime_after: str | None = None
    ssml: bool | None = None
    """True: the text is SSML; False: spoken as written; None: SSML if it starts with <speak>."""


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


class Synthesizer:
    """Renders text with a voice, through the sentence cache."""

    def __init__(
        self,
        settings: Settings,
        engines: EnginePool,
        cache: SentenceCache,
        estimator: CostEstimator | None = None,
        pronunciations: Pronunciations | None = None,
    ) -> None:
        self._settings = settings
        self.pronunciations = pronunciations or Pronunciations.from_settings(settings, None)
        """The lexicon (without a state folder: the configured entries, edits not kept)."""
        self.engines = engines
        self.cache = cache
        self.estimator = estimator or CostEstimator()
        self.stats = EngineStats()
        self.metrics: Metrics | None = None
        """Where cache lookups and synthesis times are counted, when the service has metrics."""
        self.loudness = LoudnessNormalizer(
            settings.synthesis.loudness_lufs, settings.synthesis.true_peak_dbtp
        )
        self.chimes = ChimeLibrary(settings.chimes, self.loudness)
        self._recent_gain: dict[str, float] = {}
        """Per voice, the last sentence's loudness gain: what the parts of a sentence streamed
        before its end are scaled by (its own gain is known only once it is complete)."""

    def front_text(self, engine: Engine, sentence: str) -> str:
        """The sentence as the engine's phonemizer needs it (its `front_end`, see
        `tts_bridge.engines.base.FrontEnd`): what the engine is given and what its cache key
        holds, so that a changed reading renders fresh audio, and a sentence the front end
        leaves alone keeps its key."""
        # The lexicon first: a respelled name is then read like any other word, a number in a
        # respelling like any other number.
        sentence = self.pronunciations.apply(sentence, phonemes=engine.name == "piper")
        front = getattr(engine, "front_end", "none")
        order = self._settings.synthesis.date_order
        if front == "english":
            return for_english_voice(sentence, date_order=order)
        if front == "numbers":
            return normalize(sentence, date_order=order)
        return sentence

    def _key(self, voice: Voice, sentence: str, options: SynthesisOptions) -> CacheKey:
        return CacheKey(
            sentence=self.front_text(voice.engine, sentence),
            engine=voice.engine.identity,
            voice=voice.name,
            speaker=voice.speaker,
            options=tuple(sorted(options.cache_fields().items())),
            sample_rate=voice.engine.sample_rate,
            loudness=self.loudness.cache_field(),
        )

    def _normalized(self, voice: Voice, pcm: audio.Int16Audio) -> audio.Int16Audio:
        """A new sentence at the bridge's loudness (what is cached and answered)."""
        if not self.loudness.enabled or pcm.size == 0:
            return pcm
        pcm, gain = self.loudness.normalize(pcm, voice.engine.sample_rate)
        self._recent_gain[voice.name] = gain
        return pcm

    def _part_pcm(
        self, voice: Voice, level: PieceLevel, chunk: FloatAudio, *, whole: bool
    ) -> audio.Int16Audio:
        """A streamed part: the whole sentence at its own loudness, or a piece of one at the
        sentence's gain (see PieceLevel)."""
        pcm = audio.to_pcm16(chunk)
        return self._normalized(voice, pcm) if whole else level.piece(pcm)

    def _sentence_pcm(
        self, voice: Voice, level: PieceLevel, chunks: list[FloatAudio], exact: FloatAudio | None
    ) -> audio.Int16Audio:
        """A finished sentence at the bridge's loudness: what went out, when it went out in
        pieces; else the engine's audio normalized."""
        if level.used:
            self._recent_gain.setdefault(voice.name, level.gain or 0.0)
            return level.whole(audio.to_pcm16(exact) if exact is not None else None)
        chunks = [exact] if exact is not None else chunks
        raw = audio.to_pcm16(np.concatenate(chunks)) if chunks else audio.silence(1, 0)
        return self._normalized(voice, raw)

    def options_for(
        self, voice: Voice, overrides: Mapping[str, object] | None = None
    ) -> SynthesisOptions:
        """The voice's options with a request's overrides, validated by the engine's type.

        Raises RequestError('invalid_options') for an unknown option or a value out of range.
        """
        fields: dict[str, Any] = {"speed": voice.settings.speed, **voice.settings.options}
        fields.update(overrides or {})
        kind = voice.spec.options
        names = [f.name for f in dataclasses.fields(kind) if f.init]
        known = ", ".join(names)
        unknown = [name for name in fields if name not in names]
        if unknown:
            # In the bridge's words, not the dataclass's "unexpected keyword argument".
            raise RequestError(
                "invalid_options",
                f"unknown option {unknown[0]!r} for voice {voice.name}; "
                f"{voice.engine.name} options are {known}",
            )
        try:
            return kind(**fields)
        except TypeError:
            raise RequestError(
                "invalid_options", f"{voice.engine.name} options are {known}, each a number"
            ) from None
        except ValueError as exc:
            raise RequestError("invalid_options", str(exc)) from None

    def is_cached(
        self, voice: Voice, sentence: str, options: SynthesisOptions | None = None
    ) -> bool:
        key = self._key(voice, sentence, options or self.options_for(voice))
        return self.cache.contains(key)

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
        options = options or self.options_for(voice)
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
    ) -> SentenceAudio:
        """One sentence from the cache, or synthesized (and then cached).

        `on_part` sees the audio while it is made: each chunk the engine yields, once the
        engine yields anything after it or ends, with `last` on the final one; a cached
        sentence is one part. Every sentence has a last part: an empty one if the engine made
        no audio, or none after its last piece. With `on_part`, an engine's optional
        `synthesize_stream` (same arguments and chunks as `synthesize`, but yielding audio
        while it is generated, each piece followed by an empty chunk when more will follow, so
        that no piece waits for the next) is used instead of `synthesize`. A stream that starts
        with approximate audio returns the exact audio at its end (ChatTTS ONNX's early start):
        that is what the sentence is, and what is cached; the parts were sent as they came.
        """
        key = self._key(voice, text, options)
        if use_cache:
            cached = self._from_cache(voice, key, index, text)
            if cached is not None:
                if on_part is not None:
                    on_part(AudioPart(0, index, cached.pcm, cached=True, last=True))
                return cached
        try:
            # Loaded before the clock starts: the cost estimate that routes live requests, and
            # the RTF statistics, are about synthesis (a first load took 4x a sentence's time).
            self._ensure_loaded(voice.engine)
        except BackendFallbackError:
            voice = self.engines.voice(voice.name)  # now on torch: another cache key
            return self.sentence(voice, index, text, options, use_cache, on_part=on_part)
        started = time.perf_counter()
        # A sentence the engine's text preparation leaves nothing to say in ("[laugh]" for
        # Piper) is silence.
        spoken = voice.engine.prepare_text(self.front_text(voice.engine, text))
        if spoken != text:
            _LOGGER.debug("Voice %s is given %r", voice.name, spoken[:120])
        chunks: list[FloatAudio] = []
        held: FloatAudio | None = None  # the newest piece, until we know whether it is the last
        sent = 0

        level = PieceLevel(
            self.loudness, voice.engine.sample_rate, self._recent_gain.get(voice.name)
        )

        def release(chunk: FloatAudio, last: bool) -> None:
            nonlocal sent
            if on_part is not None:
                pcm = self._part_pcm(voice, level, chunk, whole=last and sent == 0)
                on_part(AudioPart(sent, index, pcm, cached=False, last=last))
            sent += 1

        # Closed explicitly: a streaming engine holds its lock between chunks, so a failure
        # here (publishing a part) must end its generation now, on this thread.
        generation = (
            self._synthesize(voice, spoken, options, stream=on_part is not None)
            if is_speakable(spoken)
            else _no_audio()
        )
        exact: FloatAudio | None = None
        try:
            with contextlib.closing(generation), timing_stages() as stages:
                while True:
                    try:
                        chunk = next(generation)
                    except StopIteration as done:
                        exact = done.value
                        break
                    chunks.append(chunk)
                    if held is not None:
                        release(held, last=False)
                        held = None
                    if chunk.size:
                        held = chunk
        except BackendFallbackError:
            # The pool moved the voice to torch (at a reload after an idle unload, before any
            # audio): another engine, so another cache key.
            voice = self.engines.voice(voice.name)
            return self.sentence(voice, index, text, options, use_cache, on_part=on_part)
        release(held if held is not None else np.zeros(0, dtype=np.float32), last=True)
        elapsed = time.perf_counter() - started
        pcm = self._sentence_pcm(voice, level, chunks, exact)
        self._account(voice, len(text), elapsed, pcm, stages)
        if pcm.size and use_cache:
            self.cache.put(key, pcm, voice.tier, voice.engine.identity)
        return SentenceAudio(index, text, pcm, cached=False)

    def _from_cache(
        self, voice: Voice, key: CacheKey, index: int, text: str
    ) -> SentenceAudio | None:
        hit = self.cache.get(key)
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
        pcm: audio.Int16Audio,
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

    def _ensure_loaded(self, engine: Engine) -> None:
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
            before = tuple(pause if i else audio.silence(1, 0) for i in range(len(pieces)))
            layout = StreamLayout(before, audio.silence(1, 0))
        numbering = StreamNumbering(parts.append, len(pieces), layout)
        for piece in pieces:
            numbering(AudioPart(0, piece.index, piece.pcm, piece.cached, last=True))
        return parts

    def _pause(self, sample_rate: int) -> audio.Int16Audio:
        return audio.silence(sample_rate, self._settings.synthesis.sentence_pause_ms)

    def validate(
        self,
        text: str,
        voice_name: str | None,
        lang: str | None,
        options: Mapping[str, object] | None = None,
        announcement: Announcement | None = None,
    ) -> Plan:
        """Check a request cheaply (no model): the voice (or preset), the text, the language,
        the options, the chimes.

        Raises UnknownVoiceError or RequestError.
        """
        announcement = announcement or Announcement()
        preset = self._settings.presets.get(voice_name) if voice_name else None
        voice = self.engines.voice(preset.voice if preset is not None else voice_name)
        if not (announcement.ssml if announcement.ssml is not None else is_ssml(text)):
            sentences = prepare_text(text, self._settings.limits.max_text_chars)
            plan = self._validate_speech(voice, sentences, lang, options)
        else:
            script = self._parse_ssml(text)
            sentences, gaps, rates = self._ssml_sentences(script)
            plan = self._validate_speech(voice, sentences, lang, options)
            plan = dataclasses.replace(plan, gaps_ms=tuple(gaps), rates=tuple(rates))
            # A chime in the SSML is the request's own, unless the request names one too.
            announcement = dataclasses.replace(
                announcement,
                chime=announcement.chime if announcement.chime is not None else script.chime,
                chime_after=(
                    announcement.chime_after
                    if announcement.chime_after is not None
                    else script.chime_after
                ),
            )
        chime, after = self._chimes_for(voice_name, announcement)
        if chime or after:
            plan = dataclasses.replace(plan, chime=chime, chime_after=after)
        return plan

    def _parse_ssml(self, text: str) -> Script:
        limit = self._settings.limits.max_text_chars
        # Markup is not speech, but a document many times the text limit is not an announcement.
        if len(text) > _SSML_MARKUP_FACTOR * limit:
            raise RequestError(
                "text_too_long",
                f"the SSML has {len(text)} characters; the limit is {_SSML_MARKUP_FACTOR * limit}",
            )
        try:
            return parse_ssml(text)
        except SsmlError as exc:
            raise RequestError("invalid_ssml", str(exc)) from None

    def _ssml_sentences(self, script: Script) -> tuple[list[str], list[int], list[float]]:
        """The sentences of an SSML script, the silence before each and after the last (ms),
        and each one's rate."""
        # The whole text is checked as plain text is (empty, too long, nothing to say).
        prepare_text(" ".join(p.text for p in script.pieces), self._settings.limits.max_text_chars)
        pause = self._settings.synthesis.sentence_pause_ms
        sentences: list[str] = []
        gaps: list[int] = []
        rates: list[float] = []
        owed: int | None = 0  # silence before the next sentence; None: the usual pause
        for piece in script.pieces:
            if piece.pause_before_ms is not None:
                owed = piece.pause_before_ms if owed is None else owed + piece.pause_before_ms
            elif piece.joined and sentences and not sentences[-1].endswith(_SENTENCE_ENDS):
                owed = 0  # a rate change inside a sentence: no pause where none is written
            for sentence in split_sentences(clean(piece.text)):
                if not is_speakable(sentence):
                    continue
                gaps.append(pause if owed is None else owed)
                sentences.append(sentence)
                rates.append(piece.rate)
                owed = None
        gaps.append(script.trailing_ms + (owed or 0))
        if sum(gaps) / 1000 > self._settings.limits.max_audio_s:
            raise RequestError(
                "invalid_ssml",
                f"the breaks add up to {sum(gaps) / 1000:.0f} s; the limit is "
                f"{self._settings.limits.max_audio_s:g} s of audio",
            )
        return sentences, gaps, rates

    def _chimes_for(
        self, voice_name: str | None, announcement: Announcement
    ) -> tuple[str | None, str | None]:
        """The request's chimes: its own, else its preset's, else its target's ("" = none)."""
        preset = self._settings.presets.get(voice_name) if voice_name else None
        chosen: list[str | None] = []
        for own, of_preset, default in (
            (announcement.chime, preset.chime if preset else None, announcement.default_chime),
            (
                announcement.chime_after,
                preset.chime_after if preset else None,
                announcement.default_chime_after,
            ),
        ):
            name = next((n for n in (own, of_preset, default) if n is not None), None)
            if name:
                try:
                    self.chimes.check(name)
                except ChimeError as exc:
                    raise RequestError(exc.code, str(exc)) from None
            chosen.append(name or None)
        return chosen[0], chosen[1]

    def _validate_speech(
        self,
        voice: Voice,
        sentences: list[str],
        lang: str | None,
        options: Mapping[str, object] | None,
    ) -> Plan:
        if lang is not None:  # asked for: the whole text, by this voice
            self._check_language(voice, lang)
            return Plan(
                voice, sentences, lang, dict(options or {}), self.options_for(voice, options)
            )
        # Each sentence's language is what most of it is: an English sentence with a Chinese name
        # is English (its voice reads the name in pinyin); a Chinese sentence goes to a voice
        # that speaks Chinese when this one does not.
        chinese = [has_cjk(s) and detect_language(s) == "zh" for s in sentences]
        others: list[Voice | None] = [None] * len(sentences)
        if any(chinese) and "zh" not in voice.engine.languages:
            other = self._voice_speaking("zh")
            if other is None:
                self._check_language(voice, "zh")  # raises: no voice here speaks Chinese
            others = [other if c else None for c in chinese]
        spoken = (
            "zh" if any(c and o is None for c, o in zip(chinese, others, strict=True)) else None
        )
        return Plan(
            voice,
            sentences,
            spoken,
            dict(options or {}),
            self.options_for(voice, options),
            tuple(others) if any(others) else (),
        )

    @staticmethod
    def _check_language(voice: Voice, lang: str) -> None:
        if lang not in voice.engine.languages:
            raise RequestError(
                "unsupported_language",
                f"voice {voice.name!r} speaks {', '.join(sorted(voice.engine.languages))}, "
                f"not {lang!r}",
            )

    def _voice_speaking(self, lang: str) -> Voice | None:
        """The first configured voice that speaks ``lang`` (the default voice first)."""
        default = self.engines.voice(None)
        if lang in default.engine.languages:
            return default
        return next((v for v in self.engines if lang in v.engine.languages), None)

    def options_for_plan(self, voice: Voice, plan: Plan) -> SynthesisOptions:
        """The options `voice` renders `plan` with: the plan's own for its voice; for the fast
        voice, the request's speed carries over, engine-only options do not."""
        if voice is plan.voice:
            return plan.options
        speed = plan.overrides.get("speed")
        return self.options_for(voice, {"speed": speed} if speed is not None else None)

    def render(
        self,
        text: str,
        voice_name: str | None = None,
        use_cache: bool = True,
        lang: str | None = None,
        on_sentence: Callable[[SentenceAudio], None] | None = None,
    ) -> Rendering:
        """Text to a complete WAV with the named voice (offline use: no tier routing)."""
        plan = self.validate(text, voice_name, lang)
        return self.render_plan(plan, plan.voice, use_cache=use_cache, on_sentence=on_sentence)

    def render_plan(
        self,
        plan: Plan,
        voice: Voice,
        *,
        tier: str | None = None,
        use_cache: bool = True,
        on_sentence: Callable[[SentenceAudio], None] | None = None,
        on_part: Callable[[AudioPart], None] | None = None,
        volume: float | None = None,
    ) -> Rendering:
        """Render a validated plan with `voice` (the plan's own voice or its fast tier).

        `on_sentence` sees each sentence once it is complete. `on_part` sees the audio as it
        is made, as the request's stream messages (`StreamNumbering`): one per sentence, or
        several for an engine that streams within a sentence; joined, they are the rendering's
        audio (`volume` aside), but for the approximate start of a stream that has one (see
        `sentence`): the rendering has the exact audio."""
        options = self.options_for_plan(voice, plan)
        sample_rate = voice.engine.sample_rate
        layout = self.layout(plan, sample_rate)
        numbering = (
            StreamNumbering(on_part, len(plan.sentences), layout) if on_part is not None else None
        )
        pieces: list[audio.Int16Audio] = []
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
                piece = self.sentence(voice, index, sentence, at_rate, use_cache, on_part=numbering)
            cached += piece.cached
            if on_sentence is not None:
                on_sentence(piece)
            pieces.append(piece.pcm)
        if not any(p.size for p in pieces):
            raise RequestError("nothing_speakable", "the voice produced no audio for this text")
        pcm = layout.join(pieces)
        if volume is not None and volume != 1.0:  # after the cache: it stores full-scale audio
            pcm = np.asarray(np.clip(np.round(pcm * volume), -32768, 32767), dtype="<i2")
        return Rendering(
            wav=audio.encode_wav(pcm, sample_rate),
            sample_rate=sample_rate,
            duration_ms=audio.duration_ms(pcm.size, sample_rate),
            voice=voice.name,
            engine=voice.engine.name,
            tier=tier or voice.tier,
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
            gaps = [audio.silence(sample_rate, ms) for ms in plan.gaps_ms]
        else:
            pause = self._pause(sample_rate)
            gaps = [audio.silence(1, 0), *([pause] * max(count - 1, 0)), audio.silence(1, 0)]
        gap = audio.silence(sample_rate, self._settings.chimes.gap_ms)
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
        options = _at_rate(
            self.options_for_plan(other, plan), plan.rates[index] if plan.rates else 1.0
        )
        piece = self.sentence(other, index, plan.sentences[index], options, use_cache)
        pcm = audio.resample(piece.pcm, other.engine.sample_rate, sample_rate)
        return dataclasses.replace(piece, pcm=pcm)

    def sentences_batch(
        self, voice: Voice, texts: list[str], options: SynthesisOptions
    ) -> list[SentenceAudio]:
        """Several sentences of one voice into the cache, the uncached ones synthesized in one
        `synthesize_batch` call when the engine is a `BatchEngine` (background work; `index`
        is the position in `texts`).

        Each is looked up and stored exactly as `sentence` does (same key, same PCM, counted
        in `stats`). A sentence the engine cannot take in one generation, and every sentence
        of an engine that does not batch, goes through `sentence` alone, after the batch.
        ChatTTS seeds a batch as a whole, so a sentence's audio depends on its batch-mates: a
        valid rendering for its key, not the one `sentence` would have made.
        The estimator is not taught from a batch: it predicts a live request, which runs alone,
        and a batch's time per character is several times lower.
        """
        engine = voice.engine
        batching = engine if isinstance(engine, BatchEngine) else None
        results: dict[int, SentenceAudio] = {}
        together: list[tuple[int, str]] = []  # (index, the text of its one generation)
        alone: list[int] = []
        for index, text in enumerate(texts):
            hit = self.cache.get(self._key(voice, text, options))
            if hit is not None and hit.sample_rate == engine.sample_rate:
                results[index] = SentenceAudio(index, text, hit.pcm, cached=True)
                continue
            if batching is None:
                alone.append(index)
                continue
            # Split as the engine's own `synthesize` splits what `sentence` gives it.
            pieces = batching.generations(
                batching.prepare_text(self.front_text(engine, text)), options
            )
            if len(pieces) > 1:
                alone.append(index)
            else:
                together.append((index, pieces[0] if pieces else ""))
        if together:
            assert batching is not None
            if self.metrics is not None:
                self.metrics.idle_batch(len(together))
            self._ensure_loaded(engine)
            started = time.perf_counter()
            try:
                clips = batching.synthesize_batch([p for _, p in together], voice.speaker, options)
            except EngineError:
                raise
            except Exception as exc:  # an engine bug must fail this work, not the bridge
                _LOGGER.exception("Engine %s failed", engine.identity)
                raise EngineError(f"{engine.name} failed: {type(exc).__name__}") from exc
            elapsed = time.perf_counter() - started
            pcms = [
                self._normalized(voice, audio.to_pcm16(clip)) if clip.size else audio.silence(1, 0)
                for clip in clips
            ]
            self.stats.add(engine.identity, elapsed, sum(p.size for p in pcms) / engine.sample_rate)
            for (index, _), pcm in zip(together, pcms, strict=True):
                if pcm.size:
                    key = self._key(voice, texts[index], options)
                    self.cache.put(key, pcm, voice.tier, engine.identity)
                results[index] = SentenceAudio(index, texts[index], pcm, cached=False)
        for index in alone:
            results[index] = self.sentence(voice, index, texts[index], options, True)
        return [results[index] for index in range(len(texts))]


def _at_rate(options: SynthesisOptions, rate: float) -> SynthesisOptions:
    """`options` with the speed times `rate`, within the engine's allowed range."""
    if rate == 1.0:
        return options
    low, high = options.ranges["speed"].low, options.ranges["speed"].high
    return dataclasses.replace(options, speed=min(max(options.speed * rate, low), high))


def _no_audio() -> Generator[FloatAudio, None, FloatAudio | None]:
    """An engine's generation of a text with nothing to say."""
    yield from ()
    return None
