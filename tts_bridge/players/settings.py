"""The setting types of media-player targets and of the Home Assistant connection.

Only types and checks live here (config.py uses them for its fields); nothing here imports the
settings, so the settings can import this module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator

ENTITY_PATTERN = r"^media_player\.[a-z0-9_]{1,200}$"
_ENTITY_RE = re.compile(ENTITY_PATTERN)
MAX_LEAD_MS = 10_000
"""Longest lead-in or lead-out: a speaker that needs more than this is not waking late."""


def _check_players(entities: list[str]) -> list[str]:
    for entity in entities:
        if not _ENTITY_RE.match(entity):
            raise ValueError(
                f"{entity!r} is not a media player's entity id (like media_player.kitchen)"
            )
    if len(set(entities)) != len(entities):
        raise ValueError("media players must be distinct")
    return entities


def _check_url(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().rstrip("/")
    if not re.match(r"^https?://[^/?#\s]+(/[^?#\s]*)?$", value):
        raise ValueError(
            "must be Home Assistant's http:// or https:// address, e.g. http://homeassistant.local:8123"
        )
    return value


def _expand(path: Path | None) -> Path | None:
    # Read when the service is built (a missing file is logged there), like api_keys_file.
    return None if path is None else path.expanduser()


MediaPlayers = Annotated[list[str], AfterValidator(_check_players)]
"""Entity ids of Home Assistant media players (media_player.kitchen)."""
HomeAssistantUrl = Annotated[str | None, AfterValidator(_check_url)]
TokenFile = Annotated[Path | None, AfterValidator(_expand)]
VolumeRestore = Literal["bridge", "player"]
"""Who puts a player's volume back after an announcement: the bridge (it notes the volume,
sets the announcement's, and restores it) or the player itself (the volume goes to the player
with the announcement, as play_media's extra.volume, which Sonos takes)."""
