"""The HTTP audio server: each answer's audio at a stable, unguessable URL for speakers that play
URLs (Sonos, Google Cast, ESPHome, squeezelite, Home Assistant media players).

It runs aiohttp on its own thread and event loop, so the thread-based service never blocks on the
network and the network never waits for encoding: publish() encodes on the caller's thread, and
the loop only streams files. GET and HEAD are served with byte ranges (aiohttp's FileResponse:
206, 416, Accept-Ranges, Content-Length), which Sonos and Cast use. ``/audio/<token>.<extension>``
and, when the service gives one, the status page at ``/`` and the health report at ``/health``
(JSON, for the container's health check) exist, with the routes the service adds (`Routes`: the
speech API, metrics); any other path, and any token the store does not hold, is a 404 (path
tricks included: a name is exactly a token and an extension, never a path).

The server is open to the LAN, so it holds: idle connections close after http.keepalive_s (also
a request whose headers are still incomplete then), and connections are capped in total and per
client address (past a cap: a bare 503 with Retry-After, and closed, before aiohttp sees the
connection). Responses carry
`X-Content-Type-Options: nosniff` and no version banner. An audio URL's ETag is derived from its
token (one token is one content) and Last-Modified is when the file was made, never its expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from aiohttp import web

from tts_bridge.audio.codec import duration_ms, encode
from tts_bridge.audio.formats import AudioFormat
from tts_bridge.config import Settings
from tts_bridge.speech.delivery import PublishedAudio
from tts_bridge.system.connections import (
    LISTEN_BACKLOG,
    ConnectionCaps,
    ConnectionGate,
    GatedProtocol,
    LoopFaults,
)
from tts_bridge.web.audio_store import AudioStore
from tts_bridge.web.settings import HttpSettings
from tts_bridge.wire import encode_json

_LOGGER = logging.getLogger(__name__)
_ROUTE_PREFIX = "/audio/"
_ANY_ADDRESS = ("0.0.0.0", "::", "")
SERVER_NAME = "tts_bridge"
"""The Server header: no version banner."""
RETRY_AFTER_S = 5
_SECURITY_HEADERS = {"Server": SERVER_NAME, "X-Content-Type-Options": "nosniff"}


def busy_response(limit: str) -> bytes:
    """The whole answer to a connection past a cap: written before any HTTP parsing."""
    body = f"busy: {limit} reached; retry later\n".encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        f"Retry-After: {RETRY_AFTER_S}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in _SECURITY_HEADERS.items())
        + "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def audio_etag(token: str, size: int) -> str:
    """The same for every copy of one token's file (the token names the content)."""
    return f"{token[:16]}-{size:x}"


def content_key(audio: npt.NDArray[np.generic], sample_rate: int) -> str:
    """A name of exactly this audio: the same samples get the same URL."""
    array = np.ascontiguousarray(audio)
    digest = hashlib.sha256(f"{sample_rate}:{array.dtype.str}:{array.shape}:".encode())
    digest.update(array.tobytes())
    return "pcm:" + digest.hexdigest()


