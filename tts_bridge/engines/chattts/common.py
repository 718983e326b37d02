"""What the torch and ONNX ChatTTS engines share; no torch, no onnxruntime.

``ChatTTSEngine`` (``torch_engine``) and ``ChatTTSOnnxEngine`` (``onnx_engine``) run the same
model, so a voice must sound alike and cache alike on both: the same options (and cache
fields), text chunking, speaker statistics and model-file checks live here, with the engine
code they have in common (``ChatTTSEngineBase``). Speakers themselves are ``speaker``'s job.

A test asserts the ONNX engine never imports torch: nothing here may import torch or
onnxruntime, not even lazily.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from tts_bridge.engines.base import EngineError, FrontEnd, SynthesisOptions, Tier
from tts_bridge.engines.chattts.speaker import (
    SPK_STAT_FORMAT,
    SpeakerStats,
    sample_spk_emb,
    validate_spk_emb,
)
from tts_bridge.engines.manifests import sha256_file
from tts_bridge.text.sentences import is_speakable, split_sentences

__all__ = [
    "MAX_CHUNK_SECONDS",
    "MAX_GENERATION_SECONDS",
    "SAMPLES_PER_TOKEN",
    "SAMPLE_RATE",
    "TOKENS_PER_SECOND",
    "ChatTTSEngineBase",
    "ChatTTSOptions",
    "expected_seconds",
    "max_new_tokens",
    "read_json",
    "read_spk_stat_file",
    "spell_out",
    "split_for_generation",
    "strip_control_tags",
]

SAMPLE_RATE = 24_000
SAMPLES_PER_TOKEN = 512
"""One GPT step becomes two mel frames of hop 256 samples."""
TOKENS_PER_SECOND = SAMPLE_RATE / SAMPLES_PER_TOKEN
MAX_CHUNK_SECONDS = 25.0
"""Longest expected audio per generation: ChatTTS degrades past about 30 s."""
MAX_GENERATION_SECONDS = 30.0
"""Hard cap on one generation (max_new_token), whatever the estimate said."""

# Bracketed control tokens a request may carry through to ChatTTS; any other tag (speaker,
# speed or sequence markers such as [spk_emb], [speed_9], [Ptts]) could hijack the prompt.
_ALLOWED_TAGS = frozenset({"[uv_break]", "[v_break]", "[lbreak]", "[laugh]"})
_TAG = re.compile(r"\[[^\[\]\s]*\]")
_LETTER_HYPHEN = re.compile(r"(?<=[A-Za-z])-(?=[A-Za-z])")
_LATIN_WORD = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)?")
_PAUSE_MARK = re.compile(r"[，。、！？；：,.!?;:…]|\[(?:uv_break|v_break|lbreak)\]")
_CLAUSE_END = re.compile(r"(?<=[，、；：,;:])\s*")
_CJK_RANGES = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{_CJK_RANGES}]")
# Where an over-long clause may be cut: before any CJK character or Latin word.
_HARD_PIECE = re.compile(f"[{_CJK_RANGES}]|[^\\s{_CJK_RANGES}]+\\s*|\\s+")

# Speaking-time estimates at [speed_5], deliberately on the slow side: an overestimate only
# makes one more, shorter generation, an underestimate lets a generation run past ~30 s.
_SECONDS_PER_CJK_CHAR = 0.26
_SECONDS_PER_LATIN_WORD = 0.40
_SECONDS_PER_PAUSE = 0.25
_SECONDS_FLOOR = 0.5


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; EngineError when it is unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineError(f"{path}: unreadable: {exc}") from exc
    if not isinstance(data, dict):
        raise EngineError(f"{path}: expected a JSON object")
    return data


# -- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatTTSOptions(SynthesisOptions):
    """Per-request ChatTTS controls; every field changes the audio, so all go into the cache key.

    ``speed`` (inherited, 1.0 = the model's own pace) maps to ChatTTS's ``[speed_N]`` prompt with
    N = round(5 x speed), so 0.2..1.8 covers ``[speed_1]``..``[speed_9]``.
    """

    temperature: float = 0.3
    """Sampling temperature of the audio codes (ChatTTS's default 0.3; higher = livelier)."""
    top_P: float = 0.7  # noqa: N815 -- ChatTTS's own parameter name
    """Nucleus sampling mass of the audio codes."""
    top_K: int = 20  # noqa: N815 -- ChatTTS's own parameter name
    """Number of most likely audio codes sampled from."""
    refine_text: bool = False
    """Let ChatTTS rewrite the text first (adds pauses, fillers, laughs); slower, less literal."""
    oral_level: int | None = None
    """Refine prompt [oral_0..9]: how colloquial the refined text gets (refine_text only)."""
    laugh_level: int | None = None
    """Refine prompt [laugh_0..2]: how much laughter the refiner inserts (refine_text only)."""
    break_level: int | None = None
    """Refine prompt [break_0..7]: how many pauses the refiner inserts (refine_text only)."""
    seed: int = 0
    """Sampling seed; the same seed, text, speaker and thread count give the same audio."""

    def __post_init__(self) -> None:
        if not 0.2 <= self.speed <= 1.8:
            raise ValueError(f"speed {self.speed} out of range 0.2..1.8 ([speed_1]..[speed_9])")
        if not 0.0 < self.temperature <= 1.0:
            raise ValueError(f"temperature {self.temperature} out of range (0, 1]")
        if not 0.0 < self.top_P <= 1.0:
            raise ValueError(f"top_P {self.top_P} out of range (0, 1]")
        if not 1 <= self.top_K <= 100:
            raise ValueError(f"top_K {self.top_K} out of range 1..100")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed {self.seed} out of range 0..2**32-1")
        for name, value, top in (
            ("oral_level", self.oral_level, 9),
            ("laugh_level", self.laugh_level, 2),
            ("break_level", self.break_level, 7),
        ):
            if value is None:
                continue
            if not 0 <= value <= top:
                raise ValueError(f"{name} {value} out of range 0..{top}")
            if not self.refine_text:
                # Without the refine pass these prompts would silently do nothing.
                raise ValueError(f"{name} only has an effect with refine_text enabled")

    @property
    def speed_level(self) -> int:
        """N of ChatTTS's [speed_N] prompt (5 = normal)."""
        return math.floor(self.speed * 5 + 0.5)

    @property
    def refine_prompt(self) -> str:
        parts = (
            ("oral", self.oral_level),
            ("laugh", self.laugh_level),
            ("break", self.break_level),
        )
        return "".join(f"[{name}_{value}]" for name, value in parts if value is not None)

    def cache_fields(self) -> dict[str, object]:
        return {
            "speed": self.speed_level,
            "temperature": round(self.temperature, 4),
            "top_P": round(self.top_P, 4),
            "top_K": self.top_K,
            "refine_text": self.refine_text,
            "refine_prompt": self.refine_prompt,
            "seed": self.seed,
        }


# -- text chunking ------------------------------------------------------------------------------


def expected_seconds(text: str, speed_level: int = 5) -> float:
    """A generous estimate of how long ChatTTS takes to say ``text`` at [speed_N]."""
    base = (
        len(_CJK_CHAR.findall(text)) * _SECONDS_PER_CJK_CHAR
        + len(_LATIN_WORD.findall(text)) * _SECONDS_PER_LATIN_WORD
        + len(_PAUSE_MARK.findall(text)) * _SECONDS_PER_PAUSE
    )
    return max(base, _SECONDS_FLOOR) * 5.0 / max(speed_level, 1)


def split_for_generation(
    text: str, speed_level: int = 5, max_seconds: float = MAX_CHUNK_SECONDS
) -> list[str]:
    """Split text into pieces of at most ``max_seconds`` expected audio each.

    Whole sentences are packed together while they fit; a sentence that does not fit is cut at
    clause punctuation, and a clause that still does not fit between words (or CJK characters).
    """
    pieces: list[str] = []
    for sentence in split_sentences(text):
        pieces.extend(_fit(sentence, speed_level, max_seconds))
    return _pack(pieces, speed_level, max_seconds)


def _fit(sentence: str, speed_level: int, max_seconds: float) -> list[str]:
    if expected_seconds(sentence, speed_level) <= max_seconds:
        return [sentence]
    out: list[str] = []
    for clause in filter(None, (c.strip() for c in _CLAUSE_END.split(sentence))):
        if expected_seconds(clause, speed_level) <= max_seconds:
            out.append(clause)
            continue
        current = ""
        for piece in _HARD_PIECE.findall(clause):
            if current and expected_seconds(current + piece, speed_level) > max_seconds:
                out.append(current.strip())
                current = ""
            current += piece
        if current.strip():
            out.append(current.strip())
    return out


def _pack(pieces: list[str], speed_level: int, max_seconds: float) -> list[str]:
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        candidate = _join(current, piece)
        if current and expected_seconds(candidate, speed_level) > max_seconds:
            chunks.append(current)
            current = piece
        else:
            current = candidate
    if current:
        chunks.append(current)
    return chunks


def _join(left: str, right: str) -> str:
    if not left:
        return right
    # Latin text needs a space between pieces; CJK text must not get one.
    glue = " " if left[-1].isascii() or right[0].isascii() else ""
    return f"{left}{glue}{right}"


def max_new_tokens(expected_s: float) -> int:
    """The token budget of one generation: twice the estimate plus slack, capped at 30 s."""
    seconds = min(MAX_GENERATION_SECONDS, 2.0 * expected_s + 2.0)
    return math.ceil(seconds * TOKENS_PER_SECOND)


def spell_out(text: str) -> str:
    """Spell out numbers, times and units: ChatTTS's own normalizer deletes digits.

    Its normalizer also turns a hyphen into a comma and drops apostrophes, so a hyphen
    between letters ("twenty-one") becomes a space and "o'clock" is written apart.
    """
    from tts_bridge.text.normalize import normalize

    spoken = normalize(text)
    spoken = _LETTER_HYPHEN.sub(" ", spoken)
    return spoken.replace("o'clock", "o clock").replace("o’clock", "o clock")


def strip_control_tags(text: str) -> str:
    """Drop bracketed tags a request must not smuggle into the prompt; keep pause/laugh tags."""
    kept = _TAG.sub(lambda m: m.group(0) if m.group(0) in _ALLOWED_TAGS else " ", text)
    return " ".join(kept.split())


def read_spk_stat_file(path: Path, hidden_size: int) -> SpeakerStats:
    """Speaker statistics from ``asset/spk_stat.json`` (format in tests/support/chattts_tiny.py)."""
    data = read_json(path)
    if data.get("format") != SPK_STAT_FORMAT or data.get("version") != 1:
        raise EngineError(f"{path}: not a {SPK_STAT_FORMAT} version 1 file")
    if data.get("hidden_size") != hidden_size:
        raise EngineError(
            f"{path}: statistics for hidden size {data.get('hidden_size')}, model has {hidden_size}"
        )
    encoded = data.get("spk_stat")
    if not isinstance(encoded, str):
        raise EngineError(f"{path}: 'spk_stat' must be a base16384 string")
    return SpeakerStats.decode(encoded, hidden_size, str(path))


# -- the engines' common part -------------------------------------------------------------------

LoadedT = TypeVar("LoadedT")
"""What an engine holds while its model is loaded."""


class ChatTTSEngineBase(abc.ABC, Generic[LoadedT]):
    """What both ChatTTS engines do alike: options, speakers, verifying the model's files,
    loading under one lock, and splitting a text into generations.

    A subclass names its files and their expected hashes (``_required_files``,
    ``_expected_hashes``), reads its hidden size and speaker statistics, loads its model
    (``_load_locked``) and generates. Cheap to construct: nothing is read before it is needed.
    """

    name: str
    tier: Tier
    languages = frozenset({"zh", "en"})
    options_type = ChatTTSOptions
    front_end: FrontEnd = "numbers"

    _label: ClassVar[str]
    """The engine as error messages name it: 'ChatTTS', 'ChatTTS ONNX'."""
    _artifact: ClassVar[str]
    """What its folder holds, as in 'missing (ChatTTS checkpoint incomplete)'."""
    _unhashed_hint: ClassVar[str] = ""
    """Appended to the error for a file that has no expected hash: how to record one."""

    @staticmethod
    def prepare_text(text: str) -> str:
        return spell_out(text)

    def __init__(
        self,
        folder: Path,
        *,
        expected_sha256: Mapping[str, str] | None,
        threads: int,
        defaults: ChatTTSOptions | None,
        default_speaker: str | None,
        hasher: Callable[[Path], str] = sha256_file,
    ) -> None:
        self._folder = folder
        self._expected = dict(expected_sha256) if expected_sha256 is not None else None
        self._threads = max(1, threads)
        self._defaults = defaults or ChatTTSOptions()
        self._default_speaker = default_speaker
        self._hasher = hasher
        # One lock for the model and every generation: torch's seeded sampler is one Generator
        # per model (two generations would reseed each other), and two ONNX code loops would
        # only split the same cores (batching several texts is the way to use them).
        self._lock = threading.RLock()
        self._loaded: LoadedT | None = None

    # -- what differs ----------------------------------------------------------------------

    @abc.abstractmethod
    def _expected_hashes(self) -> dict[str, str]:
        """Relative path -> expected sha256 of the model's files."""

    @abc.abstractmethod
    def _required_files(self, expected: Mapping[str, str]) -> tuple[str, ...]:
        """Relative paths of every file the model loads (hashed into ``identity``)."""

    @abc.abstractmethod
    def _load_locked(self) -> LoadedT:
        """Verify and load the model (called under the lock)."""

    @property
    @abc.abstractmethod
    def hidden_size(self) -> int:
        """The GPT hidden size: the length of a speaker embedding."""

    @abc.abstractmethod
    def speaker_stats(self) -> SpeakerStats:
        """The model's speaker statistics (verified), without loading the model."""

    def _identity_fields(self) -> tuple[str, ...]:
        """What else tells two engines on one folder apart (the ONNX engine's precision)."""
        return ()

    # -- identity and metadata -------------------------------------------------------------

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    @functools.cached_property
    def identity(self) -> str:
        # Once per engine: it is part of every cache key (and the ONNX engine's hashes come
        # from parsing its manifest); the files it names are verified at every load.
        expected = self._expected_hashes()
        files = self._required_files(expected)
        lines = "".join(f"{rel}={expected.get(rel, '').lower()}\n" for rel in files)
        digest = hashlib.sha256(lines.encode("utf-8")).hexdigest()
        return ":".join((self.name, self._folder.name, *self._identity_fields(), digest[:16]))

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def validate_speaker(self, spk_emb: str) -> None:
        """Raise SpeakerError unless ``spk_emb`` is a well-formed speaker for this model."""
        validate_spk_emb(spk_emb, self.hidden_size)

    def sample_speaker(self, seed: int) -> str:
        """A deterministic spk_emb for ``seed`` drawn from the model's statistics (numpy's
        seeded generator, so both engines make the same speaker of a seed)."""
        return sample_spk_emb(self.speaker_stats(), seed)

    # -- load and verify -------------------------------------------------------------------

    def load(self) -> None:
        with self._lock:
            self._loaded_locked()

    def _loaded_locked(self) -> LoadedT:
        """The loaded model, loading it first if need be (call under the lock)."""
        if self._loaded is None:
            self._loaded = self._load_locked()
        return self._loaded

    def verify(self, expected: Mapping[str, str] | None = None) -> None:
        """Hash every file the model needs; EngineError names a missing or mismatching file."""
        expected = expected if expected is not None else self._expected_hashes()
        for rel in self._required_files(expected):
            self._verify_file(rel, expected)

    def _verify_file(self, rel: str, expected: Mapping[str, str]) -> None:
        path = self._folder / rel
        want = expected.get(rel)
        if want is None:
            raise EngineError(f"{path}: no expected sha256 for this file{self._unhashed_hint}")
        if not path.is_file():
            raise EngineError(f"{path}: missing ({self._label} {self._artifact} incomplete)")
        actual = self._hasher(path)
        if actual != want.lower():
            raise EngineError(
                f"{path}: sha256 mismatch: expected {want.lower()}, actual {actual}; "
                "refusing to load a modified or corrupt model file"
            )

    # -- options and text ------------------------------------------------------------------

    def _options(self, options: SynthesisOptions) -> ChatTTSOptions:
        """``options`` as ChatTTSOptions: plain SynthesisOptions take the engine's defaults
        for everything but speed."""
        if isinstance(options, ChatTTSOptions):
            return options
        try:
            return replace(self._defaults, speed=options.speed)
        except ValueError as exc:
            raise EngineError(f"ChatTTS cannot use these options: {exc}") from exc

    def generations(self, text: str, options: SynthesisOptions) -> list[str]:
        """The texts ``text`` (already through ``prepare_text``) is spoken as, one per
        generation: at most ``MAX_CHUNK_SECONDS`` of expected speech each, without control
        tags, each with a letter or digit (punctuation or emoji alone would make ChatTTS
        babble rather than stay silent)."""
        chunks = split_for_generation(strip_control_tags(text), self._options(options).speed_level)
        # Stripped again: splitting can drop the space inside a bracket pair (a stray "!]"
        # joins its sentence: "[x! !]" -> "[x!!]"), making a tag the first pass never saw.
        spoken = (strip_control_tags(chunk) for chunk in chunks)
        return [chunk for chunk in spoken if is_speakable(chunk)]

    def speech_seconds(self, text: str, options: SynthesisOptions) -> float:
        """The expected speech of ``text`` (already through ``prepare_text``) as
        ``generations`` says it: control tags are not spoken, so they do not count."""
        return expected_seconds(strip_control_tags(text), self._options(options).speed_level)
