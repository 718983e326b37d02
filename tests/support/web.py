"""HTTP requests to a test's own audio server, on loopback only."""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit


def raw_request(
    port: int, method: str, target: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request to 127.0.0.1:port with the target sent exactly as given (no client-side
    normalization, so path tricks reach the server as written): status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def fetch(
    url: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """``raw_request`` for a URL the bridge handed out, which must point at loopback."""
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1", f"a test URL must be on loopback: {url}"
    assert parts.port is not None, f"a test URL names its port: {url}"
    return raw_request(parts.port, method, parts.path, headers)
