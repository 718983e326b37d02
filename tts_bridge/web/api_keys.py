"""Optional API keys for the HTTP speech API: ``Authorization: Bearer <key>``.

With no key configured the API is open to whoever reaches the port, as the Wyoming server is
(Home Assistant's Wyoming integration has no authentication either). Keys come from
``http.api_keys`` and ``http.api_keys_file`` (one a line, ``#`` starts a comment) and are compared
in constant time, every key every time, so neither a match nor its position leaks by timing.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from pathlib import Path

from tts_bridge.web.settings import HttpSettings

_LOGGER = logging.getLogger(__name__)

_SCHEME = "bearer"


class ApiKeysError(ValueError):
    """The keys file cannot be read."""


def read_keys_file(path: Path) -> list[str]:
    """The keys in a keys file: one a line, blank lines and '#' comments skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ApiKeysError(f"http.api_keys_file: cannot read {path}: {exc}") from exc
    keys = []
    for line in text.splitlines():
        key = line.split("#", 1)[0].strip()
        if key:
            keys.append(key)
    return keys


class ApiKeys:
    """The configured keys; `allows` checks a request's Authorization header."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = [key.encode() for key in keys if key]

    @classmethod
    def from_settings(cls, settings: HttpSettings) -> ApiKeys:
        keys = list(settings.api_keys)
        if settings.api_keys_file is not None:
            keys += read_keys_file(settings.api_keys_file)
        return cls(keys)

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def allows(self, authorization: str | None) -> bool:
        """True when no key is configured, or the header is ``Bearer`` and one of the keys."""
        if not self._keys:
            return True
        if not authorization:
            return False
        scheme, _, given = authorization.strip().partition(" ")
        if scheme.lower() != _SCHEME:
            return False
        offered = given.strip().encode()
        matched = False
        for key in self._keys:  # no early exit: the time does not depend on which key matched
            matched |= hmac.compare_digest(offered, key)
        return matched
