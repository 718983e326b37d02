"""Wyoming TTS events <-> the bridge's terms: framing, requests, voices, info, audio chunks.

No sockets of its own, no threads, no pipeline: the front end (service/wyoming.py) reads with
`read_event` and builds its answers here. The event types themselves come from the `wyoming`
package; what is here is what it leaves to a server: refusing malformed frames with a reason
(its own reader turns any of them into a silent end of the connection), voice selection and
the sentence boundaries of a streamed text.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Info, TtsProgram, TtsVoice
from wyoming.version import __version__ as wyoming_version
from zeroconf import ServiceInfo

from tts_bridge.text.sentences import StreamCleaner, split_sentences
from tts_bridge.text.ssml import is_ssml
from tts_bridge.wire import JsonTooDeepError, encode_json, load_json, raw_size

SAMPLE_WIDTH = 2
"""Bytes per sample: the bridge's audio is 16-bit PCM."""
CHANNELS = 1
SAMPLES_PER_CHUNK = 2048
"""Samples per audio-chunk event: under 100 ms of audio, so a player can start at once, and
few enough events that a long answer is not mostly framing."""
SERVICE_TYPE = "_wyoming._tcp.local."
PROJECT_URL = ""
"""The bridge's own attribution link: it has no public home page to name."""

# Who made each engine's voices, for the info event (Home Assistant shows it).
_ENGINE_ATTRIBUTION: dict[str, tuple[str, str]] = {
    "piper": ("Piper (Open Home Foundation)", "https://github.com/OHF-Voice/piper1-gpl"),
    "hibari": ("hibari (Maureese Williams)", "https://github.com/MMWilliams/hibari"),
    "kokoro": ("Kokoro-82M (hexgrad)", "https://huggingface.co/hexgrad/Kokoro-82M"),
    "chattts": ("ChatTTS (2noise)", "https://github.com/2noise/ChatTTS"),
    "chattts-onnx": ("ChatTTS (2noise)", "https://github.com/2noise/ChatTTS"),
}


