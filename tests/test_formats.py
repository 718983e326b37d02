"""AudioFormat: parsing from config and request fields, validation, content types, rates."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from tts_bridge.audio.formats import AudioFormat, AudioFormatField, FormatError


def test_a_name_is_the_format_with_its_defaults() -> None:
    fmt = AudioFormat.parse("mp3")
    assert fmt == AudioFormat("mp3", None, 1)
    assert (fmt.content_type, fmt.extension) == ("audio/mpeg", "mp3")
    assert AudioFormat.parse(" FLAC ").container == "flac"
    assert AudioFormat.parse("ogg").container == "opus"


def test_a_mapping_sets_rate_channels_and_bitrate() -> None:
    fmt = AudioFormat.parse({"format": "mp3", "sample_rate": 44100, "channels": 2})
    assert (fmt.container, fmt.sample_rate, fmt.channels) == ("mp3", 44100, 2)
    opus = AudioFormat.parse({"format": "opus", "bitrate_kbps": 24})
    assert opus.bitrate_kbps == 24
    assert AudioFormat.parse(fmt) is fmt


@pytest.mark.parametrize(
    ("container", "type_", "ext"),
    [
        ("wav", "audio/wav", "wav"),
        ("flac", "audio/flac", "flac"),
        ("mp3", "audio/mpeg", "mp3"),
        ("opus", "audio/ogg", "opus"),
    ],
)
def test_content_types_and_extensions(container: str, type_: str, ext: str) -> None:
    fmt = AudioFormat.parse(container)
    assert (fmt.content_type, fmt.extension) == (type_, ext)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("aac", "unknown audio format 'aac'"),
        ({"format": "mp3", "channels": 3}, "channels must be 1 or 2"),
        ({"format": "mp3", "channels": True}, "channels must be 1 or 2"),
        ({"format": "opus", "sample_rate": 44100}, "opus supports sample rates 8000, 12000"),
        ({"format": "mp3", "sample_rate": 96000}, "mp3 supports sample rates"),
        ({"format": "wav", "sample_rate": 1000}, "sample_rate must be 8000 to 192000"),
        ({"format": "flac", "sample_rate": "44100"}, "whole number of Hz"),
        ({"format": "wav", "bitrate_kbps": 64}, "bitrate_kbps is for mp3 and opus"),
        ({"format": "mp3", "sample_rate": 22050, "bitrate_kbps": 320}, "must be 8 to 160"),
        ({"format": "opus", "channels": 2, "bitrate_kbps": 4}, "must be 12 to 512"),
        ({"sample_rate": 44100}, "needs 'format'"),
        ({"format": "mp3", "rate": 44100}, "unknown audio format key(s) rate"),
        ({"format": 3}, "must be a name"),
        (42, "a name or a mapping, not int"),
    ],
)
def test_bad_formats_are_refused_with_a_clear_message(value: object, message: str) -> None:
    with pytest.raises(FormatError) as caught:
        AudioFormat.parse(value)
    assert message in str(caught.value)


def test_output_rate_keeps_the_source_where_the_codec_takes_it() -> None:
    assert AudioFormat("wav").output_rate(22050) == 22050
    assert AudioFormat("mp3").output_rate(22050) == 22050  # an MPEG-2 rate
    assert AudioFormat("mp3").output_rate(44100) == 44100
    assert AudioFormat("mp3").output_rate(96000) == 48000
    assert AudioFormat("mp3", 48000).output_rate(22050) == 48000
    # Opus: the next rate the codec has above the source, never below it.
    assert AudioFormat("opus").output_rate(22050) == 24000
    assert AudioFormat("opus").output_rate(24000) == 24000
    assert AudioFormat("opus").output_rate(44100) == 48000
    assert AudioFormat("opus").output_rate(16000) == 16000


def test_speech_bitrates_by_codec_rate_and_channels() -> None:
    assert AudioFormat("mp3").output_bitrate_kbps(44100) == 64
    assert AudioFormat("mp3", channels=2).output_bitrate_kbps(44100) == 128
    assert AudioFormat("mp3").output_bitrate_kbps(11025) == 32
    assert AudioFormat("opus", channels=2).output_bitrate_kbps(48000) == 64
    assert AudioFormat("mp3", bitrate_kbps=48).output_bitrate_kbps(44100) == 48


def test_keys_tell_every_setting_apart() -> None:
    formats = [
        AudioFormat("mp3"),
        AudioFormat("mp3", 44100),
        AudioFormat("mp3", 44100, 2),
        AudioFormat("mp3", 44100, 2, 96),
        AudioFormat("opus"),
        AudioFormat("flac"),
        AudioFormat("wav"),
    ]
    assert len({f.key() for f in formats}) == len(formats)
    assert AudioFormat.parse({"format": "mp3"}).key() == AudioFormat("mp3").key()


class _Target(BaseModel):
    format: AudioFormatField = AudioFormat("mp3", 44100)


def test_as_a_pydantic_field_it_reads_names_and_mappings_and_writes_them_back() -> None:
    assert _Target().format == AudioFormat("mp3", 44100)
    assert _Target.model_validate({"format": "flac"}).format == AudioFormat("flac")
    target = _Target.model_validate({"format": {"format": "opus", "channels": 2}})
    assert target.format == AudioFormat("opus", None, 2)
    assert target.model_dump() == {"format": {"format": "opus", "channels": 2}}
    assert _Target.model_validate({"format": "wav"}).model_dump() == {"format": "wav"}
    with pytest.raises(ValidationError, match="opus supports sample rates"):
        _Target.model_validate({"format": {"format": "opus", "sample_rate": 22050}})
