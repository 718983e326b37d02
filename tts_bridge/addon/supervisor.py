"""A small client of the Home Assistant Supervisor's REST API, as an add-on sees it.

The Supervisor gives every add-on a token (``SUPERVISOR_TOKEN``) and answers at
``http://supervisor``. The bridge asks it for the MQTT broker's address and login (the services
API, filled by the Mosquitto add-on), announces its Wyoming server (the discovery API, which makes
Home Assistant show "Discovered"), and reads where speakers on the LAN can reach the audio URLs
(the add-on's published port and the host's address). urllib is enough for four small JSON
requests made once at start.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_LOGGER = logging.getLogger(__name__)

DEFAULT_URL = "http://supervisor"
URL_ENV = "SUPERVISOR_URL"
"""Overrides the Supervisor's address (tests and the docker check run a stand-in)."""
TOKEN_ENV = "SUPERVISOR_TOKEN"


class SupervisorError(Exception):
    """The Supervisor did not answer, or refused; the message says which request and why."""


@dataclass(frozen=True)
class MqttService:
    """The broker the Supervisor's MQTT service names (the Mosquitto add-on's, usually)."""

    host: str
    port: int
    username: str | None
    password: str | None
    ssl: bool


class SupervisorClient:
    def __init__(self, token: str, base_url: str = DEFAULT_URL, timeout_s: float = 10.0) -> None:
        self._token = token
        self.base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SupervisorClient | None:
        """The client for this add-on; None outside one (no token)."""
        token = environ.get(TOKEN_ENV)
        if not token:
            return None
        return cls(token, environ.get(URL_ENV) or DEFAULT_URL)

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """The ``data`` of the Supervisor's ``{"result": "ok", "data": ...}`` answer."""
        what = f"{method} {self.base_url}{path}"
        request = urllib.request.Request(
            self.base_url + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise SupervisorError(f"{what}: HTTP {exc.code} {_message(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SupervisorError(f"{what}: no answer ({reason})") from None
        try:
            answer = json.loads(raw)
        except ValueError:
            raise SupervisorError(f"{what}: the answer is not JSON") from None
        if not isinstance(answer, dict) or answer.get("result") != "ok":
            raise SupervisorError(f"{what}: {_message(raw)}")
        return answer.get("data") or {}

    def mqtt_service(self) -> MqttService | None:
        """The MQTT service's broker; None when no add-on provides one (Mosquitto not
        installed). Raises SupervisorError when the Supervisor does not answer."""
        try:
            data = self.request("GET", "/services/mqtt")
        except SupervisorError as exc:
            # The Supervisor answers 400 "Service not enabled" when no add-on provides it.
            if "HTTP 400" in str(exc) or "HTTP 404" in str(exc):
                _LOGGER.debug("No MQTT service: %s", exc)
                return None
            raise
        try:
            return MqttService(
                host=str(data["host"]),
                port=int(data["port"]),
                username=data.get("username") or None,
                password=data.get("password") or None,
                ssl=bool(data.get("ssl", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SupervisorError(f"GET /services/mqtt: unexpected answer ({exc!r})") from None

    def announce(self, service: str, config: Mapping[str, Any]) -> str:
        """Send a discovery message (Home Assistant then offers to add the integration);
        returns its uuid."""
        data = self.request("POST", "/discovery", {"service": service, "config": dict(config)})
        return str(data.get("uuid", "")) if isinstance(data, dict) else ""

    def published_port(self, container_port: str) -> int | None:
        """The host port the user mapped ``container_port`` (e.g. "10201/tcp") to; None when
        it is not published."""
        info = self.request("GET", "/addons/self/info")
        network = info.get("network") if isinstance(info, dict) else None
        value = network.get(container_port) if isinstance(network, dict) else None
        return int(value) if isinstance(value, int) and value > 0 else None

    def host_address(self) -> str | None:
        """The IPv4 address of the host's primary interface (what speakers on the LAN reach)."""
        info = self.request("GET", "/network/info")
        interfaces = info.get("interfaces", []) if isinstance(info, dict) else []
        for interface in sorted(interfaces, key=lambda i: not i.get("primary")):
            for address in (interface.get("ipv4") or {}).get("address") or []:
                return str(address).split("/", 1)[0]
        return None


def _message(raw: bytes) -> str:
    try:
        answer = json.loads(raw)
    except ValueError:
        return raw[:200].decode(errors="replace").strip()
    if isinstance(answer, dict) and answer.get("message"):
        return str(answer["message"])
    return str(answer)[:200]
