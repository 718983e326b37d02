"""A private mosquitto on loopback, for the tests, the benchmark and ``doctor``.

The broker gets its own folder (config, log, persistence file) and a free port on 127.0.0.1, so
it never touches a broker the user already runs. ``restart()`` keeps the port and the config,
which is what reconnect and persistence tests need.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

_LOGGER = logging.getLogger(__name__)

HOST = "127.0.0.1"
_FALLBACK_BINARY = Path("/usr/sbin/mosquitto")
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0
_LOG_TAIL_LINES = 30
# A port picked by bind-to-0 can be taken by someone else before mosquitto binds it; a fresh
# port is tried this many times before giving up (an explicit port is never changed).
_PORT_ATTEMPTS = 3


class LocalBrokerError(RuntimeError):
    """The private broker cannot be found, started or stopped; the message says why."""


def find_mosquitto() -> Path:
    """Path of the mosquitto binary; raises LocalBrokerError when it is not installed."""
    found = shutil.which("mosquitto")
    if found:
        return Path(found)
    # /usr/sbin is often missing from a non-root PATH although Debian installs mosquitto there.
    if _FALLBACK_BINARY.is_file() and os.access(_FALLBACK_BINARY, os.X_OK):
        return _FALLBACK_BINARY
    raise LocalBrokerError(
        "mosquitto is not installed (not on PATH and not at /usr/sbin/mosquitto); "
        "install it, e.g. 'apt-get install mosquitto'"
    )


def free_port(host: str = HOST) -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _mentions(lines: Sequence[str], option: str) -> bool:
    return any(line.split(maxsplit=1)[:1] == [option] for line in lines)


class LocalBroker:
    """A mosquitto subprocess listening on 127.0.0.1 only, configured from Python.

    Use it as a context manager, or call ``start()`` and ``stop()``.
    """

    host = HOST

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        persistence: bool = False,
        max_packet_size: int | None = None,
        extra_config: Sequence[str] = (),
    ) -> None:
        self.workdir = Path(workdir)
        self.persistence = persistence
        self.max_packet_size = max_packet_size
        self.extra_config = tuple(extra_config)
        self.conf_path = self.workdir / "mosquitto.conf"
        self.log_path = self.workdir / "mosquitto.log"
        self.persistence_path = self.workdir / "mosquitto.db"
        self._fixed_port = port is not None
        self._port = port
        self._binary = find_mosquitto()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    # -- properties -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The broker's port; picked on the first ``start()`` unless given."""
        if self._port is None:
            raise LocalBrokerError("the broker has no port yet: call start() first")
        return self._port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start mosquitto and wait until its port accepts TCP connections."""
        if self.running:
            raise LocalBrokerError(f"the broker is already running on port {self.port}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._fixed_port or self._port is not None else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            if self._port is None or (attempt > 1 and not self._fixed_port):
                self._port = free_port()
            try:
                self._start_once()
                return
            except LocalBrokerError as exc:
                # Only a lost race for the port is worth another try; a bad config is not.
                if attempt == attempts or "Address already in use" not in str(exc):
                    raise
                _LOGGER.warning("mosquitto did not start on port %d, trying another", self._port)

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Send ``sig`` and wait for the broker to exit (SIGKILL after 10 s); returns its code."""
        proc = self._proc
        if proc is None:
            return None
        code = proc.poll()
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                code = proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _LOGGER.warning("mosquitto (pid %d) ignored signal %d, killing it", proc.pid, sig)
                proc.kill()
                code = proc.wait(timeout=_STOP_TIMEOUT_S)
        self._proc = None
        self._close_log()
        _LOGGER.debug("mosquitto on port %s exited with %s", self._port, code)
        return code

    def kill(self) -> int | None:
        """Stop the broker the hard way (SIGKILL): no goodbye to clients, no final save."""
        return self.stop(signal.SIGKILL)

    def restart(self) -> None:
        """Stop (SIGTERM) and start again on the same port with the same config."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the broker's log, for error messages."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"LocalBroker({self.host}:{self._port}, {state}, workdir={str(self.workdir)!r})"

    # -- internals --------------------------------------------------------------------------

    def config_lines(self) -> list[str]:
        """The mosquitto.conf this broker runs with (one option per line)."""
        lines = [
            "# written by tts_bridge.bench.localbroker; changes are overwritten on start",
            f"listener {self.port} {self.host}",
        ]
        if not _mentions(self.extra_config, "allow_anonymous"):
            lines.append("allow_anonymous true")
        if os.geteuid() == 0 and not _mentions(self.extra_config, "user"):
            # As root, mosquitto otherwise switches to user 'mosquitto', which cannot write the
            # log or the persistence file in a root-owned (often 0700) temporary folder.
            lines.append("user root")
        # stderr goes to the log file (see _start_once), so start-up errors that happen before
        # mosquitto opens its own log destination end up in the same file.
        lines += [
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "log_type subscribe",
            "log_type unsubscribe",
            "connection_messages true",
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        ]
        if self.persistence:
            lines += [
                "persistence true",
                # mosquitto 1.x joins location and file name without a separator (2.x adds one;
                # the resulting double slash is harmless).
                f"persistence_location {self.workdir}{os.sep}",
                f"persistence_file {self.persistence_path.name}",
                # Save after every change, so that kill() (no final save) keeps retained messages.
                "autosave_on_changes true",
                "autosave_interval 1",
            ]
        else:
            lines.append("persistence false")
        if self.max_packet_size is not None:
            lines.append(f"max_packet_size {self.max_packet_size}")
        lines += list(self.extra_config)
        return lines

    def _start_once(self) -> None:
        self.conf_path.write_text("\n".join(self.config_lines()) + "\n", encoding="utf-8")
        # Append, so a restart keeps the earlier runs' log for post-mortems.
        self._log_file = self.log_path.open("ab")
        self._log_file.write(f"--- starting {self._binary} on port {self.port}\n".encode())
        self._log_file.flush()
        log_start = self._log_file.tell()
        self._proc = subprocess.Popen(
            [str(self._binary), "-c", str(self.conf_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        accepted_at: float | None = None
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                self._close_log()
                raise LocalBrokerError(
                    f"mosquitto exited with code {code} while starting on port {self.port}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            # Another program may hold the port (then mosquitto exits within milliseconds), so an
            # accepted connection alone does not prove it is ours: mosquitto must also have said
            # it is running, or at least still be alive a moment later (log_type may be changed).
            if _port_accepts(self.host, self.port):
                if accepted_at is None:
                    accepted_at = time.monotonic()
                if self._proc.poll() is None and (
                    self._logged_running(log_start) or time.monotonic() - accepted_at > 0.5
                ):
                    _LOGGER.debug("mosquitto (pid %d) listening on %d", self._proc.pid, self.port)
                    return
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise LocalBrokerError(
                    f"mosquitto did not accept connections on {self.host}:{self.port} within "
                    f"{_START_TIMEOUT_S:.0f} s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _logged_running(self, offset: int) -> bool:
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return b" running" in log.read()
        except OSError:
            return False

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
