"""Bounded connections for the network doors (HTTP, Wyoming).

A door open to the whole LAN must not let one host take every file descriptor: each door
counts its connections, in total and per peer address, and a connection past either cap is
answered with a short refusal and closed (`ConnectionGate`, `GatedProtocol`). The caps are fitted
under the process's open-file limit, which is raised to its hard limit at start, with a reserve
left for the broker connection, the cache, the journal and the model files
(`fit_connection_caps`). When accept() still fails for lack of descriptors, asyncio retries it
every second and reports each failure to the loop's exception handler: `LoopFaults` turns that
into one log line per condition per minute (no tracebacks) and counts it for the health report.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tts_bridge.config import Settings
from tts_bridge.system.faults import LogThrottle

_LOGGER = logging.getLogger(__name__)

RESERVED_FILES = 128
"""Descriptors kept out of the doors' caps: the broker connection, the cache and journal
databases, model files, log files, the listening sockets and the files being served."""
LISTEN_BACKLOG = 32
"""Each door's listen backlog: asyncio accepts up to this many connections at once before any
passes its gate, so it is also the burst of descriptors a flood takes beyond the caps."""
LINGER_S = 1.0
"""How long a refused connection may read before it is closed: closing with unread input resets
the connection, and a reset can discard the refusal before the client reads it."""
LINGERING_SHARE = 8
"""Refused connections may linger up to 1/LINGERING_SHARE of the door's cap at once; past it a
refusal closes at once (a flood of refused connections must not hold a descriptor each)."""
_RESOURCE_ERRNOS = {
    errno.EMFILE: "EMFILE (too many open files in this process)",
    errno.ENFILE: "ENFILE (too many open files on this system)",
    errno.ENOBUFS: "ENOBUFS (no buffer space)",
    errno.ENOMEM: "ENOMEM (out of memory)",
}


def peer_host(transport: asyncio.BaseTransport) -> str:
    """The peer's address without its port: what a per-peer cap counts."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return "unknown"


class ConnectionGate:
    """Counts a door's open connections; `admit` refuses past the total or the per-peer cap."""

    def __init__(self, door: str, total: int, per_peer: int) -> None:
        self.door = door
        self.total = total
        self.per_peer = min(per_peer, total)
        self._lock = threading.Lock()  # health reads it from another thread
        self._open = 0
        self._peers: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self.lingering = 0
        """Refused connections waiting for their client to close (only the door's loop)."""
        self.max_lingering = max(1, total // LINGERING_SHARE)

    def admit(self, peer: str) -> str | None:
        """None when the connection may go on (it then counts until `release`); else the
        setting whose cap it hit."""
        with self._lock:
            if self._open >= self.total:
                limit = f"{self.door}.max_connections"
            elif self._peers[peer] >= self.per_peer:
                limit = f"{self.door}.max_connections_per_peer"
            else:
                self._open += 1
                self._peers[peer] += 1
                return None
            self._refused[limit] += 1
        return limit

    def release(self, peer: str) -> None:
        with self._lock:
            self._open -= 1
            self._peers[peer] -= 1
            if self._peers[peer] <= 0:
                del self._peers[peer]

    @property
    def open(self) -> int:
        with self._lock:
            return self._open

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "open": self._open,
                "max": self.total,
                "max_per_peer": self.per_peer,
                "peers": len(self._peers),
                "refused": dict(self._refused),
            }


