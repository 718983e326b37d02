"""One speech request, as every door hands it to the speech core.

Each door's codec turns its own wire format (an MQTT say payload, a Hermes say, a Wyoming
synthesize event, an HTTP body) into a `SpeechRequest`; validation, routing and the scheduler
take it whole, so a new field reaches them without a new parameter on each function between.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tts_bridge.engines.base import Tier
from tts_bridge.speech.scheduler import Priority
from tts_bridge.speech.settings import TargetSettings
from tts_bridge.wire import new_id


@dataclass(frozen=True)
class Announcement:
    """How a request is presented beyond its words: chimes (a name, "" for none, None for the
    default: the preset's, else the door's `default_chime`)."""

    chime: str | None = None
    chime_after: str | None = None
    default_chime: str | None = None
    """The say target's chime (targets.<t>.chime)."""
    default_chime_after: str | None = None
    ssml: bool | None = None
    """True: the text is SSML; False: spoken as written; None: SSML if it starts with <speak>."""


@dataclass(frozen=True, kw_only=True)
class SpeechRequest:
    """What to say, how, and for whom: built by a door's codec, taken whole by the core."""

    text: str
    id: str | int = field(default_factory=new_id)
    voice: str | None = None
    """A voice or preset name; None = the default voice."""
    language: str | None = None
    """The language asked for; None = detected per sentence."""
    options: Mapping[str, object] | None = None
    """Synthesis options (speed, temperature, ...), checked against the voice's engine."""
    format: str | None = None
    """The audio container asked for (the door encodes it); None = the door's default."""
    priority: Priority = "normal"
    """Its place in the queue: alert > high > normal > low."""
    chime: str | None = None
    """Chime before the speech ("" = none); None = the voice preset's or `default_chime`."""
    chime_after: str | None = None
    default_chime: str | None = None
    """The door's or say target's chime, when neither the request nor its preset names one."""
    default_chime_after: str | None = None
    ssml: bool | None = None
    """True: the text is SSML; False: spoken as written; None: SSML if it starts with <speak>."""
    door: str = "other"
    """The front end it came through (mqtt, hermes, wyoming, http): its share of the queue."""
    peer: str | None = None
    """The client's address where the door knows it (Wyoming, HTTP): its share of the queue."""
    target: str = "default"
    """Where the answer goes: the MQTT say target, the Hermes site, or the door's name."""
    tier: Tier | None = None
    """A forced tier; None = routed by the latency budget."""
    use_cache: bool = True
    stream: bool = True
    """Send the audio as it is made, where the door and format allow it."""
    volume: float | None = None
    """A factor on the answer's samples (Hermes' volume, a say target's gain); None = 1."""
    budget_ms: int | None = None
    """The request's own deadline: the latency budget it is routed by (None: the bridge's)."""
    received: float = field(default_factory=time.monotonic)
    """time.monotonic() when the request arrived."""

    @property
    def announcement(self) -> Announcement:
        return Announcement(
            chime=self.chime,
            chime_after=self.chime_after,
            default_chime=self.default_chime,
            default_chime_after=self.default_chime_after,
            ssml=self.ssml,
        )


def with_target_defaults(request: SpeechRequest, target: TargetSettings | None) -> SpeechRequest:
    """`request` with what its say target (targets.<t>) gives every request to it, whichever
    door it came through: the target's chimes where the request names none, and its gain as
    the volume factor (applied after the cache, which keeps full-scale audio)."""
    if target is None:
        return request
    return replace(
        request,
        default_chime=target.chime,
        default_chime_after=target.chime_after,
        volume=10 ** (target.gain_db / 20) if target.gain_db else request.volume,
    )