def lan_address() -> str:
    """This machine's address on its default route, without sending anything (a UDP socket's
    connect only picks the route); 127.0.0.1 when there is none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 9))
            address: str = probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"
    return address


class Routes(Protocol):
    """More routes on this server (the speech API, metrics), added before it listens."""

    def register(self, app: web.Application) -> None: ...


class AudioServer:
    """start() binds (raising if the port is taken), stop() closes; publish() from any thread."""

    def __init__(
        self,
        settings: HttpSettings,
        store: AudioStore,
        clock: Callable[[], float] = time.time,
        status_page: Callable[[], str] | None = None,
        caps: ConnectionCaps | None = None,
        *,
        health_report: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """`status_page` renders the HTML served at ``/`` (off, a 404, without one); it runs on
        a worker thread of the server's loop, so it may take locks. `caps` are the connection
        caps fitted under the open-file limit (default: the settings' own)."""
        self.settings = settings
        self.gate = ConnectionGate(
            "http",
            caps.http if caps is not None else settings.max_connections,
            caps.http_per_peer if caps is not None else settings.max_connections_per_peer,
        )
        self.faults = LoopFaults("HTTP")
        self.status_page = status_page
        self.health_report = health_report
        """The bridge's health (``status`` ok or degraded, with the reasons) at /health."""
        self.store = store
        self._clock = clock
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._stopped: asyncio.Event | None = None
        self._port: int | None = None
        self.routes: list[Routes] = []
        """Route sets registered when the server starts (see `Routes`)."""

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        caps: ConnectionCaps | None = None,
        *,
        health_report: Callable[[], dict[str, Any]] | None = None,
        status_page: Callable[[], str] | None = None,
    ) -> AudioServer:
        return cls(
            settings.http,
            AudioStore.from_settings(settings),
            status_page=status_page,
            caps=caps,
            health_report=health_report,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> None:
        if self._thread is not None:
            raise RuntimeError("the audio server is already running")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name="http-audio", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError("the audio server did not start in time")
        if failure:
            self._thread.join(timeout_s)
            self._thread = None
            raise failure[0]
        _LOGGER.info(
            "Audio server on %s:%d, URLs under %s",
            self.settings.host,
            self.port,
            self.base_url,
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        thread, loop, stopped = self._thread, self._loop, self._stopped
        if thread is None:
            return
        if loop is not None and stopped is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopped.set)
        thread.join(timeout_s)
        self._thread = None
        _LOGGER.debug("Audio server stopped")

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(ready, failure))
        except BaseException as exc:  # reported to start(); the thread must not die silently
            if not ready.is_set():
                failure.append(exc)
                ready.set()
            else:
                _LOGGER.exception("Audio server stopped on an error")
        finally:
            loop.close()
            self._loop = None

    async def _serve(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.get_running_loop()
        self.faults.install(loop)
        app = web.Application(middlewares=[self._errors_middleware])
        app.on_response_prepare.append(_security_headers)
        app.router.add_get(_ROUTE_PREFIX + "{name}", self._handle_audio)  # HEAD too
        if self.status_page is not None:  # else the web UI's pages are at /, or nothing is
            app.router.add_get("/", self._handle_status)
        for routes in self.routes:
            routes.register(app)
        app.router.add_get("/health", self._handle_health)
        # No access log: URLs are secrets, and a speaker's range requests would flood it.
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self.settings.keepalive_s,
        )
        await runner.setup()
        self._runner = runner
        self._stopped = asyncio.Event()
        handler = runner.server
        assert handler is not None
        listener: asyncio.Server | None = None
        try:
            # Our own listener instead of aiohttp's site: each connection passes the gate first.
            listener = await loop.create_server(
                lambda: GatedProtocol(handler, self.gate, busy_response),
                self.settings.host or None,
                self.settings.port,
                reuse_address=True,
                backlog=LISTEN_BACKLOG,
            )
            sockets = listener.sockets
            self._port = int(sockets[0].getsockname()[1]) if sockets else self.settings.port
            ready.set()
            await self._stopped.wait()
        finally:
            if listener is not None:
                listener.close()
            await runner.cleanup()
            self._runner = None

    def describe(self) -> dict[str, object]:
        """Connections and what the loop reported, for the health report."""
        return {**self.gate.snapshot(), "accept_errors": self.faults.snapshot()}

    # -- requests ----------------------------------------------------------------------------

    @web.middleware
    async def _errors_middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            # Probes, stale links and path tricks: worth a debug line, never the URL's token.
            _LOGGER.debug("HTTP %d for %s %s", exc.status, request.method, _redact(request.path))
            raise
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the speaker went away mid-response
        except Exception:
            _LOGGER.exception("Audio request %s %s failed", request.method, _redact(request.path))
            raise web.HTTPInternalServerError() from None

    async def _handle_audio(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        stored = self.store.lookup(name)
        if stored is None:
            raise web.HTTPNotFound()
        now = self._clock()
        max_age = max(int(stored.expires_at - now), 0)
        etag = audio_etag(name, stored.size)
        headers = {
            "Content-Type": stored.content_type,
            "Cache-Control": f"private, max-age={max_age}",
            "Accept-Ranges": "bytes",
            "ETag": f'"{etag}"',
            # When it was made, never in the future (the file's mtime is its expiry).
            "Last-Modified": formatdate(min(stored.made_at, now), usegmt=True),
        }
        if_none_match = request.if_none_match
        if if_none_match and any(tag.value in (etag, "*") for tag in if_none_match):
            return web.Response(status=304, headers=headers)
        return _AudioFile(stored.path, headers=headers)

    async def _handle_status(self, request: web.Request) -> web.StreamResponse:
        render = self.status_page
        if render is None:
            raise web.HTTPNotFound()
        # Off the loop: the health figures take the cache's and the scheduler's locks.
        page = await asyncio.get_running_loop().run_in_executor(None, render)
        return web.Response(
            text=page,
            content_type="text/html",
            charset="utf-8",
            headers={"Cache-Control": "no-store"},
        )

    async def _handle_health(self, request: web.Request) -> web.StreamResponse:
        report = self.health_report
        if report is None:
            raise web.HTTPNotFound()
        body = await asyncio.get_running_loop().run_in_executor(None, report)
        return web.Response(
            body=encode_json(body),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    # -- publishing --------------------------------------------------------------------------

    @property
    def bound(self) -> bool:
        """True once the server has listened: its URLs then work, and keep working across a
        restart (the store and its key outlive the process)."""
        return self._port is not None

    @property
    def port(self) -> int:
        return self._port if self._port is not None else self.settings.port

    @property
    def base_url(self) -> str:
        if self.settings.base_url:
            return self.settings.base_url
        host = self.settings.host
        if host in _ANY_ADDRESS:
            host = lan_address()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def url_for(self, token: str, fmt: AudioFormat) -> str:
        return f"{self.base_url}{_ROUTE_PREFIX}{token}.{fmt.extension}"

    def publish(
        self,
        audio: npt.NDArray[np.generic],
        sample_rate: int,
        fmt: AudioFormat | None = None,
        ttl_s: float | None = None,
        key: str | None = None,
    ) -> PublishedAudio:
        """Serve this audio (int16 or float PCM) in fmt (default: http.format) and return its
        URL. key names the content (e.g. the answer's cache keys); without one the samples
        themselves do. Encodes on the calling thread, only when the store lacks it."""
        fmt = fmt or self.settings.format
        ttl = float(ttl_s if ttl_s is not None else self.settings.ttl_s)
        token = self.store.token(key or content_key(audio, sample_rate), fmt)
        samples = int(np.asarray(audio).shape[0])
        size = self.store.refresh(token, fmt, ttl)
        encoded = size is None
        data: bytes | None = None
        if size is None:
            data = encode(audio, sample_rate, fmt).data
            self.store.put(token, fmt, data, ttl)
            size = len(data)
        return PublishedAudio(
            url=self.url_for(token, fmt),
            token=token,
            format=fmt,
            content_type=fmt.content_type,
            bytes=size,
            duration_ms=duration_ms(samples, sample_rate),
            expires_at=self._clock() + ttl,
            encoded=encoded,
            data=data,
        )

    def read(self, published: PublishedAudio) -> bytes | None:
        """The bytes behind a published URL (None if they went meanwhile)."""
        return self.store.read(published.token, published.format)


class _AudioFile(web.FileResponse):
    """A FileResponse whose ETag and Last-Modified are the server's, not the file's times."""

    def __init__(self, path: Path, headers: dict[str, str]) -> None:
        super().__init__(path, headers=headers)
        self.stable_etag = headers["ETag"]
        self.made = headers["Last-Modified"]


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Before any response's headers go out (errors included)."""
    response.headers.update(_SECURITY_HEADERS)
    if isinstance(response, _AudioFile):
        # FileResponse sets both from the file's mtime, which holds the expiry.
        response.headers["ETag"] = response.stable_etag
        response.headers["Last-Modified"] = response.made


def _redact(path: str) -> str:
    # A valid-looking token in a log line would be a working URL for whoever reads the log.
    head, _, name = path.rpartition("/")
    return f"{head}/{name[:4]}…" if len(name) > 8 else path