class GatedProtocol(asyncio.Protocol):
    """A door's protocol behind its gate: connections past a cap get `refusal` and are closed;
    the others are handed to the door's own protocol, which sees every event unchanged."""

    def __init__(
        self,
        inner: Callable[[], asyncio.Protocol],
        gate: ConnectionGate,
        refusal: Callable[[str], bytes],
        send_buffer: int | None = None,
    ) -> None:
        self._make_inner = inner
        self._gate = gate
        self._refusal = refusal
        self._send_buffer = send_buffer
        self._inner: asyncio.Protocol | None = None
        self._peer = ""
        self._transport: asyncio.Transport | None = None
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._peer = peer_host(transport)
        limit = self._gate.admit(self._peer)
        if limit is not None:
            try:
                self._refuse(transport, limit)
            except OSError:  # the client is already gone (reset before we answered)
                transport.abort()
            return
        if self._send_buffer:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):  # a connection already reset
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
        self._inner = self._make_inner()
        self._inner.connection_made(transport)

    def _refuse(self, transport: asyncio.Transport, limit: str) -> None:
        # Not logged: a flood would flood the log too; the gate counts refusals for health.
        transport.write(self._refusal(limit))
        if self._gate.lingering >= self._gate.max_lingering or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._gate.lingering += 1
        loop = asyncio.get_running_loop()
        self._linger = loop.call_later(LINGER_S, transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is None:
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None
                self._gate.lingering -= 1
            return
        self._gate.release(self._peer)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._inner is None:
            if self._transport is not None:
                self._transport.close()
            return False
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


# -- file descriptors --------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionCaps:
    """Each door's caps, after fitting them under the open-file limit."""

    http: int
    http_per_peer: int
    wyoming: int
    wyoming_per_peer: int
    open_files_limit: int


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (systemd's default soft limit is 1024,
    which a thousand idle connections reach); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        _LOGGER.warning("Cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft
    _LOGGER.info("Open-file limit raised from %d to %d (the hard limit)", soft, hard)
    return hard


def fit_connection_caps(settings: Settings, *, raise_limit: bool = True) -> ConnectionCaps:
    """The doors' connection caps, scaled down together when they would not fit under the
    open-file limit with RESERVED_FILES kept for everything else (and, per door, its listen
    backlog and its lingering refusals)."""
    soft = raise_open_files_limit() if raise_limit else open_files_limit()
    http, wyoming = settings.http, settings.wyoming
    doors = [(http.enabled, http.max_connections), (wyoming.enabled, wyoming.max_connections)]
    wanted = sum(cap + cap // LINGERING_SHARE for enabled, cap in doors if enabled)
    budget = max(2, soft - RESERVED_FILES - LISTEN_BACKLOG * sum(e for e, _ in doors))
    scale = min(1.0, budget / max(1, wanted))

    def fitted(cap: int) -> int:
        return max(1, int(cap * scale))

    caps = ConnectionCaps(
        http=fitted(http.max_connections),
        http_per_peer=min(http.max_connections_per_peer, fitted(http.max_connections)),
        wyoming=fitted(wyoming.max_connections),
        wyoming_per_peer=min(wyoming.max_connections_per_peer, fitted(wyoming.max_connections)),
        open_files_limit=soft,
    )
    if scale < 1.0:
        _LOGGER.warning(
            "The open-file limit (%d) leaves room for about %d connections: HTTP capped at %d, "
            "Wyoming at %d (raise the limit, e.g. LimitNOFILE= in the systemd unit)",
            soft,
            budget,
            caps.http,
            caps.wyoming,
        )
    return caps


def open_files_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_files() -> dict[str, int]:
    """Descriptors open now and the soft limit, for the health report."""
    try:
        count = len(os.listdir("/proc/self/fd"))
    except OSError:
        count = -1
    return {"open": count, "limit": open_files_limit()}


# -- the event loop's exception handler --------------------------------------------------------


class LoopFaults:
    """A door loop's exception handler: one log line per condition per `interval_s`.

    asyncio reports every failed accept() (out of descriptors: every second while it lasts,
    and once per pending connection) with a traceback; logged as such, a descriptor shortage
    fills a Raspberry Pi's SD card in an hour. Resource errors are logged without a traceback;
    anything else keeps its traceback, still once per interval.
    """

    def __init__(
        self, door: str, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.door = door
        self._throttle = LogThrottle(interval_s, clock)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_exception_handler(self)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: Mapping[str, Any]) -> None:
        exc = context.get("exception")
        resource = _RESOURCE_ERRNOS.get(exc.errno or 0) if isinstance(exc, OSError) else None
        resource_error = resource is not None
        if resource is not None:
            condition = resource
        elif exc is not None:
            condition = type(exc).__name__
        else:
            condition = str(context.get("message", "unknown"))[:80]
        with self._lock:
            self._counts[condition] += 1
        since = self._throttle.due(condition)
        if since is None:
            return
        what = str(context.get("message", "error"))
        if resource_error:
            _LOGGER.error(
                "%s server: %s: %s (%d time(s) since the last report; next report in %.0f s at "
                "the earliest)",
                self.door,
                what,
                condition,
                since,
                self._throttle.interval_s,
            )
        else:
            _LOGGER.error(
                "%s server: %s (%d time(s) since the last report)",
                self.door,
                what,
                since,
                exc_info=exc if isinstance(exc, BaseException) else None,
            )

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


__all__ = [
    "LISTEN_BACKLOG",
    "ConnectionCaps",
    "ConnectionGate",
    "GatedProtocol",
    "LoopFaults",
    "fit_connection_caps",
    "open_files",
    "raise_open_files_limit",
]
