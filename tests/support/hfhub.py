"""A Hugging Face-compatible file server on loopback, for the download tests.

It serves what ``huggingface_hub.hf_hub_download`` asks for, and only that:
``HEAD`` and ``GET`` on ``/<org>/<repo>/resolve/<revision>/<path>`` with the headers the client
reads (``X-Repo-Commit``, ``ETag``, ``Content-Length``, ``Accept-Ranges``), ``Range: bytes=N-``
for a resumed transfer, and 404s carrying the ``X-Error-Code`` the client turns into its error
types. Faults are injected per file: ``drop_once`` sends half the body and closes the
connection, once; ``fail`` answers a GET with 500 (the HEAD still succeeds). Every request is
logged.

``hub`` (the fixture) starts one, points ``HF_ENDPOINT`` at it and switches the client's offline
mode off (a ChatTTS import earlier in the test run sets ``HF_HUB_OFFLINE``).
"""

from __future__ import annotations

import hashlib
import http.server
import socket
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class Request:
    method: str
    repo: str
    revision: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    """Repositories (repo -> revision -> path -> bytes) and the faults to inject."""

    repos: dict[str, dict[str, dict[str, bytes]]] = field(default_factory=dict)
    drop_once: set[str] = field(default_factory=set)
    fail: set[str] = field(default_factory=set)
    log: list[Request] = field(default_factory=list)
    url: str = ""

    def add(self, repo: str, revision: str, files: dict[str, bytes]) -> None:
        self.repos.setdefault(repo, {}).setdefault(revision, {}).update(files)

    def gets(self, path: str) -> list[Request]:
        return [r for r in self.log if r.method == "GET" and r.path == path]

    def commit(self, revision: str) -> str:
        """A 40-hex commit for a revision (a commit hash is its own commit)."""
        if len(revision) == 40:
            return revision
        return hashlib.sha1(revision.encode()).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        hub = self.server.hub
        parts = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(404, "RepoNotFound")
        repo, revision, path = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        hub.log.append(Request(self.command, repo, revision, path, self.headers.get("Range")))
        data = self._find(repo, revision, path)
        if data is None:
            return
        start = 0
        wanted = self.headers.get("Range")
        if wanted and wanted.startswith("bytes=") and body:
            start = int(wanted[len("bytes=") :].split("-")[0])
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", hub.commit(revision))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        if path in hub.drop_once and not start:
            hub.drop_once.discard(path)
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data[start:])

    def _find(self, repo: str, revision: str, path: str) -> bytes | None:
        """The file's bytes, or None once the error answer is sent."""
        hub = self.server.hub
        files = hub.repos.get(repo, {}).get(revision)
        if repo not in hub.repos:
            self._error(404, "RepoNotFound")
        elif files is None:
            self._error(404, "RevisionNotFound")
        elif path not in files:
            self._error(404, "EntryNotFound", hub.commit(revision))
        elif path in hub.fail and self.command == "GET":
            self._error(500, "")
        else:
            return files[path]
        return None

    def _error(self, status: int, code: str, commit: str | None = None) -> None:
        payload = b'{"error": "not found"}' if status == 404 else b'{"error": "server error"}'
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: FakeHub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Tests cut downloads short on purpose (a full disk, a dropped connection): a client
        # that hung up is what they provoke, not a fault of the fake hub worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A loopback hub with HF_ENDPOINT pointing at it (no test ever reaches a real hub)."""
    from huggingface_hub import constants

    fake = FakeHub()
    server = _Server(fake)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
