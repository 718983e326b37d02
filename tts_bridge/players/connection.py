"""Where Home Assistant is and the token to use: homeassistant.url with homeassistant.token (or
token_file), else, inside the add-on, the Supervisor's proxy of Home Assistant's API with the
add-on's own token (SUPERVISOR_TOKEN; the add-on's config.yaml grants it with
homeassistant_api). The token is kept out of every repr and log line."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from tts_bridge.config import Settings

_LOGGER = logging.getLogger(__name__)

SUPERVISOR_TOKEN_ENV = "SUPERVISOR_TOKEN"
SUPERVISOR_URL_ENV = "SUPERVISOR_URL"
SUPERVISOR_URL = "http://supervisor"
SUPERVISOR_CORE_PATH = "/core"
"""The Supervisor's proxy: <supervisor>/core/api/... is Home Assistant's /api/..."""


@dataclass(frozen=True)
class HomeAssistantConnection:
    url: str
    """Home Assistant's address (the REST API is <url>/api/...)."""
    token: str = field(repr=False)
    via: str
    """Where it came from, for the log: the settings or the Supervisor."""


def connection(settings: Settings, environ: Mapping[str, str]) -> HomeAssistantConnection | None:
    """The connection to use; None (logged) when there is none."""
    ha = settings.homeassistant
    if ha.url is not None:
        token = ha.token
        if ha.token_file is not None:
            try:
                lines = ha.token_file.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                _LOGGER.error("Cannot read homeassistant.token_file %s: %s", ha.token_file, exc)
                return None
            token = lines[0].strip() if lines else ""
        if not token:
            _LOGGER.error(
                "homeassistant.url is set but there is no token (homeassistant.token, "
                "TTS_BRIDGE_HOMEASSISTANT__TOKEN or homeassistant.token_file): media players "
                "will not play"
            )
            return None
        return HomeAssistantConnection(ha.url, token, "homeassistant.url")
    supervisor_token = environ.get(SUPERVISOR_TOKEN_ENV)
    if supervisor_token:
        base = environ.get(SUPERVISOR_URL_ENV, SUPERVISOR_URL).rstrip("/")
        return HomeAssistantConnection(base + SUPERVISOR_CORE_PATH, supervisor_token, "Supervisor")
    return None
