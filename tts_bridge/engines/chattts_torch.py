"""ChatTTS (torch) engine: the quality tier, zh and en at 24 kHz.

Weights are read from a local folder in ChatTTS's asset layout and verified before ChatTTS sees
them: the official release against ChatTTS's own ``ChatTTS/res/sha256_map.json``, any other
checkpoint against the expected hashes the caller passes (the project's model manifest). ChatTTS's
``Config`` (GPT, decoder and vocoder sizes, speaker statistics) is derived from the checkpoint's
own files, so a fine-tune, the official weights and the tests' tiny random checkpoint all load
through the same code.

Nothing here imports torch at module level: ``import tts_bridge.engines.chattts_torch`` stays
cheap, and the helpers that only look at strings and file headers (``validate_spk_emb``,
``read_checkpoint``, ``split_for_generation``) work without torch.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import hashlib
import importlib
import importlib.util
import json
import logging
import lzma
import math
import re
import struct
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tts_bridge.engines.base import (
    EngineError,
    FloatAudio,
    SynthesisOptions,
    Tier,
    check_interrupt,
    interrupt_requested,
)
from tts_bridge.models import sha256_file
from tts_bridge.text.sentences import is_speakable, split_sentences
from tts_bridge.textlog import short

_LOGGER = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
SAMPLES_PER_TOKEN = 512
"""One GPT step becomes two mel frames of hop 256 samples."""
TOKENS_PER_SECOND = SAMPLE_RATE / SAMPLES_PER_TOKEN
MAX_CHUNK_SECONDS = 25.0
"""Longest expected audio per generation: ChatTTS degrades past about 30 s."""
MAX_GENERATION_SECONDS = 30.0
"""Hard cap on one generation (max_new_token), whatever the estimate said."""
DEFAULT_SPEAKER_SEED = 0
"""The voice used when a request names no speaker: stable across sentences and restarts."""

# ChatTTS 0.2.5 hard-wires these: the EOS code is num_audio_tokens - 1 = 625 = 5**4, the size of
# the DVAE quantizer's codebook, and its DVAE and decoder always produce 100 mel channels.
NUM_VQ = 4
NUM_AUDIO_TOKENS = 626
N_MELS = 100
HOP_LENGTH = 256

# The files ChatTTS.load(source="custom") checks, relative to the checkpoint folder.
CHECKPOINT_FILES: tuple[str, ...] = (
    "asset/Decoder.safetensors",
    "asset/DVAE.safetensors",
    "asset/Embed.safetensors",
    "asset/Vocos.safetensors",
    "asset/gpt/config.json",
    "asset/gpt/model.safetensors",
    "asset/tokenizer/special_tokens_map.json",
    "asset/tokenizer/tokenizer_config.json",
    "asset/tokenizer/tokenizer.json",
)
SPK_STAT_FILE = "asset/spk_stat.json"
"""Speaker statistics of a non-official checkpoint (the official ones are built into ChatTTS)."""
SPK_STAT_FORMAT = "chattts-spk-stat"

# ChatTTS compresses speaker embeddings with exactly these settings (ChatTTS/model/speaker.py).
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
_MAX_SPK_EMB_CHARS = 65_536
_MAX_SAFETENSORS_HEADER = 64 << 20

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


# -- speaker embeddings ---------------------------------------------------------------------------


class SpeakerError(EngineError, ValueError):
    """A malformed spk_emb string. A ValueError too, so config validators report it as such."""


@dataclass(frozen=True)
class SpeakerStats:
    """Per-dimension std and mean of a checkpoint's speaker embeddings (float16, like ChatTTS)."""

    std: npt.NDArray[np.float16]
    mean: npt.NDArray[np.float16]

    @property
    def hidden_size(self) -> int:
        return int(self.std.size)

    @classmethod
    def decode(cls, encoded: str, hidden_size: int, source: str) -> SpeakerStats:
        """Decode ChatTTS's spk_stat string: base16384 of float16 [std..., mean...]."""
        b14 = _pybase16384()
        values = np.frombuffer(b14.decode_from_string(encoded), dtype=np.float16)
        if values.size != 2 * hidden_size:
            raise EngineError(
                f"{source}: speaker statistics hold {values.size} values, "
                f"need {2 * hidden_size} (std and mean of hidden size {hidden_size})"
            )
        std, mean = values[:hidden_size].copy(), values[hidden_size:].copy()
        if not (np.isfinite(values).all() and (std > 0).all()):
            raise EngineError(f"{source}: speaker statistics must be finite with std > 0")
        return cls(std=std, mean=mean)


