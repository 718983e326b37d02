"""Encoding PCM into the formats speakers play, checked by decoding it back with soundfile."""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt
import pytest
import soundfile

from tts_bridge.audio.codec import EncodeError, encode, supported_containers
from tts_bridge.audio.formats import AudioFormat

SOURCE_RATE = 22050  # Piper joe's rate: not one Opus codes at


def _tone(seconds: float, rate: int = SOURCE_RATE, hz: float = 440.0) -> npt.NDArray[np.int16]:
    t = np.arange(round(seconds * rate)) / rate
    return np.asarray(np.round(np.sin(2 * np.pi * hz * t) * 12000), dtype=np.int16)


def _decode(data: bytes) -> tuple[npt.NDArray[np.float32], int]:
    audio, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return audio, rate


def test_this_libsndfile_writes_every_format() -> None:
    assert supported_containers() == ["wav", "flac", "mp3", "opus"]


@pytest.mark.parametrize(
    ("value", "rate", "channels", "major"),
    [
        ("wav", SOURCE_RATE, 1, "WAV"),
        ({"format": "wav", "sample_rate": 48000, "channels": 2}, 48000, 2, "WAV"),
        ("flac", SOURCE_RATE, 1, "FLAC"),
        ({"format": "flac", "sample_rate": 44100, "channels": 2}, 44100, 2, "FLAC"),
        ("mp3", SOURCE_RATE, 1, "MP3"),
        ({"format": "mp3", "sample_rate": 44100}, 44100, 1, "MP3"),
        ({"format": "mp3", "sample_rate": 48000, "channels": 2}, 48000, 2, "MP3"),
        ("opus", 24000, 1, "OGG"),
        ({"format": "opus", "sample_rate": 48000, "channels": 2}, 48000, 2, "OGG"),
    ],
)
def test_encoded_audio_decodes_to_the_same_length_rate_and_channels(
    value: object, rate: int, channels: int, major: str
) -> None:
    fmt = AudioFormat.parse(value)
    pcm = _tone(1.7)
    encoded = encode(pcm, SOURCE_RATE, fmt)
    info = soundfile.info(io.BytesIO(encoded.data))
    assert info.format == major
    audio, decoded_rate = _decode(encoded.data)
    assert (decoded_rate, audio.shape[1]) == (rate, channels)
    assert (encoded.sample_rate, encoded.channels) == (rate, channels)
    assert encoded.frames == round(pcm.size * rate / SOURCE_RATE)
    # Gapless: the info tag of LAME and Opus's pre-skip trim the codec delay on decoding.
    assert audio.shape[0] == encoded.frames
    assert encoded.duration_ms == 1700
    assert encoded.content_type == fmt.content_type


@pytest.mark.parametrize("container", ["wav", "flac", "mp3", "opus"])
def test_the_decoded_audio_is_the_tone_on_every_channel(container: str) -> None:
    fmt = AudioFormat.parse({"format": container, "sample_rate": 48000, "channels": 2})
    encoded = encode(_tone(1.0, hz=440.0), SOURCE_RATE, fmt)
    audio, rate = _decode(encoded.data)
    for channel in range(2):
        spectrum = np.abs(np.fft.rfft(audio[:, channel]))
        peak_hz = np.argmax(spectrum) * rate / audio.shape[0]
        assert abs(peak_hz - 440.0) < 3.0
        rms = float(np.sqrt(np.mean(audio[:, channel] ** 2)))
        assert rms == pytest.approx(12000 / 32768 / np.sqrt(2), rel=0.1)
    # Both channels carry the same sound (a mono source duplicated, not garbled).
    assert np.corrcoef(audio[:, 0], audio[:, 1])[0, 1] > 0.99


def test_lossless_formats_are_bit_exact_without_resampling() -> None:
    pcm = _tone(0.5)
    for container in ("wav", "flac"):
        decoded, _ = soundfile.read(
            io.BytesIO(encode(pcm, SOURCE_RATE, AudioFormat.parse(container)).data), dtype="int16"
        )
        assert np.array_equal(decoded, pcm)


def test_float_and_stereo_input_are_accepted_and_mixed_down() -> None:
    left = _tone(0.5).astype(np.float32) / 32768.0
    stereo = np.column_stack([left, left])
    encoded = encode(stereo, SOURCE_RATE, AudioFormat("wav"))
    mono, _ = _decode(encoded.data)
    assert mono.shape == (left.size, 1)
    assert np.allclose(mono[:, 0], left, atol=1 / 32768)
    # Out-of-range float is clipped, not wrapped around.
    loud = encode(np.full(1000, 1.5, dtype=np.float32), SOURCE_RATE, AudioFormat("wav"))
    assert _decode(loud.data)[0].max() == pytest.approx(32767 / 32768)


@pytest.mark.parametrize(
    ("fmt", "low", "high"),
    [
        (AudioFormat("mp3", 44100), 60, 70),
        (AudioFormat("mp3", 44100, 2), 120, 135),
        (AudioFormat("mp3", 22050, bitrate_kbps=32), 30, 36),
        (AudioFormat("opus", 48000), 26, 40),
        (AudioFormat("opus", 48000, 2, bitrate_kbps=96), 80, 110),
    ],
)
def test_lossy_bitrates_follow_the_format(fmt: AudioFormat, low: float, high: float) -> None:
    noise = np.random.default_rng(1).normal(0, 0.2, SOURCE_RATE * 4).astype(np.float32)
    encoded = encode(noise, SOURCE_RATE, fmt)
    kbps = len(encoded.data) * 8 / 4 / 1000
    assert low <= kbps <= high


def test_a_normal_sentence_in_mp3_fits_a_small_mqtt_client() -> None:
    # PubSubClient on an ESP32 takes messages under 64 KiB; a sentence is a few seconds.
    speechlike = np.random.default_rng(2).normal(0, 0.2, SOURCE_RATE * 5).astype(np.float32)
    assert len(encode(speechlike, SOURCE_RATE, AudioFormat("mp3")).data) < 64 * 1024


@pytest.mark.parametrize(
    ("pcm", "rate", "message"),
    [
        (np.zeros(0, dtype=np.int16), SOURCE_RATE, "no audio"),
        (np.zeros(10, dtype=np.int32), SOURCE_RATE, "int16 or float"),
        (np.zeros((10, 3), dtype=np.int16), SOURCE_RATE, "mono or"),
        (np.zeros(10, dtype=np.int16), 0, "sample_rate must be positive"),
    ],
)
def test_bad_pcm_is_refused(pcm: npt.NDArray[np.generic], rate: int, message: str) -> None:
    with pytest.raises(EncodeError, match=message):
        encode(pcm, rate, AudioFormat("mp3"))
