"""The Engine protocol every speech backend implements.

An engine is created cheaply (no model in memory), reports an identity that includes the hash of
its model files (the identity goes into cache keys, so a changed model never serves stale audio),
loads lazily and can be unloaded. ``synthesize`` yields float32 mono chunks at ``sample_rate``.
Engines import their runtime (onnxruntime, torch) inside ``load`` so that importing this package
never pulls in a heavy runtime.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Tier = Literal["quality", "fast"]
FloatAudio = npt.NDArray[np.float32]
FrontEnd = str
"""What an engine's phonemizer needs done to a sentence before its ``prepare_text``, declared as
an optional ``front_end`` attribute ("none" when absent); the result is also the sentence's
cache key. "numbers": numbers, units and dates spelled out in the language they are written in
(ChatTTS); "english": that in English, plus abbreviations, units without a number and Chinese
names in pinyin (an English-only phonemizer: Piper, hibari); a language code ("de"): that
language's front end (``tts_bridge.text.language``), for a voice of one language; "none": the
phonemizer reads the text itself. ``tts_bridge.text.voice.for_voice`` applies it.

An engine whose phonemizer reads inline phonemes sets an optional ``lexicon_phonemes = True``
attribute: the lexicon then gives it an entry's phonemes instead of its respelling."""


@dataclass(frozen=True)
class OptionRange:
    """The values a numeric synthesis option may take (both ends included)."""

    low: float
    high: float

    def check(self, name: str, value: object) -> None:
        """Raise ValueError naming the option and its allowed range unless ``value`` fits."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number ({self})")
        if not math.isfinite(value) or not self.low <= value <= self.high:
            raise ValueError(f"{name} {value} out of range {self}")

    def __str__(self) -> str:
        return f"{self.low:g}..{self.high:g}"


def check_option_ranges(ranges: Mapping[str, OptionRange], values: Mapping[str, object]) -> None:
    """Check the options ``values`` that ``ranges`` declares; ValueError for the first one out
    of range (the synthesizer turns it into ``invalid_options`` with the allowed range)."""
    for name, allowed in ranges.items():
        if name in values:
            allowed.check(name, values[name])


@dataclass(frozen=True)
class SynthesisOptions:
    """Per-request synthesis options that change the audio (they are part of the cache key).

    ``ranges`` declares the numeric options' allowed values; they are checked when the options
    are built, so a request asking for speed 0.005 (minutes of audio) or NaN is refused with
    ``invalid_options`` instead of being rendered. Subclasses with their own ``__post_init__``
    check their own fields.
    """

    ranges: ClassVar[Mapping[str, OptionRange]] = {"speed": OptionRange(0.25, 4.0)}

    speed: float = 1.0
    """Speaking rate; 1.0 is the model's own pace."""

    def __post_init__(self) -> None:
        check_option_ranges(self.ranges, {"speed": self.speed})

    def cache_fields(self) -> dict[str, object]:
        return {"speed": round(self.speed, 3)}


class EngineError(Exception):
    """An engine cannot load or synthesize; the message is safe to show to a user."""


class SynthesisInterruptedError(EngineError):
    """Background synthesis gave way to live work (see ``interruptible``); nothing is wrong."""


_INTERRUPT = threading.local()


@contextlib.contextmanager
def interruptible(should_stop: Callable[[], bool]) -> Iterator[None]:
    """Let engines stop the synthesis running on this thread when ``should_stop()`` is true.

    The scheduler wraps background tasks in this: a ChatTTS generation can run for tens of
    seconds, and a live request arriving meanwhile would otherwise wait for all of it. Engines
    that generate step by step call ``check_interrupt`` between steps; the check is per thread,
    so live synthesis on the worker threads is never interrupted.
    """
    previous = getattr(_INTERRUPT, "check", None)
    _INTERRUPT.check = should_stop
    try:
        yield
    finally:
        _INTERRUPT.check = previous


def interrupt_requested() -> bool:
    """True when this thread's synthesis should give way now (see ``interruptible``)."""
    check: Callable[[], bool] | None = getattr(_INTERRUPT, "check", None)
    return check is not None and check()


