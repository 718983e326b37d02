"""What an answer's audio becomes for its target: the bytes on <base>/audio/<target> (the WAV as
rendered, or encoded in the target's or the request's format), a small link message for devices
that fetch, and the URL every answer carries while the HTTP audio server is on.

It runs on the synthesis worker that rendered the answer: encoding is CPU work, and the HTTP
server's event loop only streams files. A URL names the samples themselves (see
`http.content_key`), not the sentence cache keys: those name what was asked for, and an idle
upgrade puts other audio under the same key. A repeat served from the cache is the same samples,
so it gets the same URL without encoding again; an upgraded rendering gets a new one.
"""

from __future__ import annotations

import builtins
import logging
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from tts_bridge.audio.codec import EncodeError, encode
from tts_bridge.audio.formats import AudioFormat
from tts_bridge.config import Settings
from tts_bridge.players.lead import padded
from tts_bridge.speech.pipeline import SpeechError
from tts_bridge.speech.synthesis import Rendering
from tts_bridge.wire import encode_json

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishedAudio:
    """Audio an answer's URL serves (made by the HTTP audio server's `publish`)."""

    url: str
    token: str
    format: AudioFormat
    content_type: str
    bytes: int
    duration_ms: int
    expires_at: float
    encoded: bool
    """False when the same audio in the same format was already stored (no encoding done)."""
    data: builtins.bytes | None = field(default=None, repr=False, compare=False)
    """The bytes just encoded and stored (None for a repeat: they are in the store)."""


class AudioPublisher(Protocol):
    """What delivery needs of the HTTP audio server: the doors reach it through this, so that
    no door imports another (the web door's `AudioServer` is one)."""

    @property
    def bound(self) -> bool: ...

    def publish(
        self,
        audio: npt.NDArray[np.generic],
        sample_rate: int,
        fmt: AudioFormat | None = None,
        ttl_s: float | None = None,
        key: str | None = None,
    ) -> PublishedAudio: ...

    def read(self, published: PublishedAudio) -> builtins.bytes | None: ...


class DeliveryError(SpeechError):
    """The audio a target needs cannot be made; `code` is the answer's error code."""


@dataclass(frozen=True)
class TargetAudio:
    """How one answer reaches its target: from the target's configuration and the request."""

    format: AudioFormat | None
    """The format asked for (request, then target); None = the rendered WAV on the topic."""
    url_format: AudioFormat
    """The format behind the answer's URL: `format`, else http.format."""
    payload: Literal["audio", "url"]

    @property
    def topic_needs_delivery(self) -> bool:
        """True when the audio topic carries something made here (encoded bytes or a link), so
        it waits for `AudioDelivery.deliver`; False when it carries the rendered WAV."""
        return self.payload == "url" or self.format is not None


@dataclass(frozen=True)
class Delivered:
    """What `deliver` made."""

    data: bytes | None
    """The encoded audio for the topic (None when the topic takes the WAV or a link)."""
    format: AudioFormat | None
    published: PublishedAudio | None
    """The answer's URL; None when the HTTP server is off or could not store the audio."""

    @property
    def size(self) -> int:
        """Bytes of the audio behind the URL (0 without one)."""
        return self.published.bytes if self.published is not None else 0

    def answer_fields(self) -> dict[str, object]:
        """The fields the say answer gains."""
        if self.published is None:
            return {}
        return {
            "url": self.published.url,
            "format": self.published.format.container,
            "content_type": self.published.content_type,
        }


class AudioDelivery:
    """Per-target formats and the audio server's URLs; `deliver` from worker threads only."""

    def __init__(self, settings: Settings, server: AudioPublisher | None) -> None:
        self._settings = settings
        self._server = server

    @property
    def serving(self) -> bool:
        """True when answers get URLs (the server is configured and has listened)."""
        return self._server is not None and self._server.bound

    def for_target(self, target: str, requested: AudioFormat | None = None) -> TargetAudio:
        configured = self._settings.targets.get(target)
        fmt = requested or (configured.audio_format if configured is not None else None)
        return TargetAudio(
            format=fmt,
            url_format=fmt or self._settings.http.format,
            payload=configured.payload if configured is not None else "audio",
        )

    def with_lead(self, target: str, rendering: Rendering) -> Rendering:
        """The rendering as `target` gets it, with its lead-in and lead-out silence
        (targets.<t>.lead_in_ms, lead_out_ms); the cache keeps the audio without them."""
        configured = self._settings.targets.get(target)
        if configured is None:
            return rendering
        return padded(rendering, configured.lead_in_ms, configured.lead_out_ms)

    def deliver(self, plan: TargetAudio, rendering: Rendering) -> Delivered:
        """Publish the audio for the answer's URL (when serving) and encode what the topic
        carries. Raises DeliveryError when the topic's audio cannot be made; a URL alone that
        cannot be stored is logged and left out."""
        needs_url = plan.payload == "url"
        published: PublishedAudio | None = None
        if self.serving:
            assert self._server is not None
            try:
                published = self._server.publish(
                    rendering.pcm, rendering.sample_rate, plan.url_format
                )
            except EncodeError as exc:
                if needs_url or plan.format is not None:
                    raise DeliveryError("encoding_failed", str(exc)) from exc
                _LOGGER.error("No URL for this answer: %s", exc)
            except OSError as exc:  # the store's folder: full, or not writable
                if needs_url:
                    message = f"cannot store the audio: {exc}"
                    raise DeliveryError("url_unavailable", message) from exc
                _LOGGER.error("No URL for this answer: cannot store the audio: %s", exc)
        elif needs_url:
            raise DeliveryError(
                "url_unavailable",
                "this target takes a URL and the HTTP audio server is not running (see the log)",
            )
        data: bytes | None = None
        if plan.format is not None and plan.payload == "audio":
            if published is not None:  # its format is plan.format (`for_target`)
                assert self._server is not None
                # Just encoded: those bytes; a repeat: the stored ones, no encoding.
                data = published.data or self._server.read(published)
            if data is None:
                try:
                    data = encode(rendering.pcm, rendering.sample_rate, plan.format).data
                except EncodeError as exc:
                    raise DeliveryError("encoding_failed", str(exc)) from exc
        return Delivered(data=data, format=plan.format, published=published)


def link_message(request_id: str | int, published: PublishedAudio) -> bytes:
    """The audio topic's payload for a target that fetches: small enough for any MQTT client."""
    return encode_json(
        {
            "url": published.url,
            "id": request_id,
            "duration_ms": published.duration_ms,
            "format": published.format.container,
        }
    )