class WyomingRequestError(Exception):
    """A request the server refuses: sent back as an `error` event, then the connection closes.

    `code` is machine-readable (the speech pipeline's codes, or the ones of this module), the
    message is for people.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def error_event(code: str, message: str) -> Event:
    return Error(text=message, code=code).event()


# -- framing ---------------------------------------------------------------------------------


def _length(header: dict[str, Any], key: str, max_bytes: int) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WyomingRequestError("malformed_event", f"'{key}' must be a non-negative integer")
    if value > max_bytes:
        raise WyomingRequestError(
            "event_too_large", f"'{key}' is {value} bytes; the limit is {max_bytes}"
        )
    return value


def _parse_json(raw: bytes, what: str, max_depth: int) -> Any:
    try:
        return load_json(raw, max_depth)
    except JsonTooDeepError:
        raise WyomingRequestError(
            "malformed_event", f"{what} nests deeper than {max_depth} levels"
        ) from None
    except ValueError:
        raise WyomingRequestError("malformed_event", f"{what} is not JSON") from None


async def read_event(
    reader: asyncio.StreamReader, max_bytes: int, max_depth: int = 8
) -> Event | None:
    """The next event, or None at the end of the stream.

    The same framing as `wyoming.event.async_read_event` (a JSON header line, then
    `data_length` bytes of JSON merged into its data, then `payload_length` bytes), but a
    malformed or oversized frame raises WyomingRequestError instead of reading as the end.
    A connection closed inside a frame is the end of the stream too.
    """
    try:
        line = await reader.readline()
    except ValueError:  # asyncio's line limit (64 KiB) overrun
        raise WyomingRequestError("event_too_large", "the event header line is too long") from None
    if not line:
        return None
    if not line.endswith(b"\n"):
        return None  # the client went away in the middle of a header
    header = _parse_json(line, "the event header", max_depth)
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise WyomingRequestError("malformed_event", "an event is a JSON object with a 'type'")
    data = header.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WyomingRequestError("malformed_event", "an event's 'data' must be a JSON object")
    data_length = _length(header, "data_length", max_bytes)
    payload_length = _length(header, "payload_length", max_bytes)
    try:
        if data_length:
            extra = _parse_json(
                await reader.readexactly(data_length), "the event's data", max_depth
            )
            if not isinstance(extra, dict):
                raise WyomingRequestError(
                    "malformed_event", "an event's data must be a JSON object"
                )
            data = {**data, **extra}
        payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        return None
    return Event(type=header["type"], data=data, payload=payload)


def encode_event(event: Event) -> bytes:
    """An event as Wyoming frames it (a JSON header line, its data, its payload), like
    `wyoming.event.async_write_event`, but text UTF-8 cannot carry (a lone surrogate echoed
    from a ping) is escaped instead of failing the write."""
    header: dict[str, Any] = {"type": event.type, "version": wyoming_version}
    data = encode_json(event.data) if event.data else b""
    if data:
        header["data_length"] = len(data)
    if event.payload:
        header["payload_length"] = len(event.payload)
    return b"".join((encode_json(header), b"\n", data, event.payload or b""))


# -- requests --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestedVoice:
    """The `voice` of a synthesize or synthesize-start event."""

    name: str | None = None
    language: str | None = None
    speaker: str | None = None


def _optional_str(data: dict[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise WyomingRequestError("malformed_event", f"{where}.{key} must be a string")
    return value or None


def requested_voice(data: dict[str, Any]) -> RequestedVoice:
    """The voice an event asks for, read from its data.

    Read here rather than with `SynthesizeVoice.from_dict`, which in wyoming 1.7 turns a
    language-only voice into a voice *named* after the language.
    """
    voice = data.get("voice")
    if voice is None:
        return RequestedVoice()
    if not isinstance(voice, dict):
        raise WyomingRequestError("malformed_event", "'voice' must be a JSON object")
    return RequestedVoice(
        name=_optional_str(voice, "name", "voice"),
        language=_optional_str(voice, "language", "voice"),
        speaker=_optional_str(voice, "speaker", "voice"),
    )


def text_format_ssml(data: dict[str, Any]) -> bool | None:
    """A synthesize event's `text_format` (newer Wyoming clients): True for "ssml", False for
    any other format named, None when it is not given."""
    value = data.get("text_format")
    if value is None:
        return None
    return bool(value == "ssml")


def event_text(event: Event) -> str:
    """The `text` of a synthesize or synthesize-chunk event."""
    text = event.data.get("text")
    if not isinstance(text, str):
        raise WyomingRequestError("malformed_event", f"{event.type} needs a 'text' string")
    return text


@dataclass(frozen=True)
class VoiceEntry:
    """A configured voice as Wyoming clients see it."""

    name: str
    description: str
    languages: tuple[str, ...]
    engine: str


def primary_language(tag: str) -> str:
    """'en-US', 'en_US', 'EN' -> 'en': voices list their languages by primary subtag."""
    return tag.replace("_", "-").split("-")[0].lower()


def choose_voice(
    requested: RequestedVoice, voices: Sequence[VoiceEntry], default_voice: str
) -> tuple[str, str | None]:
    """(voice name, language to speak) for a request.

    A named voice wins and its language is its own (Home Assistant sends only the name). A
    language alone picks the default voice if it speaks it, else the first voice that does.
    Neither: the default voice.
    """
    by_name = {v.name: v for v in voices}
    if requested.name is not None:
        if requested.name not in by_name:
            raise WyomingRequestError(
                "unknown_voice",
                f"unknown voice {requested.name[:64]!r}; voices: {', '.join(sorted(by_name))}",
            )
        return requested.name, None
    if requested.language is None:
        return default_voice, None
    language = primary_language(requested.language)
    candidates = [by_name[default_voice]] if default_voice in by_name else []
    candidates += [v for v in voices if v.name != default_voice]
    for voice in candidates:
        if language in voice.languages:
            return voice.name, language
    raise WyomingRequestError(
        "unsupported_language", f"no voice speaks {requested.language[:32]!r}"
    )


class SentenceStream:
    """Text arriving in pieces -> complete sentences, as soon as the text shows they are.

    A sentence is complete when the splitter sees what follows its end ("...done. Now" ends
    "done."; "...done." alone may yet be "Dr."), so the last sentence waits for `finish`. Each
    piece is cleaned once, as it comes (`StreamCleaner`); only the unfinished sentence is
    split again, and it is bounded by the characters limit.
    """

    def __init__(self, max_raw_bytes: int | None = None, *, whole: bool = False) -> None:
        self._max_raw_bytes = max_raw_bytes
        self._cleaner = StreamCleaner()
        self._pending = ""
        self._whole = whole
        """SSML: one document, spoken once it is complete (a sentence cut out of it is not XML)."""
        self.chars = 0
        """Characters received, after cleaning."""
        self.raw_bytes = 0
        """Bytes received, before cleaning (UTF-8)."""

    def add(self, text: str) -> list[str]:
        """The sentences `text` completes; raises WyomingRequestError (text_too_long) once the
        raw stream passes `max_raw_bytes`, before cleaning any of it."""
        self.raw_bytes += raw_size(text)
        if self._max_raw_bytes is not None and self.raw_bytes > self._max_raw_bytes:
            raise WyomingRequestError(
                "text_too_long",
                f"the streamed text has more than {self._max_raw_bytes} bytes "
                "(limits.max_raw_text_bytes)",
            )
        cleaned = self._cleaner.feed(text)
        if not cleaned:
            return []
        self.chars += len(cleaned)
        self._pending += cleaned
        if self._whole or is_ssml(self._pending):
            self._whole = True
            return []
        pieces = split_sentences(self._pending)
        if len(pieces) < 2:
            return []
        done = len(self._pending) - len(pieces[-1])
        self._pending = self._pending[done:]
        return pieces[:-1]

    def finish(self) -> str:
        rest = self._cleaner.finish()
        self.chars += len(rest)
        text, self._pending = (self._pending + rest).strip(), ""
        return text


# -- answers ---------------------------------------------------------------------------------


def build_info(name: str, version: str, voices: Iterable[VoiceEntry]) -> Info:
    """The info event's content: one TTS program listing every voice.

    Home Assistant uses the first installed TTS program; its name becomes the entry title and
    the entity id, a voice's name is its id and its description what Home Assistant shows.
    """
    entries = [
        TtsVoice(
            name=voice.name,
            description=voice.description or voice.name,
            attribution=Attribution(*_ENGINE_ATTRIBUTION.get(voice.engine, (name, PROJECT_URL))),
            installed=True,
            version=None,
            languages=list(voice.languages),
            speakers=None,
        )
        for voice in voices
    ]
    program = TtsProgram(
        name=name,
        description="tts_bridge: cached, tiered text to speech",
        attribution=Attribution(name="tts_bridge", url=PROJECT_URL),
        installed=True,
        version=version,
        voices=entries,
        supports_synthesize_streaming=True,
    )
    return Info(tts=[program])


def audio_start(rate: int) -> Event:
    return AudioStart(rate=rate, width=SAMPLE_WIDTH, channels=CHANNELS).event()


def audio_stop() -> Event:
    return AudioStop().event()


def audio_chunks(pcm: bytes, rate: int) -> list[Event]:
    """16-bit mono PCM as audio-chunk events of at most SAMPLES_PER_CHUNK samples."""
    step = SAMPLES_PER_CHUNK * SAMPLE_WIDTH * CHANNELS
    return [
        AudioChunk(
            rate=rate, width=SAMPLE_WIDTH, channels=CHANNELS, audio=pcm[i : i + step]
        ).event()
        for i in range(0, len(pcm), step)
    ]


def service_info(instance: str, port: int, addresses: Sequence[str]) -> ServiceInfo:
    """The zeroconf record Home Assistant's Wyoming discovery looks for."""
    return ServiceInfo(
        SERVICE_TYPE,
        f"{instance}.{SERVICE_TYPE}",
        addresses=[socket.inet_aton(a) for a in addresses],
        port=port,
    )