def check_interrupt() -> None:
    """Raise SynthesisInterruptedError if this thread's synthesis should give way now."""
    if interrupt_requested():
        raise SynthesisInterruptedError("background synthesis gave way to live work")


_STAGES = threading.local()


@dataclass
class Stages:
    """Where one sentence's synthesis time went: seconds and steps per stage."""

    seconds: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    """How often each stage ran (ChatTTS's ``codes``: the codes generated, one per step)."""


@contextlib.contextmanager
def timing_stages(into: Stages | None = None) -> Iterator[Stages]:
    """Collect the stages engines record (``record_stage``) on this thread.

    The synthesizer wraps each sentence in this and reports the stages in its metrics (ChatTTS
    ONNX: prefill, codes, decoder, vocoder); the pipeline wraps each request's work in it too,
    `into` the request's own stages. Per thread, like ``interruptible``: each worker thread
    times its own sentence. Nested, the inner one collects until it ends, then the outer again.
    """
    previous = getattr(_STAGES, "current", None)
    stages = into if into is not None else Stages()
    _STAGES.current = stages
    try:
        yield stages
    finally:
        _STAGES.current = previous


def record_stage(stage: str, seconds: float) -> None:
    """One run of ``stage`` that took ``seconds``, for the sentence timed on this thread (if
    one is)."""
    stages: Stages | None = getattr(_STAGES, "current", None)
    if stages is not None:
        stages.seconds[stage] = stages.seconds.get(stage, 0.0) + seconds
        stages.steps[stage] = stages.steps.get(stage, 0) + 1


def record_first(stage: str, seconds: float) -> None:
    """``stage`` took ``seconds``, unless it was recorded already for the sentence or request
    timed on this thread (a point of the request's first sentence, not a sum)."""
    stages: Stages | None = getattr(_STAGES, "current", None)
    if stages is not None and stage not in stages.seconds:
        stages.seconds[stage] = seconds
        stages.steps[stage] = 1


@runtime_checkable
class Engine(Protocol):
    """What the bridge needs from a speech backend."""

    name: str
    """Engine kind, e.g. 'piper' (see catalog.EngineSpec; the tier is the voice's)."""
    languages: frozenset[str]
    """Language codes this engine speaks (e.g. {'en'})."""

    @property
    def sample_rate(self) -> int: ...

    @property
    def identity(self) -> str:
        """Stable string naming the engine, model and the model files' hash."""
        ...

    @property
    def loaded(self) -> bool: ...

    def load(self) -> None: ...

    def prepare_text(self, text: str) -> str:
        """A sentence as ``synthesize`` takes it: what the engine's text front end needs
        (ChatTTS: numbers spelled out), without what it would read out wrongly."""
        ...

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        """Speak one sentence as a speaker of this engine (None = its default).

        Yields float32 mono chunks in [-1, 1]; called only from synthesis threads.
        """
        ...

    def unload(self) -> None: ...


@runtime_checkable
class BatchEngine(Protocol):
    """An engine that can speak several short texts in one call (ChatTTS ONNX): background work
    batches the sentences that each fit one of its generations.

    Methods only, not an extension of ``Engine``: ``isinstance`` checks every member, which on
    Python 3.11 evaluates properties (``identity`` hashes the model's file list).
    """

    def prepare_text(self, text: str) -> str:
        """``text`` as the engine's text front end needs it (what ``synthesize`` is given)."""
        ...

    def generations(self, text: str, options: SynthesisOptions) -> list[str]:
        """The texts a prepared ``text`` is spoken as, one per generation (none: silence)."""
        ...

    def speech_seconds(self, text: str, options: SynthesisOptions) -> float:
        """Expected seconds of speech of a prepared ``text``."""
        ...

    def synthesize_batch(
        self, texts: Sequence[str], speaker: str | None, options: SynthesisOptions
    ) -> list[FloatAudio]:
        """One clip per text, each text one generation (from ``generations``)."""
        ...
