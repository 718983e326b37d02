"""The audio formats speakers play: a validated description, its content type and file extension.

Only the description lives here (no numpy, no codecs), so the configuration can use it cheaply;
`tts_bridge.audio.codec.encode` turns PCM into bytes of one of these formats.

A format is written in the configuration or a request either as a name (``"mp3"``) or as a
mapping (``{"format": "mp3", "sample_rate": 44100, "channels": 2}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, PlainSerializer

Container = Literal["wav", "flac", "mp3", "opus"]
CONTAINERS: tuple[Container, ...] = get_args(Container)

CONTENT_TYPES: dict[Container, str] = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # RFC 7845: Ogg Opus files are audio/ogg with the .opus extension
}
EXTENSIONS: dict[Container, str] = {"wav": "wav", "flac": "flac", "mp3": "mp3", "opus": "opus"}

# MPEG-1 (32-48 kHz), MPEG-2 (16-24 kHz) and MPEG-2.5 (8-12 kHz) layer III rates.
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
# Opus codes at these rates only (libsndfile refuses any other).
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
PCM_RATE_RANGE = (8000, 192_000)
# Layer III bitrates by MPEG version: the encoder snaps to the nearest standard one.
MP3_BITRATE_RANGE = {1: (32, 320), 2: (8, 160), 25: (8, 64)}
OPUS_BITRATE_RANGE = (6, 256)  # per channel
_ALIASES: dict[str, Container] = {"wave": "wav", "mpeg": "mp3", "ogg": "opus"}
_KEYS = frozenset({"format", "sample_rate", "channels", "bitrate_kbps"})


class FormatError(ValueError):
    """An audio format that cannot be written; the message says what is allowed."""


def mp3_version(sample_rate: int) -> int:
    """MPEG version of layer III audio at this rate (25 stands for MPEG-2.5)."""
    if sample_rate >= 32000:
        return 1
    return 2 if sample_rate >= 16000 else 25


@dataclass(frozen=True)
class AudioFormat:
    """What to encode: container (and codec), output rate, channels and, for lossy codecs, the
    bitrate. An empty sample_rate keeps the source's rate where the codec allows it."""

    container: Container = "wav"
    sample_rate: int | None = None
    channels: int = 1
    bitrate_kbps: int | None = None
    """Total bitrate of MP3 (constant) or Opus; empty = one chosen for speech."""

    def __post_init__(self) -> None:
        if self.container not in CONTAINERS:
            raise FormatError(
                f"unknown audio format {self.container!r}; use one of {', '.join(CONTAINERS)}"
            )
        if self.channels not in (1, 2):
            raise FormatError(f"channels must be 1 or 2, not {self.channels!r}")
        rate = self.sample_rate
        if rate is not None:
            if isinstance(rate, bool) or not isinstance(rate, int):
                raise FormatError(f"sample_rate must be a whole number of Hz, not {rate!r}")
            allowed = self._allowed_rates()
            if allowed is not None and rate not in allowed:
                raise FormatError(
                    f"{self.container} supports sample rates {', '.join(map(str, allowed))} "
                    f"Hz, not {rate}"
                )
            low, high = PCM_RATE_RANGE
            if allowed is None and not low <= rate <= high:
                raise FormatError(f"sample_rate must be {low} to {high} Hz, not {rate}")
        if self.bitrate_kbps is not None:
            self._check_bitrate(self.bitrate_kbps)

    def _allowed_rates(self) -> tuple[int, ...] | None:
        if self.container == "mp3":
            return MP3_RATES
        if self.container == "opus":
            return OPUS_RATES
        return None

    def _check_bitrate(self, kbps: int) -> None:
        if self.container not in ("mp3", "opus"):
            raise FormatError(f"bitrate_kbps is for mp3 and opus, not {self.container}")
        if isinstance(kbps, bool) or not isinstance(kbps, int):
            raise FormatError(f"bitrate_kbps must be a whole number, not {kbps!r}")
        if self.container == "opus":
            low, high = (self.channels * b for b in OPUS_BITRATE_RANGE)
        elif self.sample_rate is not None:
            low, high = MP3_BITRATE_RANGE[mp3_version(self.sample_rate)]
        else:  # the rate follows the source: any layer III bitrate
            low, high = MP3_BITRATE_RANGE[2][0], MP3_BITRATE_RANGE[1][1]
        if not low <= kbps <= high:
            raise FormatError(f"{self.container} bitrate_kbps must be {low} to {high}, not {kbps}")

    @classmethod
    def parse(cls, value: object) -> AudioFormat:
        """A format from a name (``"mp3"``), a mapping with ``format`` and optional
        ``sample_rate``, ``channels``, ``bitrate_kbps``, or an AudioFormat."""
        if isinstance(value, AudioFormat):
            return value
        if isinstance(value, str):
            return cls(container=_container(value))
        if isinstance(value, Mapping):
            unknown = set(value) - _KEYS
            if unknown:
                raise FormatError(
                    f"unknown audio format key(s) {', '.join(sorted(map(str, unknown)))}; "
                    f"use {', '.join(sorted(_KEYS))}"
                )
            if "format" not in value:
                raise FormatError("an audio format needs 'format' (e.g. \"mp3\")")
            name = value["format"]
            if not isinstance(name, str):
                raise FormatError(f'format must be a name such as "mp3", not {name!r}')
            channels = value.get("channels", 1)
            if isinstance(channels, bool) or not isinstance(channels, int):
                raise FormatError(f"channels must be 1 or 2, not {channels!r}")
            return cls(
                container=_container(name),
                sample_rate=value.get("sample_rate"),
                channels=channels,
                bitrate_kbps=value.get("bitrate_kbps"),
            )
        raise FormatError(f"an audio format is a name or a mapping, not {type(value).__name__}")

    def to_config(self) -> str | dict[str, Any]:
        """The shortest form parse() reads back: the bare name when nothing else is set."""
        if self == AudioFormat(self.container):
            return self.container
        out: dict[str, Any] = {"format": self.container}
        if self.sample_rate is not None:
            out["sample_rate"] = self.sample_rate
        if self.channels != 1:
            out["channels"] = self.channels
        if self.bitrate_kbps is not None:
            out["bitrate_kbps"] = self.bitrate_kbps
        return out

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self.container]

    @property
    def extension(self) -> str:
        return EXTENSIONS[self.container]

    @property
    def lossy(self) -> bool:
        return self.container in ("mp3", "opus")

    def output_rate(self, source_rate: int) -> int:
        """The rate the audio is written at for a source at source_rate: the configured one, or
        the source's when the codec takes it, else the nearest codec rate above (the highest
        when the source is above them all)."""
        if self.sample_rate is not None:
            return self.sample_rate
        allowed = self._allowed_rates()
        if allowed is None:
            low, high = PCM_RATE_RANGE
            return min(max(source_rate, low), high)
        return next((rate for rate in allowed if rate >= source_rate), allowed[-1])

    def output_bitrate_kbps(self, output_rate: int) -> int:
        """The lossy codec's total bitrate at output_rate: the configured one or a speech
        default. MP3 gets 64 kbit/s a channel (32 at MPEG-2.5 rates): at lower rates LAME's
        frames get too small for its gapless info tag, and decoders then also play its encoder
        delay. Opus is transparent for speech at 32 kbit/s a channel."""
        if self.bitrate_kbps is not None:
            return self.bitrate_kbps
        if self.container == "opus":
            return 32 * self.channels
        return (32 if mp3_version(output_rate) == 25 else 64) * self.channels

    def key(self) -> str:
        """A stable name of this exact format (part of an audio URL's identity)."""
        rate = "src" if self.sample_rate is None else str(self.sample_rate)
        bitrate = "auto" if self.bitrate_kbps is None else str(self.bitrate_kbps)
        return f"{self.container}-{rate}-{self.channels}ch-{bitrate}"


def _container(name: str) -> Container:
    lowered = name.strip().lower()
    lowered = _ALIASES.get(lowered, lowered)
    for container in CONTAINERS:
        if container == lowered:
            return container
    raise FormatError(f"unknown audio format {name!r}; use one of {', '.join(CONTAINERS)}")


def _parse_for_pydantic(value: object) -> AudioFormat:
    # pydantic reports a ValueError raised here as a validation error under the field's name.
    return AudioFormat.parse(value)


AudioFormatField = Annotated[
    AudioFormat,
    BeforeValidator(_parse_for_pydantic),
    PlainSerializer(lambda fmt: fmt.to_config(), return_type=Any),
]
"""An AudioFormat as a pydantic field: written as a name or a mapping in YAML and JSON."""
