"""The MQTT door's settings: the broker connection, the journal of accepted requests, Home
Assistant's MQTT discovery and Rhasspy Hermes."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from tts_bridge.players.settings import HomeAssistantUrl, TokenFile
from tts_bridge.settings_base import (
    NAME_PATTERN,
    NAME_RE,
    ExpandedPath,
    Section,
    default_data_dir,
)

AUTO_CLIENT_ID = "auto"
"""mqtt.client_id that stands for one derived from the host and the state folder."""


def default_client_id(state_dir: Path | None = None) -> str:
    """``tts_bridge-<hash>`` of the host name and the state folder (where the journal lives):
    distinct for two installations on one broker, the same at every restart of one."""
    folder = (state_dir or default_data_dir()).expanduser().absolute()
    digest = hashlib.sha256(f"{socket.gethostname()}\0{folder}".encode()).hexdigest()
    return f"tts_bridge-{digest[:12]}"


class TlsSettings(Section):
    enabled: bool = False
    """Connect with TLS (usually port 8883)."""
    ca_file: ExpandedPath | None = None
    """CA certificate(s) that signed the broker's certificate; empty = the system's CAs."""
    cert_file: ExpandedPath | None = None
    """Client certificate, for brokers that require one."""
    key_file: ExpandedPath | None = None
    """Private key of the client certificate."""
    insecure: bool = False
    """Skip the host name check (only for testing; never in production)."""

    @model_validator(mode="after")
    def _check_files(self) -> TlsSettings:
        # ssl reports a missing file as a bare "[Errno 2] No such file or directory" at the
        # first connect, without its name; here it is named before anything starts.
        if not self.enabled:
            return self
        for key in ("ca_file", "cert_file", "key_file"):
            path: Path | None = getattr(self, key)
            if path is not None and not path.is_file():
                raise ValueError(
                    f"{key}: no such file {path} (give the file's full path, or leave "
                    f"{key} empty{' to use the system CAs' if key == 'ca_file' else ''})"
                )
        return self


class MqttSettings(Section):
    host: str = "127.0.0.1"
    """Broker host name or address."""
    port: int = Field(1883, ge=1, le=65535)
    """Broker port."""
    base_topic: str = "tts_bridge"
    """Prefix of every topic the bridge uses."""
    client_id: str = Field(AUTO_CLIENT_ID, min_length=1, max_length=128)
    """MQTT client id; stable so the broker keeps the bridge's session while it is away, and
    distinct per installation (two bridges with one id take the session from each other).
    "auto" = tts_bridge-<hash of the host name and the journal's folder>."""
    username: str | None = None
    """User name for the broker (optional)."""
    password: str | None = Field(None, repr=False)
    """Password for the broker (optional, never logged)."""
    password_file: ExpandedPath | None = None
    """File whose first line is the password (keeps it out of the config file)."""
    tls: TlsSettings = Field(default_factory=TlsSettings)
    session_expiry_s: int = Field(86400, ge=0)
    """How long the broker keeps the bridge's session (and queues requests) while it is away."""
    share_group: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Several bridges in one group share the say topics (MQTT 5 shared subscription)."""
    max_message_bytes: int | None = Field(None, ge=1024)
    """The broker's message size limit if it has one (mosquitto message_size_limit); audio
    bigger than this (or the Maximum Packet Size the broker announces) is sent per sentence."""
    max_queued_messages: int = Field(0, ge=0)
    """Outgoing messages paho may hold beyond its in-flight window (0 = no limit). A limit drops
    answers under a burst (measured: 1000 requests lost ~200 answers with 1000), and the
    bridge already bounds what it produces by limits.max_queue, so no limit is the default."""
    keepalive_s: int = Field(60, ge=5, le=3600)
    """MQTT keepalive interval."""
    audio_expiry_s: int = Field(300, ge=0)
    """Message expiry on audio messages, so a stale announcement does not play later (0 = none)."""
    reconnect_max_delay_s: int = Field(30, ge=1, le=600)
    """Upper bound of the reconnect backoff."""
    response_topics: list[str] = Field(default_factory=list)
    """Topic filters an MQTT 5 Response Topic must match (e.g. ["clients/#"]); empty = any
    topic outside the bridge's own, Home Assistant discovery and Hermes topics."""

    @field_validator("response_topics")
    @classmethod
    def _check_response_topics(cls, filters: list[str]) -> list[str]:
        for topic_filter in filters:
            levels = topic_filter.split("/")
            if (
                not topic_filter
                or "\x00" in topic_filter
                or "#" in levels[:-1]
                or any(("+" in lv or "#" in lv) and len(lv) > 1 for lv in levels)
            ):
                raise ValueError(f"{topic_filter!r} is not an MQTT topic filter")
        return filters

    @field_validator("client_id")
    @classmethod
    def _resolve_client_id(cls, value: str) -> str:
        # Settings resolves it again for the configured journal folder.
        return default_client_id() if value == AUTO_CLIENT_ID else value

    @field_validator("base_topic")
    @classmethod
    def _check_base_topic(cls, value: str) -> str:
        value = value.strip("/")
        if not value or any(c in value for c in "+#\x00") or value.startswith("$"):
            raise ValueError("must be a non-empty topic without wildcards, NUL or a leading '$'")
        return value


class JournalSettings(Section):
    path: ExpandedPath = Field(default_factory=lambda: default_data_dir() / "journal.sqlite3")
    """Durable journal of accepted requests (created 0600 in a 0700 folder)."""
    keep_done_s: int = Field(86400, ge=60)
    """How long answered requests are remembered to answer redelivered duplicates."""


class HomeAssistantSettings(Section):
    discovery: bool = True
    """Publish MQTT device discovery so Home Assistant shows the bridge by itself."""
    prefix: str = Field("homeassistant", pattern=r"^[A-Za-z0-9_/-]{1,64}$")
    """Home Assistant's discovery prefix."""
    node_id: str = Field("tts_bridge", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Device id in Home Assistant; distinct per bridge."""
    targets: list[str] = Field(default_factory=lambda: ["default"])
    """Speakers (say targets) that get a notify entity each."""
    url: HomeAssistantUrl = None
    """Home Assistant's address for targets with media_players, e.g.
    http://homeassistant.local:8123; empty = the Supervisor's proxy inside the add-on."""
    token: str | None = Field(None, repr=False)
    """A long-lived access token for `url` (never logged)."""
    token_file: TokenFile = None
    """File whose first line is the token (keeps it out of the config file)."""

    @field_validator("targets")
    @classmethod
    def _check_targets(cls, targets: list[str]) -> list[str]:
        for target in targets:
            if not NAME_RE.match(target):
                raise ValueError(f"target {target!r} must match {NAME_PATTERN}")
        if len(set(targets)) != len(targets):
            raise ValueError("targets must be distinct")
        return targets


class HermesSettings(Section):
    enabled: bool = False
    """Answer Rhasspy Hermes hermes/tts/say requests."""
    finish_margin_s: float = Field(2.0, ge=0.0, le=60.0)
    """sayFinished goes out after playFinished, or after the audio's length plus this margin."""
    voice: str | None = None
    """Voice for Hermes requests; empty = the default voice."""
