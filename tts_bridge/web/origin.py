"""Whether a browser says a request comes from another site.

A browser marks what a page sends: ``Sec-Fetch-Site`` (no page can set or remove it), or, from a
browser too old for that, ``Origin``. Programs (curl, Home Assistant's integrations, the
``openai`` package, another server) send neither. A page on any site can make a "simple" POST
(a form, or ``fetch`` with ``text/plain``) to any address a visitor's browser reaches, so what
the browser says is the only thing that tells the bridge's own pages from everyone else's.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from aiohttp import web


def same_origin(request: web.Request, also: Iterable[str] = ()) -> bool | None:
    """True when the browser says the request comes from this origin, False when from another
    (another site, a sibling on the same site, a sandboxed frame: ``Origin: null``), None when
    it carries neither header (not a browser's page). Without ``Sec-Fetch-Site`` the
    ``Origin``'s host:port must be the request's Host or one of `also` (hosts a trusted proxy
    in front says the browser used)."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site == "same-origin"
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    if origin == "null":
        return False
    return urlsplit(origin).netloc in {request.host, *also}