def encode_spk_emb(embedding: npt.NDArray[np.float16]) -> str:
    """Encode a speaker embedding exactly as ChatTTS's Speaker._encode does."""
    b14 = _pybase16384()
    data = np.ascontiguousarray(embedding, dtype=np.float16).tobytes()
    packed = lzma.compress(data, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    encoded: str = b14.encode_to_string(packed)
    return encoded


def decode_spk_emb(spk_emb: str, hidden_size: int | None = None) -> npt.NDArray[np.float16]:
    """Decode a spk_emb string as ChatTTS does (base16384, raw LZMA2, float16); see validate."""
    if not isinstance(spk_emb, str) or not spk_emb.strip():
        raise SpeakerError("spk_emb is empty")
    if len(spk_emb) > _MAX_SPK_EMB_CHARS:
        raise SpeakerError(f"spk_emb is {len(spk_emb)} characters long; that is no speaker")
    b14 = _pybase16384()
    try:
        packed = b14.decode_from_string(spk_emb.strip())
    except (ValueError, TypeError) as exc:
        raise SpeakerError(f"spk_emb is not base16384 text: {exc}") from exc
    # Bounded: a crafted string must not inflate to gigabytes.
    limit = 2 * hidden_size + 1 if hidden_size is not None else _MAX_SPK_EMB_CHARS * 4
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    try:
        data = decompressor.decompress(packed, max_length=limit)
    except lzma.LZMAError as exc:
        raise SpeakerError(f"spk_emb does not decompress ({exc}); it is damaged") from exc
    if len(data) % 2 or not data:
        raise SpeakerError(f"spk_emb decodes to {len(data)} bytes, not float16 values")
    return np.frombuffer(data, dtype=np.float16).copy()


def validate_spk_emb(spk_emb: str, hidden_size: int | None = None) -> None:
    """Reject a malformed spk_emb string cheaply (no torch); raises SpeakerError.

    ``hidden_size`` (the GPT hidden size, 768 for the official model) is checked when known.
    A one-character change can still decode to a valid, different voice; the voices file keeps
    a hash beside each embedding for that.
    """
    values = decode_spk_emb(spk_emb, hidden_size)
    if hidden_size is not None and values.size != hidden_size:
        raise SpeakerError(f"spk_emb has {values.size} values, this checkpoint needs {hidden_size}")
    if not np.isfinite(values).all():
        raise SpeakerError("spk_emb contains NaN or infinite values")
    if not values.any():
        raise SpeakerError("spk_emb is all zeros")


def sample_spk_emb(stats: SpeakerStats, seed: int) -> str:
    """A deterministic speaker for ``seed``: N(0, 1) x std + mean, as ChatTTS samples them.

    numpy's seeded generator is used rather than torch's, so a voice can be made without torch
    and the global torch RNG is never touched.
    """
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal(stats.hidden_size, dtype=np.float32)
    embedding = normal * stats.std.astype(np.float32) + stats.mean.astype(np.float32)
    return encode_spk_emb(embedding.astype(np.float16))


def _pybase16384() -> Any:
    try:
        # An untyped C extension; importlib keeps mypy from asking for stubs it has none of.
        return importlib.import_module("pybase16384")
    except ImportError as exc:
        raise EngineError(
            "ChatTTS speaker embeddings need the 'chattts' extra (pybase16384 is missing)"
        ) from exc


# -- checkpoint inspection (no torch) ---------------------------------------------------------


@dataclass(frozen=True)
class ConvStackDims:
    """Sizes of one ChatTTS DVAEDecoder stack (also used as the DVAE encoder)."""

    idim: int
    odim: int
    hidden: int
    n_layer: int
    bn_dim: int


@dataclass(frozen=True)
class CheckpointDims:
    """Everything ChatTTS's Config needs, read from a checkpoint's config.json and tensor shapes."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_hidden_layers: int
    max_position_embeddings: int
    spk_emb_dim: int
    num_text_tokens: int
    num_audio_tokens: int
    num_vq: int
    decoder: ConvStackDims
    dvae_encoder: ConvStackDims
    dvae_decoder: ConvStackDims
    dvae_vq_dim: int
    dvae_vq_groups: int
    dvae_vq_levels: int
    vocos_dim: int
    vocos_intermediate_dim: int
    vocos_layers: int
    vocos_head_n_fft: int
    vocos_mel_n_fft: int
    n_mels: int


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from a safetensors header (reads only the header, no torch)."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise EngineError(f"{path} is not a safetensors file (too short)")
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_SAFETENSORS_HEADER:
                raise EngineError(f"{path} is not a safetensors file (header {length} bytes)")
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as exc:
        raise EngineError(f"{path}: unreadable safetensors header: {exc}") from exc
    return {
        name: tuple(int(n) for n in entry["shape"])
        for name, entry in header.items()
        if name != "__metadata__"
    }


def read_checkpoint(folder: Path) -> CheckpointDims:
    """Derive ChatTTS's model sizes from a checkpoint folder; EngineError names what is wrong."""
    asset = folder / "asset"
    gpt = _read_json(asset / "gpt" / "config.json")
    embed = safetensors_shapes(asset / "Embed.safetensors")
    decoder = safetensors_shapes(asset / "Decoder.safetensors")
    dvae = safetensors_shapes(asset / "DVAE.safetensors")
    vocos = safetensors_shapes(asset / "Vocos.safetensors")

    try:
        hidden = int(gpt["hidden_size"])
        dims_gpt = {
            "intermediate_size": int(gpt["intermediate_size"]),
            "num_attention_heads": int(gpt["num_attention_heads"]),
            "num_hidden_layers": int(gpt["num_hidden_layers"]),
            "max_position_embeddings": int(gpt.get("max_position_embeddings", 4096)),
            "spk_emb_dim": int(gpt.get("spk_emb_dim") or 192),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"{asset / 'gpt' / 'config.json'}: missing or bad field {exc}") from exc

    where = asset / "Embed.safetensors"
    text_shape = _shape(embed, "emb_text.weight", where)
    codebooks = sorted(k for k in embed if re.fullmatch(r"emb_code\.\d+\.weight", k))
    if not codebooks:
        raise EngineError(f"{where}: no emb_code.N.weight tensors")
    code_shape = _shape(embed, codebooks[0], where)
    if text_shape[1] != hidden or code_shape[1] != hidden:
        raise EngineError(
            f"{where}: embedding width {text_shape[1]} does not match GPT hidden size {hidden}"
        )
    if len(codebooks) != NUM_VQ or code_shape[0] != NUM_AUDIO_TOKENS:
        raise EngineError(
            f"{where}: {len(codebooks)} codebooks of {code_shape[0]} codes; ChatTTS needs "
            f"{NUM_VQ} codebooks of {NUM_AUDIO_TOKENS} (its DVAE and EOS code are fixed)"
        )

    decoder_dims = _conv_stack(decoder, "decoder.", asset / "Decoder.safetensors")
    if hidden % 2 or decoder_dims.idim != hidden // 2:
        raise EngineError(
            f"{asset / 'Decoder.safetensors'}: decoder input {decoder_dims.idim} must be half "
            f"the GPT hidden size {hidden} (each hidden state becomes two mel frames)"
        )
    dvae_path = asset / "DVAE.safetensors"
    projections = sorted(
        k for k in dvae if re.fullmatch(r"vq_layer\.quantizer\.rvqs\.\d+\.project_in\.weight", k)
    )
    if not projections:
        raise EngineError(f"{dvae_path}: no vq_layer.quantizer.rvqs.N.project_in.weight tensors")
    levels, per_group = _shape(dvae, projections[0], dvae_path)

    vocos_path = asset / "Vocos.safetensors"
    embed_shape = _shape(vocos, "backbone.embed.weight", vocos_path)
    fb_shape = _shape(vocos, "feature_extractor.mel_spec.mel_scale.fb", vocos_path)
    for path, shapes, key in (
        (asset / "Decoder.safetensors", decoder, "out_conv.weight"),
        (dvae_path, dvae, "out_conv.weight"),
    ):
        if _shape(shapes, key, path)[0] != N_MELS:
            raise EngineError(f"{path}: {key} must produce {N_MELS} mel channels")
    if embed_shape[1] != N_MELS or fb_shape[1] != N_MELS:
        raise EngineError(f"{vocos_path}: the vocoder must take {N_MELS} mel channels")

    return CheckpointDims(
        hidden_size=hidden,
        **dims_gpt,
        num_text_tokens=text_shape[0],
        num_audio_tokens=code_shape[0],
        num_vq=len(codebooks),
        decoder=decoder_dims,
        dvae_encoder=_conv_stack(dvae, "encoder.", dvae_path),
        dvae_decoder=_conv_stack(dvae, "decoder.", dvae_path),
        dvae_vq_dim=per_group * len(projections),
        dvae_vq_groups=len(projections),
        dvae_vq_levels=levels,
        vocos_dim=embed_shape[0],
        vocos_intermediate_dim=_shape(vocos, "backbone.convnext.0.pwconv1.weight", vocos_path)[0],
        vocos_layers=_count_blocks(vocos, "backbone.convnext."),
        vocos_head_n_fft=_shape(vocos, "head.out.weight", vocos_path)[0] - 2,
        vocos_mel_n_fft=_shape(vocos, "feature_extractor.mel_spec.spectrogram.window", vocos_path)[
            0
        ],
        n_mels=N_MELS,
    )


def _conv_stack(shapes: Mapping[str, tuple[int, ...]], prefix: str, path: Path) -> ConvStackDims:
    conv_in = _shape(shapes, f"{prefix}conv_in.0.weight", path)
    return ConvStackDims(
        idim=conv_in[1],
        odim=_shape(shapes, f"{prefix}conv_out.weight", path)[0],
        hidden=_shape(shapes, f"{prefix}conv_in.2.weight", path)[0],
        n_layer=_count_blocks(shapes, f"{prefix}decoder_block."),
        bn_dim=conv_in[0],
    )


def _count_blocks(shapes: Mapping[str, tuple[int, ...]], prefix: str) -> int:
    indices = {k[len(prefix) :].split(".", 1)[0] for k in shapes if k.startswith(prefix)}
    return len(indices)


def _shape(shapes: Mapping[str, tuple[int, ...]], key: str, path: Path) -> tuple[int, ...]:
    try:
        return shapes[key]
    except KeyError:
        raise EngineError(f"{path}: tensor {key} is missing; not a ChatTTS checkpoint?") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineError(f"{path}: unreadable: {exc}") from exc
    if not isinstance(data, dict):
        raise EngineError(f"{path}: expected a JSON object")
    return data


def official_sha256() -> dict[str, str]:
    """ChatTTS's own hashes of its official files, keyed by path relative to the checkpoint.

    Read from the installed package's data file without importing ChatTTS (which imports torch).
    """
    spec = importlib.util.find_spec("ChatTTS")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("the ChatTTS package is not installed (install the 'chattts' extra)")
    package = Path(next(iter(spec.submodule_search_locations)))
    raw = _read_json(package / "res" / "sha256_map.json")
    return {rel: str(raw[_sha256_map_key(rel)]) for rel in CHECKPOINT_FILES}


def _matches_official(expected: Mapping[str, str]) -> bool:
    try:
        official = official_sha256()
    except EngineError:
        return False  # without ChatTTS installed nothing loads, but identity still works
    return all(expected.get(rel, "").lower() == official[rel] for rel in CHECKPOINT_FILES)


def _import_chattts() -> Any:
    """Import ChatTTS (and with it torch and transformers) with model hubs switched off."""
    import os

    # Belt and braces: nothing may fetch weights at run time. transformers and huggingface_hub
    # read this once, when they are first imported.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ChatTTS

    return ChatTTS


def _sha256_map_key(rel: str) -> str:
    """ChatTTS's key for a file: 'asset/gpt/config.json' -> 'sha256_asset_gpt_config_json'."""
    return "sha256_" + rel.replace("/", "_").replace(".", "_")


def read_spk_stat_file(path: Path, hidden_size: int) -> SpeakerStats:
    """Speaker statistics from ``asset/spk_stat.json`` (format in tests/chattts_tiny.py)."""
    data = _read_json(path)
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


# -- the engine ---------------------------------------------------------------------------------


@dataclass
class _Loaded:
    """What exists only while the model is loaded."""

    chat: Any
    dims: CheckpointDims
    stats: SpeakerStats
    default_speaker: str


class ChatTTSEngine:
    """ChatTTS on torch for one local checkpoint folder. Cheap to construct; loads on first use.

    ``expected_sha256`` maps each file's path relative to ``checkpoint`` (``asset/gpt/config.json``
    ...) to its hex SHA-256; None means the official release, checked against ChatTTS's own
    hashes. A checkpoint other than the official one also needs ``asset/spk_stat.json``, covered
    by the mapping. ``hasher`` defaults to a streamed SHA-256; a caching hasher may be passed.
    """

    name = "chattts"
    tier: Tier = "quality"
    languages = frozenset({"zh", "en"})
    options_type = ChatTTSOptions

    @staticmethod
    def prepare_text(text: str) -> str:
        return spell_out(text)

    def __init__(
        self,
        checkpoint: Path,
        *,
        expected_sha256: Mapping[str, str] | None = None,
        threads: int = 1,
        device: str = "cpu",
        defaults: ChatTTSOptions | None = None,
        default_speaker: str | None = None,
        hasher: Callable[[Path], str] = sha256_file,
    ) -> None:
        self._folder = checkpoint
        self._expected = dict(expected_sha256) if expected_sha256 is not None else None
        self._threads = max(1, threads)
        self._device = device
        self._defaults = defaults or ChatTTSOptions()
        self._default_speaker = default_speaker
        self._hasher = hasher
        # One lock for the model and every generation: ChatTTS's seeded sampler is a single
        # torch.Generator per model, so two concurrent generations would reseed each other.
        self._lock = threading.RLock()
        self._loaded: _Loaded | None = None
        self._hidden_size: int | None = None

    # -- identity and metadata -------------------------------------------------------------

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    @functools.cached_property
    def identity(self) -> str:
        # Once per engine: it is part of every cache key.
        expected = self._expected_hashes()
        files = self._required_files(expected)
        lines = "".join(f"{rel}={expected.get(rel, '').lower()}\n" for rel in files)
        digest = hashlib.sha256(lines.encode("utf-8")).hexdigest()
        return f"chattts:{self._folder.name}:{digest[:16]}"

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    @property
    def is_official(self) -> bool:
        """True when the expected hashes are those of ChatTTS's official release."""
        return _matches_official(self._expected_hashes())

    @property
    def hidden_size(self) -> int:
        """The GPT hidden size (the length of a speaker embedding), from config.json."""
        if self._hidden_size is None:
            config = _read_json(self._folder / "asset" / "gpt" / "config.json")
            try:
                self._hidden_size = int(config["hidden_size"])
            except (KeyError, TypeError, ValueError) as exc:
                raise EngineError(f"{self._folder}: config.json has no hidden_size") from exc
        return self._hidden_size

    def validate_speaker(self, spk_emb: str) -> None:
        """Raise SpeakerError unless ``spk_emb`` is a well-formed speaker for this checkpoint."""
        validate_spk_emb(spk_emb, self.hidden_size)

    def speaker_stats(self) -> SpeakerStats:
        """The checkpoint's speaker statistics (verified), without loading the model."""
        loaded = self._loaded
        if loaded is not None:
            return loaded.stats
        return self._read_stats(self.hidden_size, self.is_official, verify=True)

    def sample_speaker(self, seed: int) -> str:
        """A deterministic spk_emb for ``seed`` drawn from this checkpoint's statistics."""
        return sample_spk_emb(self.speaker_stats(), seed)

    # -- load / unload ---------------------------------------------------------------------

    def load(self) -> None:
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load_locked()

    def _load_locked(self) -> _Loaded:
        import time

        started = time.monotonic()
        expected = self._expected_hashes()
        official = self.is_official
        self.verify(expected)
        dims = read_checkpoint(self._folder)
        stats = self._read_stats(dims.hidden_size, official, verify=False)

        chattts = _import_chattts()
        import torch

        torch.set_num_threads(self._threads)
        chat = chattts.Chat(logging.getLogger(f"{__name__}.chattts"))
        chat.config = chattts_config(dims, _encode_stats(stats))
        # source="custom" re-checks the files against this map and never downloads or renames
        # (source="local" would move a mismatching file to .bak and fetch a replacement). The
        # map holds the hashes verified above, in ChatTTS's key format.
        chat.sha256_map = {_sha256_map_key(rel): expected[rel].lower() for rel in CHECKPOINT_FILES}
        try:
            ok = chat.load(
                source="custom",
                custom_path=str(self._folder),
                device=torch.device(self._device),
                compile=False,
            )
        except (RuntimeError, ValueError, KeyError, TypeError, OSError, AssertionError) as exc:
            raise EngineError(f"ChatTTS could not load {self._folder}: {exc}") from exc
        if not ok:
            raise EngineError(f"ChatTTS refused to load {self._folder}; see its log above")
        # ChatTTS's GPT loop polls chat.context between steps (Chat.interrupt sets it): ours
        # asks the calling thread's interrupt check, so background work gives way to live work.
        chat.context = _InterruptFlag()
        # Compile the text normalizer's numba kernels now, not inside the first request.
        chat.normalizer("warm up 预热", True, True, None)
        default_speaker = self._default_speaker or sample_spk_emb(stats, DEFAULT_SPEAKER_SEED)
        validate_spk_emb(default_speaker, dims.hidden_size)
        _LOGGER.info(
            "Loaded ChatTTS %s (%s, hidden %d x %d layers, %d threads) in %.1f s",
            self._folder,
            "official weights" if official else "custom checkpoint",
            dims.hidden_size,
            dims.num_hidden_layers,
            self._threads,
            time.monotonic() - started,
        )
        return _Loaded(chat, dims, stats, default_speaker)

    def verify(self, expected: Mapping[str, str] | None = None) -> None:
        """Hash every file the model needs; EngineError names a missing or mismatching file."""
        expected = expected if expected is not None else self._expected_hashes()
        for rel in self._required_files(expected):
            self._verify_file(rel, expected)

    def _verify_file(self, rel: str, expected: Mapping[str, str]) -> None:
        path = self._folder / rel
        want = expected.get(rel)
        if want is None:
            raise EngineError(
                f"{path}: no expected sha256 for this file; record the model in the "
                "manifest first (tts-bridge models add)"
            )
        if not path.is_file():
            raise EngineError(f"{path}: missing (ChatTTS checkpoint incomplete)")
        actual = self._hasher(path)
        if actual != want.lower():
            raise EngineError(
                f"{path}: sha256 mismatch: expected {want.lower()}, actual {actual}; "
                "refusing to load a modified or corrupt model file"
            )

    def unload(self) -> None:
        with self._lock:
            if self._loaded is None:
                return
            self._loaded = None
        # The model sits in reference cycles (modules, bound methods); collect them now and
        # hand the freed heap back to the OS, or RSS would stay at its loaded size.
        gc.collect()
        _release_freed_heap()
        _LOGGER.info("Unloaded ChatTTS %s", self._folder)

    # -- synthesis -------------------------------------------------------------------------

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        """Speak ``text``: one float32 chunk per generation of at most ~25 s expected audio.

        ``speaker`` is a ChatTTS spk_emb string (None: the checkpoint's default speaker).
        ``options`` may be ChatTTSOptions; plain SynthesisOptions take the engine's defaults
        for everything but speed. The same speaker and seed are used for every chunk.
        """
        chosen = self._options(options)
        if speaker is not None:
            self.validate_speaker(speaker)
        chunks = split_for_generation(strip_control_tags(text), chosen.speed_level)
        # Punctuation or emoji alone would make ChatTTS babble rather than stay silent.
        for chunk in filter(is_speakable, chunks):
            audio = self._generate(chunk, speaker, chosen)
            if audio.size:
                yield audio

    def _options(self, options: SynthesisOptions) -> ChatTTSOptions:
        if isinstance(options, ChatTTSOptions):
            return options
        try:
            return replace(self._defaults, speed=options.speed)
        except ValueError as exc:
            raise EngineError(f"ChatTTS cannot use these options: {exc}") from exc

    def _generate(self, text: str, speaker: str | None, options: ChatTTSOptions) -> FloatAudio:
        budget = max_new_tokens(expected_seconds(text, options.speed_level))
        with self._lock:
            if self._loaded is None:
                self._loaded = self._load_locked()
            loaded = self._loaded
            # Fresh parameter objects every call: infer() writes into the ones it is given
            # (a shared default would keep the first call's txt_smp/spk_smp forever).
            code_params = loaded.chat.InferCodeParams(
                prompt=f"[speed_{options.speed_level}]",
                spk_emb=speaker or loaded.default_speaker,
                temperature=options.temperature,
                top_P=options.top_P,
                top_K=options.top_K,
                max_new_token=budget,
                # With a manual seed ChatTTS does not retry an EOS at step 0, and an empty
                # result makes infer() fail; one token minimum rules that out.
                min_new_token=1,
                show_tqdm=False,
                manual_seed=options.seed,
            )
            refine_params = loaded.chat.RefineTextParams(
                prompt=options.refine_prompt,
                # The refiner re-emits the text with a few tags added; ChatTTS's fixed 384
                # tokens would let a confused refiner ramble far past a short sentence.
                max_new_token=min(384, 2 * len(text) + 32),
                min_new_token=1,
                show_tqdm=False,
                manual_seed=options.seed,
            )
            _LOGGER.debug("ChatTTS: %s (max %d tokens, seed %d)", short(text), budget, options.seed)
            try:
                wavs = loaded.chat.infer(
                    [text],
                    split_text=False,
                    skip_refine_text=not options.refine_text,
                    params_refine_text=refine_params,
                    params_infer_code=code_params,
                )
            except (RuntimeError, ValueError, IndexError, AssertionError) as exc:
                raise EngineError(f"ChatTTS failed on {short(text)}: {exc}") from exc
        # An interrupted generation returns what it had so far: never cache that.
        check_interrupt()
        audio = np.asarray(wavs[0], dtype=np.float32).reshape(-1)
        return np.clip(audio, -1.0, 1.0)

    # -- helpers ---------------------------------------------------------------------------

    def _expected_hashes(self) -> dict[str, str]:
        if self._expected is not None:
            return self._expected
        return official_sha256()

    def _required_files(self, expected: Mapping[str, str]) -> tuple[str, ...]:
        if _matches_official(expected):
            return CHECKPOINT_FILES
        return (*CHECKPOINT_FILES, SPK_STAT_FILE)

    def _read_stats(self, hidden_size: int, official: bool, *, verify: bool) -> SpeakerStats:
        if official:
            config = _import_chattts().config.Config()
            return SpeakerStats.decode(config.spk_stat, hidden_size, "ChatTTS's built-in spk_stat")
        path = self._folder / SPK_STAT_FILE
        if not path.is_file():
            raise EngineError(
                f"{path}: missing; a checkpoint other than the official ChatTTS release needs "
                "its speaker statistics there"
            )
        if verify:
            self._verify_file(SPK_STAT_FILE, self._expected_hashes())
        return read_spk_stat_file(path, hidden_size)


def _encode_stats(stats: SpeakerStats) -> str:
    b14 = _pybase16384()
    data = np.concatenate([stats.std, stats.mean]).astype(np.float16).tobytes()
    encoded: str = b14.encode_to_string(data)
    return encoded


def chattts_config(dims: CheckpointDims, spk_stat: str) -> Any:
    """ChatTTS's Config for these sizes, built from fresh objects.

    ChatTTS's config dataclasses share their default sub-objects between instances, so editing
    ``Config().gpt`` in place would change the defaults of every later Chat in the process.
    """
    cc = _import_chattts().config.config

    def stack(d: ConvStackDims) -> Any:
        return cc.Decoder(
            idim=d.idim, odim=d.odim, hidden=d.hidden, n_layer=d.n_layer, bn_dim=d.bn_dim
        )

    return cc.Config(
        path=cc.Path(),
        decoder=stack(dims.decoder),
        dvae=cc.DVAE(
            encoder=stack(dims.dvae_encoder),
            decoder=stack(dims.dvae_decoder),
            # Only the number of FSQ levels shows in the weights; ChatTTS uses 5 per level.
            vq=cc.VQ(
                dim=dims.dvae_vq_dim, levels=(5,) * dims.dvae_vq_levels, G=dims.dvae_vq_groups
            ),
        ),
        gpt=cc.GPT(
            hidden_size=dims.hidden_size,
            intermediate_size=dims.intermediate_size,
            num_attention_heads=dims.num_attention_heads,
            num_hidden_layers=dims.num_hidden_layers,
            use_cache=False,
            max_position_embeddings=dims.max_position_embeddings,
            spk_emb_dim=dims.spk_emb_dim,
            num_audio_tokens=dims.num_audio_tokens,
            num_text_tokens=dims.num_text_tokens,
            num_vq=dims.num_vq,
        ),
        embed=cc.Embed(
            hidden_size=dims.hidden_size,
            num_audio_tokens=dims.num_audio_tokens,
            num_text_tokens=dims.num_text_tokens,
            num_vq=dims.num_vq,
        ),
        vocos=cc.Vocos(
            feature_extractor=cc.FeatureExtractor(
                init_args=cc.FeatureExtractorInitArgs(
                    sample_rate=SAMPLE_RATE,
                    n_fft=dims.vocos_mel_n_fft,
                    hop_length=HOP_LENGTH,
                    n_mels=dims.n_mels,
                )
            ),
            backbone=cc.Backbone(
                init_args=cc.BackboneInitArgs(
                    input_channels=dims.n_mels,
                    dim=dims.vocos_dim,
                    intermediate_dim=dims.vocos_intermediate_dim,
                    num_layers=dims.vocos_layers,
                )
            ),
            head=cc.FourierHead(
                init_args=cc.FourierHeadInitArgs(
                    dim=dims.vocos_dim, n_fft=dims.vocos_head_n_fft, hop_length=HOP_LENGTH
                )
            ),
        ),
        spk_stat=spk_stat,
    )


def _release_freed_heap() -> None:
    """Ask glibc to return freed heap pages to the OS (no-op elsewhere).

    Loading copies every tensor through temporary buffers; glibc keeps such freed memory in its
    arenas, where it still counts as the process's RSS.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        _LOGGER.debug("malloc_trim unavailable; freed memory stays with the allocator")


class _InterruptFlag:
    """Stands in for ChatTTS's ``GPT.Context``: ``get`` is true when the synthesizing thread
    should give way (``tts_bridge.engines.base.interruptible``); ChatTTS's own ``set`` calls
    (it clears the flag at the start of every ``infer``) change nothing."""

    def set(self, value: bool) -> None:
        pass

    def get(self) -> bool:
        return interrupt_requested()
