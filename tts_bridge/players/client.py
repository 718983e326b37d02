"""Home Assistant's REST API, the three calls a media-player target needs: a player's state,
a media_player service call, and nothing else. Errors are PlayerError with the answer's code.

The token goes in the Authorization header only: it is never logged, and messages quote Home
Assistant's answer, never the request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

_LOGGER = logging.getLogger(__name__)

UNREACHABLE_CODE = "homeassistant_unreachable"
UNAUTHORIZED_CODE = "homeassistant_unauthorized"
TIMEOUT_CODE = "player_timeout"
NOT_FOUND_CODE = "player_not_found"
REFUSED_CODE = "player_refused"
_GATEWAY = {502, 503, 504}
"""What the Supervisor's proxy (or a reverse proxy) answers while Home Assistant restarts."""
_MAX_MESSAGE = 200


class PlayerError(Exception):
    """A player did not play (or its volume was not set); `code` is its outcome in the answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class HomeAssistantClient:
    """One aiohttp session to Home Assistant; use it from its event loop only."""

    def __init__(self, base_url: str, token: str, timeout_s: float) -> None:
        self._base = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def state(self, entity_id: str) -> dict[str, Any]:
        """GET /api/states/<entity>: {"state": ..., "attributes": {...}}."""
        body = await self._request("GET", f"/api/states/{entity_id}", None, entity_id)
        if not isinstance(body, dict):
            raise PlayerError(UNREACHABLE_CODE, "Home Assistant's answer is not a state")
        return body

    async def call(self, service: str, data: Mapping[str, Any]) -> None:
        """POST /api/services/media_player/<service>; returns when Home Assistant has run it."""
        entity = str(data.get("entity_id", ""))
        await self._request("POST", f"/api/services/media_player/{service}", data, entity)

    async def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None, entity: str
    ) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        try:
            async with self._session.request(method, self._base + path, json=body) as response:
                status = response.status
                text = (await response.text(errors="replace"))[:_MAX_MESSAGE]
                if status < 300:
                    return await response.json(content_type=None) if text else None
        except TimeoutError:
            # Home Assistant answers a service call once the platform has run it: a player that
            # takes this long is slow, not Home Assistant away (a state read is quick).
            code = TIMEOUT_CODE if method == "POST" else UNREACHABLE_CODE
            message = f"no answer from Home Assistant about {entity} in time"
            raise PlayerError(code, message) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise PlayerError(UNREACHABLE_CODE, f"cannot reach Home Assistant: {exc}") from None
        except asyncio.CancelledError:
            raise
        raise _refusal(status, text, entity, method)


def _refusal(status: int, text: str, entity: str, method: str) -> PlayerError:
    if status in (401, 403):
        return PlayerError(
            UNAUTHORIZED_CODE,
            f"Home Assistant refused the token (HTTP {status}); check homeassistant.token",
        )
    if status in _GATEWAY:
        return PlayerError(UNREACHABLE_CODE, f"Home Assistant is not answering (HTTP {status})")
    if status == 404 and method == "GET":
        return PlayerError(NOT_FOUND_CODE, f"Home Assistant has no entity {entity}")
    return PlayerError(
        REFUSED_CODE, f"Home Assistant refused the call for {entity} (HTTP {status}): {text}"
    )
