"""The web door's settings: the audio URLs, the speech API and metrics on one HTTP server."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from tts_bridge.audio.formats import AudioFormat, AudioFormatField
from tts_bridge.settings_base import ExpandedPath, Section


class HttpSettings(Section):
    enabled: bool = True
    """Serve each answer's audio over HTTP at an unguessable URL (speakers that play URLs)."""
    host: str = "0.0.0.0"
    """Address to listen on; speakers on the LAN must reach it (127.0.0.1 = this machine only)."""
    port: int = Field(10201, ge=0, le=65535)
    """Port to listen on (0 = any free port, for tests)."""
    base_url: str | None = None
    """URL prefix speakers use to reach this server, e.g. http://192.168.1.20:10201 (behind a
    proxy or NAT); empty = http://<host, or this machine's LAN address>:<port>."""
    ttl_s: int = Field(3600, ge=10, le=30 * 86400)
    """How long an audio URL keeps working after its audio was last published."""
    max_mb: int = Field(64, ge=1)
    """Upper bound of the encoded audio kept on disk; what expires soonest goes first."""
    dir: ExpandedPath | None = None
    """Folder of the encoded audio files (0700); empty = 'http' inside cache.dir."""
    secret_file: ExpandedPath | None = None
    """Key that derives the URLs (made at first start, 0600), so a cached sentence keeps its URL
    across restarts; empty = 'http.key' in the folder of journal.path (the state folder)."""
    format: AudioFormatField = Field(default_factory=lambda: AudioFormat("mp3", 44100))
    """Format of the audio behind an answer's URL unless the target or request asks otherwise
    (MP3 at 44.1 kHz plays on Sonos, Cast, ESPHome and squeezelite)."""
    # The speech API and metrics on the same server.
    api_enabled: bool = True
    """Serve the OpenAI-compatible speech API (/v1/audio/speech, /v1/models, /v1/audio/voices)
    and /api/speak on this server."""
    api_keys: list[str] = Field(default_factory=list, repr=False)
    """Keys a client must send (Authorization: Bearer KEY) to use the speech API; empty (with no
    api_keys_file) = open to anyone who reaches the port, like the Wyoming server."""
    api_keys_file: ExpandedPath | None = None
    """A file of further keys, one per line ('#' starts a comment); read at start."""
    metrics: bool = True
    """Serve Prometheus metrics at /metrics (no request text in them)."""
    ui: Literal["on", "read-only", "off"] = "read-only"
    """The web UI at / (Home Assistant's sidebar through ingress, and the LAN): "on" lets it
    change the lexicon, voices, chimes and cache; "read-only" lets the LAN only look and speak
    unless http.api_keys are set and the visitor signs in with one (the sidebar may change
    them); "off" serves the plain status page at / instead."""
    # Doors that hold: connections are bounded in time and number.
    keepalive_s: float = Field(15.0, ge=1.0, le=3600.0)
    """An idle connection (between requests, or one whose request headers are still incomplete)
    is closed after this long."""
    max_connections: int = Field(256, ge=1, le=100_000)
    """Connections open at once; past it a new one is answered 503 and closed."""
    max_connections_per_peer: int = Field(32, ge=1, le=100_000)
    """Connections open at once from one client address; past it: 503."""

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().rstrip("/")
        if not re.match(r"^https?://[^/?#\s]+(/[^?#\s]*)?$", value):
            raise ValueError("must be an http:// or https:// URL without query or fragment")
        return value
