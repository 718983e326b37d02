"""Who may see and who may change through the web UI.

Three ways in. Home Assistant's sidebar (ingress): the Supervisor proxies the page and has
signed the user in; its requests carry ``X-Ingress-Path`` and are believed only from the
Supervisor's address (any other peer sending that header is refused). The LAN with
``http.api_keys`` set: the visitor signs in once with a key and holds a session cookie
(``HttpOnly``, ``SameSite=Strict``, in memory only: a restart signs everyone out). The LAN with
no keys: anyone who reaches the port may look and speak, and may change the bridge only when
``http.ui`` is ``on``.

Every state-changing request must come from the UI's own page: the browser says
``Sec-Fetch-Site: same-origin``, or (a browser without it) its ``Origin`` names this host (behind
ingress also the host the browser used); a cross-site form or script is refused whatever cookie
it carries. A TLS proxy in front that rewrites the Host header is then no obstacle either.
"""

from __future__ import annotations

import enum
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection

from aiohttp import web

from tts_bridge.web import origin
from tts_bridge.web.api_keys import ApiKeys

_LOGGER = logging.getLogger(__name__)

SUPERVISOR_ADDRESS = "172.30.32.2"
"""Home Assistant's Supervisor on the add-ons' network: the only peer that proxies ingress."""
INGRESS_HEADER = "X-Ingress-Path"
SESSION_COOKIE = "tts_bridge_session"
SESSION_TTL_S = 12 * 3600
MAX_SESSIONS = 256
"""Sessions held at once; signing in past it ends the oldest."""


class Level(enum.IntEnum):
    NONE = 0
    VIEW = 1
    """Look, and speak (as the speech API allows without a key)."""
    CHANGE = 2
    """Change the lexicon, voices, chimes and cache."""


class Sessions:
    """Signed-in browsers: random tokens with an expiry, in memory, bounded."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: OrderedDict[str, float] = OrderedDict()

    def open(self) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[token] = self._clock() + SESSION_TTL_S
            while len(self._tokens) > MAX_SESSIONS:
                self._tokens.popitem(last=False)
        return token

    def valid(self, token: str | None) -> bool:
        if not token:
            return False
        with self._lock:
            expiry = self._tokens.get(token)
            if expiry is None:
                return False
            if expiry < self._clock():
                del self._tokens[token]
                return False
            return True

    def close(self, token: str | None) -> None:
        with self._lock:
            self._tokens.pop(token or "", None)


class Access:
    """The UI's checks; `level` for a request, `require` to refuse one below a level."""

    def __init__(
        self,
        keys: ApiKeys,
        mode: str,
        ingress_peers: Collection[str] = (SUPERVISOR_ADDRESS,),
    ) -> None:
        """`mode`: http.ui ("on" or "read-only"); `ingress_peers`: addresses believed when
        they send X-Ingress-Path."""
        self.keys = keys
        self.mode = mode
        self.ingress_peers = frozenset(ingress_peers)
        self.sessions = Sessions()

    @staticmethod
    def via_ingress(request: web.Request) -> bool:
        return INGRESS_HEADER in request.headers

    def check_ingress(self, request: web.Request) -> None:
        """Refuse X-Ingress-Path from anyone but the Supervisor (it would skip the key)."""
        if self.via_ingress(request) and request.remote not in self.ingress_peers:
            _LOGGER.warning("Ingress request from %s refused: not the Supervisor", request.remote)
            raise web.HTTPForbidden(text="ingress requests come from the Supervisor only\n")

    def signed_in(self, request: web.Request) -> bool:
        return self.sessions.valid(request.cookies.get(SESSION_COOKIE))

    def level(self, request: web.Request) -> Level:
        if self.via_ingress(request):
            return Level.CHANGE if request.remote in self.ingress_peers else Level.NONE
        if self.keys.required:
            return Level.CHANGE if self.signed_in(request) else Level.NONE
        return Level.CHANGE if self.mode == "on" else Level.VIEW

    def notice(self, request: web.Request) -> str | None:
        """What a page that changes state says about who may change it (None: nothing)."""
        if self.via_ingress(request) or self.keys.required:
            return None
        if self.mode == "on":
            return (
                "Anyone on your network who reaches this page can change the bridge: no key is "
                "set. Set http.api_keys to ask for one, or http.ui: read-only."
            )
        return (
            "Read-only: no key is set, so this page cannot change the bridge from the network. "
            "Set http.api_keys (then sign in), or http.ui: on, or use Home Assistant's sidebar."
        )

    def same_origin(self, request: web.Request) -> bool:
        """The request comes from one of the UI's own pages (not another site's): see
        `origin.same_origin`; behind ingress also the host the browser used counts. A request
        with neither header is refused."""
        also: list[str] = []
        if self.via_ingress(request):
            forwarded = request.headers.get("X-Forwarded-Host")
            if forwarded:
                also.append(forwarded)
        return origin.same_origin(request, also) is True

    def require(self, request: web.Request, needed: Level, *, changes: bool) -> None:
        """Raise unless the request may do this (`changes`: it is a state-changing POST)."""
        self.check_ingress(request)
        if changes and not self.same_origin(request):
            _LOGGER.warning(
                "Web UI %s %s from %s refused: not from the UI's own page",
                request.method,
                request.path,
                request.remote,
            )
            raise web.HTTPForbidden(text="cross-origin request refused\n")
        if self.level(request) < needed:
            if self.keys.required and not self.via_ingress(request):
                raise web.HTTPUnauthorized(text="sign in with a key first\n")
            raise web.HTTPForbidden(text="the web UI is read-only here (see http.ui)\n")

    def sign_in(self, offered: str) -> str | None:
        """A new session's token when `offered` is one of the keys."""
        if not self.keys.required or not self.keys.allows(f"Bearer {offered}"):
            return None
        return self.sessions.open()
