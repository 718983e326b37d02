"""The Wyoming door's settings: the server Home Assistant's Wyoming integration talks to."""

from __future__ import annotations

from pydantic import Field

from tts_bridge.settings_base import Section


class WyomingSettings(Section):
    enabled: bool = True
    """Serve Home Assistant's Wyoming integration (TTS) on host:port."""
    host: str = "0.0.0.0"
    """Address the Wyoming server listens on (0.0.0.0 = every interface)."""
    port: int = Field(10200, ge=1, le=65535)
    """TCP port of the Wyoming server (10200 is the one Home Assistant's TTS add-ons use)."""
    name: str = Field("tts_bridge", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """TTS program name: Home Assistant's entry title and entity id (tts.<name>)."""
    zeroconf: bool = True
    """Announce the server on the LAN (_wyoming._tcp) so Home Assistant discovers it."""
    zeroconf_name: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,63}$")
    """Zeroconf instance name, distinct per bridge on a LAN; empty = the program name."""
    # Doors that hold: connections are bounded in number, and in time when a client stops reading.
    max_connections: int = Field(64, ge=1, le=100_000)
    """Connections open at once; past it a new one gets an error event (code busy) and is closed."""
    max_connections_per_peer: int = Field(8, ge=1, le=100_000)
    """Connections open at once from one client address (Home Assistant opens one per request)."""
    write_timeout_s: float = Field(30.0, ge=1.0, le=3600.0)
    """A client that does not read its audio for this long is dropped and its synthesis stopped."""
