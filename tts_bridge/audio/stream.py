"""Audio encoded while it is made: 16-bit PCM pieces in, bytes of one growing file out.

For the HTTP speech API, whose clients start playing before the whole answer exists. WAV gets a
header whose sizes say "unknown length" (players read until the connection ends), raw PCM is
resampled to the 24 kHz the OpenAI API promises for ``pcm``, and Ogg Opus is written by libsndfile
page by page (it never seeks back). MP3 and FLAC are not streamed here: they are encoded whole
with `tts_bridge.audio.codec.encode`.
"""

from __future__ import annotations

import io
import struct
from typing import Literal, Protocol

import numpy as np
import soundfile
import soxr

from tts_bridge.audio.codec import Int16Audio, compression_level
from tts_bridge.audio.formats import AudioFormat

StreamFormat = Literal["wav", "pcm", "opus"]
STREAM_FORMATS: tuple[StreamFormat, ...] = ("wav", "pcm", "opus")
PCM_RATE = 24000
"""The rate of raw ``pcm`` answers: OpenAI's speech API defines it, clients assume it."""
_UNKNOWN_SIZE = 0xFFFFFFFF


class StreamEncoder(Protocol):
    """Pieces in, bytes out: `start` once, `feed` per piece, `finish` once."""

    content_type: str
    sample_rate: int
    """The rate of the audio written."""

    def start(self) -> bytes: ...

    def feed(self, pcm: Int16Audio) -> bytes: ...

    def finish(self) -> bytes: ...


def wav_stream_header(sample_rate: int, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV header for audio of unknown length (RIFF and data sizes all ones)."""
    block = channels * 2
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN_SIZE)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
        + b"data"
        + struct.pack("<I", _UNKNOWN_SIZE)
    )


class _Resampler:
    """A stream of int16 pieces from one rate to another, continuous across pieces."""

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self._stream = (
            soxr.ResampleStream(from_rate, to_rate, 1, dtype="int16")
            if from_rate != to_rate
            else None
        )

    def __call__(self, pcm: Int16Audio, last: bool = False) -> Int16Audio:
        if self._stream is None:
            return pcm
        return np.asarray(self._stream.resample_chunk(pcm, last=last), dtype="<i2")


class WavStream:
    content_type = "audio/wav"

    def __init__(self, source_rate: int) -> None:
        self.sample_rate = source_rate

    def start(self) -> bytes:
        return wav_stream_header(self.sample_rate)

    def feed(self, pcm: Int16Audio) -> bytes:
        return np.asarray(pcm, dtype="<i2").tobytes()

    def finish(self) -> bytes:
        return b""


class PcmStream:
    content_type = "audio/pcm"

    def __init__(self, source_rate: int) -> None:
        self.sample_rate = PCM_RATE
        self._resample = _Resampler(source_rate, PCM_RATE)

    def start(self) -> bytes:
        return b""

    def feed(self, pcm: Int16Audio) -> bytes:
        return self._resample(pcm).tobytes()

    def finish(self) -> bytes:
        return self._resample(np.zeros(0, dtype="<i2"), last=True).tobytes()


class _Sink(io.RawIOBase):
    """Collects what libsndfile writes, handed out by `take`. libsndfile writes Ogg pages in
    order and never seeks back, so the bytes may leave as soon as they are written."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._position = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True  # libsndfile asks; it only ever seeks to where it is

    def readable(self) -> bool:
        return False

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        chunk = bytes(data)
        self._pending += chunk
        self._position += len(chunk)
        return len(chunk)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        # Always at the end of what was written: SEEK_END and SEEK_CUR count from here.
        target = offset if whence == io.SEEK_SET else self._position + offset
        if target != self._position:
            raise OSError("a streamed Ogg file cannot seek")
        return self._position

    def tell(self) -> int:
        return self._position

    def take(self) -> bytes:
        out = bytes(self._pending)
        self._pending.clear()
        return out


class OpusStream:
    content_type = "audio/ogg"

    def __init__(self, source_rate: int) -> None:
        fmt = AudioFormat("opus")
        self.sample_rate = fmt.output_rate(source_rate)  # Opus codes at a few rates only
        self._resample = _Resampler(source_rate, self.sample_rate)
        self._sink = _Sink()
        self._file = soundfile.SoundFile(
            self._sink,
            "w",
            samplerate=self.sample_rate,
            channels=1,
            format="OGG",
            subtype="OPUS",
            compression_level=compression_level(fmt, self.sample_rate),
        )

    def start(self) -> bytes:
        return self._sink.take()

    def feed(self, pcm: Int16Audio) -> bytes:
        samples = self._resample(pcm)
        if samples.size:
            self._file.write(samples.astype(np.float32) / 32768.0)
        return self._sink.take()

    def finish(self) -> bytes:
        tail = self._resample(np.zeros(0, dtype="<i2"), last=True)
        if tail.size:
            self._file.write(tail.astype(np.float32) / 32768.0)
        self._file.close()
        return self._sink.take()


def stream_encoder(container: StreamFormat, source_rate: int) -> StreamEncoder:
    if container == "wav":
        return WavStream(source_rate)
    if container == "pcm":
        return PcmStream(source_rate)
    return OpusStream(source_rate)
