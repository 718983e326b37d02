"""PCM helpers and encoders: float to 16-bit PCM, silence, resampling, and the formats speakers
play (WAV, FLAC, MP3, Ogg/Opus, see tts_bridge.audio.formats) through libsndfile."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import soundfile
import soxr

from tts_bridge.audio.formats import MP3_BITRATE_RANGE, OPUS_BITRATE_RANGE, AudioFormat, mp3_version

Int16Audio = npt.NDArray[np.int16]
FloatAudio = npt.NDArray[np.float32]


def to_pcm16(audio: npt.NDArray[np.floating] | npt.NDArray[np.int16]) -> Int16Audio:
    """Float audio in [-1, 1] (clipped) to little-endian 16-bit PCM."""
    if audio.dtype == np.int16:
        return np.asarray(audio, dtype="<i2")
    clipped = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    return np.asarray(np.round(clipped * 32767.0), dtype="<i2")


def silence(sample_rate: int, milliseconds: int) -> Int16Audio:
    return np.zeros(sample_rate * milliseconds // 1000, dtype="<i2")


def resample(pcm: Int16Audio, from_rate: int, to_rate: int) -> Int16Audio:
    """High-quality resampling (soxr) of 16-bit PCM; a no-op when the rates match."""
    if from_rate == to_rate or pcm.size == 0:
        return pcm
    return np.asarray(soxr.resample(pcm, from_rate, to_rate), dtype="<i2")


def encode_wav(pcm: Int16Audio, sample_rate: int) -> bytes:
    """A complete mono 16-bit WAV file in memory."""
    buffer = io.BytesIO()
    soundfile.write(buffer, pcm, sample_rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def duration_ms(samples: int, sample_rate: int) -> int:
    return round(samples * 1000 / sample_rate)


class EncodeError(ValueError):
    """Audio that cannot be encoded (empty, or a format this libsndfile lacks)."""


@dataclass(frozen=True)
class EncodedAudio:
    data: bytes
    format: AudioFormat
    sample_rate: int
    """The rate the audio was written at (see AudioFormat.output_rate)."""
    channels: int
    frames: int
    """Samples per channel written (the decoded length of a gapless decoder)."""

    @property
    def duration_ms(self) -> int:
        return duration_ms(self.frames, self.sample_rate)

    @property
    def content_type(self) -> str:
        return self.format.content_type


_SOUNDFILE_TYPES = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}


def supported_containers() -> list[str]:
    """The containers the installed libsndfile can write (MP3 needs 1.1, Opus 1.0.29)."""
    formats = soundfile.available_formats()
    out = []
    for container, (major, subtype) in _SOUNDFILE_TYPES.items():
        if major in formats and subtype in soundfile.available_subtypes(major):
            out.append(container)
    return out


def _as_float_frames(audio: npt.NDArray[np.generic]) -> FloatAudio:
    """(frames, channels) float32 in [-1, 1] from int16 or float PCM, mono (1-D) or not."""
    array = np.asarray(audio)
    if array.dtype == np.int16:
        frames = array.astype(np.float32) / 32768.0
    elif np.issubdtype(array.dtype, np.floating):
        frames = array.astype(np.float32, copy=False)
    else:
        raise EncodeError(f"PCM must be int16 or float, not {array.dtype}")
    if frames.ndim == 1:
        frames = frames[:, np.newaxis]
    if frames.ndim != 2 or frames.shape[1] not in (1, 2):
        raise EncodeError(f"PCM must be mono or (frames, 1 or 2 channels), not {array.shape}")
    return frames


def _with_channels(frames: FloatAudio, channels: int) -> FloatAudio:
    if frames.shape[1] == channels:
        return frames
    if channels == 2:
        return np.repeat(frames, 2, axis=1)
    return np.asarray(frames.mean(axis=1, keepdims=True, dtype=np.float32), dtype=np.float32)


def compression_level(fmt: AudioFormat, rate: int) -> float | None:
    """libsndfile's 0..1 compression level that gives the format's bitrate: it maps the level
    linearly onto a codec's bitrate range (MP3: the MPEG version's layer III range; Opus: a
    per-channel range)."""
    if not fmt.lossy:
        return None
    kbps = float(fmt.output_bitrate_kbps(rate))
    if fmt.container == "mp3":
        low, high = MP3_BITRATE_RANGE[mp3_version(rate)]
        kbps = min(max(kbps, low), high)
    else:
        low, high = OPUS_BITRATE_RANGE
        kbps = min(max(kbps / fmt.channels, low), high)
    # Half a kbit/s of headroom: libsndfile truncates the bitrate it computes from the level.
    return min(max((high - (kbps + 0.5)) / (high - low), 0.0), 1.0)


def encode(audio: npt.NDArray[np.generic], sample_rate: int, fmt: AudioFormat) -> EncodedAudio:
    """Encode int16 or float PCM (mono, or frames x channels) at sample_rate into fmt, resampled
    (soxr) and mixed to the format's rate and channels."""
    if sample_rate <= 0:
        raise EncodeError(f"sample_rate must be positive, not {sample_rate}")
    frames = _as_float_frames(audio)
    if frames.shape[0] == 0:
        raise EncodeError("no audio to encode")
    rate = fmt.output_rate(sample_rate)
    frames = _with_channels(frames, fmt.channels)
    if rate != sample_rate:
        frames = np.asarray(soxr.resample(frames, sample_rate, rate), dtype=np.float32)
    major, subtype = _SOUNDFILE_TYPES[fmt.container]
    np.clip(frames, -1.0, 1.0, out=frames)
    data: npt.NDArray[np.generic]
    if fmt.lossy:
        # Float, not int16: libsndfile 1.2's MP3 encoder mangles interleaved 16-bit stereo
        # (it copies a byte count where it means a sample count), and the codecs take float.
        data = frames
        bitrate_mode: str | None = "CONSTANT" if fmt.container == "mp3" else None
    else:
        data = to_pcm16(frames)
        bitrate_mode = None
    buffer = io.BytesIO()
    try:
        soundfile.write(
            buffer,
            data,
            rate,
            format=major,
            subtype=subtype,
            compression_level=compression_level(fmt, rate),
            bitrate_mode=bitrate_mode,
        )
    except (soundfile.LibsndfileError, TypeError, ValueError) as exc:
        raise EncodeError(f"cannot encode {fmt.container} at {rate} Hz: {exc}") from exc
    return EncodedAudio(
        data=buffer.getvalue(),
        format=fmt,
        sample_rate=rate,
        channels=fmt.channels,
        frames=int(frames.shape[0]),
    )
