"""ChatTTS speakers without torch: the spk_emb string codec and a checkpoint's statistics.

A speaker is a float16 vector of the GPT's hidden size, passed around as ChatTTS writes it
(raw LZMA2, then base16384 text), so a voice made by ChatTTS itself, by either engine here or
by ``tts-bridge`` configuration is the same string. The configuration validates speakers with
this module before any engine exists, so it imports neither torch nor onnxruntime (and
``pybase16384`` only when a speaker is actually encoded or decoded, with an error naming the
extra that provides it).
"""

from __future__ import annotations

import importlib
import lzma
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tts_bridge.engines.base import EngineError

__all__ = [
    "DEFAULT_SPEAKER_SEED",
    "SPK_STAT_FORMAT",
    "SpeakerError",
    "SpeakerStats",
    "decode_spk_emb",
    "encode_spk_emb",
    "sample_spk_emb",
    "validate_spk_emb",
]

DEFAULT_SPEAKER_SEED = 0
"""The voice used when a request names no speaker: stable across sentences and restarts."""
SPK_STAT_FORMAT = "chattts-spk-stat"
"""The ``format`` of a checkpoint's speaker statistics file (``asset/spk_stat.json``)."""

# ChatTTS compresses speaker embeddings with exactly these settings (ChatTTS/model/speaker.py).
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
_MAX_SPK_EMB_CHARS = 65_536


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

    def encode(self) -> str:
        """The spk_stat string ``decode`` reads (ChatTTS's Config.spk_stat)."""
        b14 = _pybase16384()
        data = np.concatenate([self.std, self.mean]).astype(np.float16).tobytes()
        encoded: str = b14.encode_to_string(data)
        return encoded


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
