"""A stand-in for the Home Assistant Supervisor's REST API, on loopback (http.server).

It answers what the add-on asks, the way the Supervisor does: ``{"result": "ok", "data": ...}``,
401 without the add-on's token, 400 ``Service not enabled`` for an MQTT service nobody provides,
and it records every request (discovery messages included) for the test to read. Run as a
program (``python -m tests.support.supervisor --port 8099 --record requests.jsonl ...``) it
serves until killed, for the docker check's add-on container.
"""

from __future__ import annotations

import argparse
import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

TOKEN = "test-supervisor-token"


@dataclass
class Recorded:
    method: str
    path: str
    authorization: str | None
    body: Any


@dataclass
class SupervisorState:
    token: str = TOKEN
    mqtt: dict[str, Any] | None = None
    """The MQTT service's data; None = no add-on provides it."""
    network: dict[str, Any] = field(default_factory=lambda: {"10200/tcp": None, "10201/tcp": 10201})
    host_address: str = "192.0.2.10/24"
    requests: list[Recorded] = field(default_factory=list)
    record_file: Path | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def discovery(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r.body for r in self.requests if r.method == "POST" and r.path == "/discovery"]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(None)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self._answer(body)

    def _answer(self, body: Any) -> None:
        state = self.server.state
        recorded = Recorded(self.command, self.path, self.headers.get("Authorization"), body)
        with state.lock:
            state.requests.append(recorded)
            if state.record_file is not None:
                with state.record_file.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(recorded.__dict__) + "\n")
        if recorded.authorization != f"Bearer {state.token}":
            self._send(401, {"result": "error", "message": "Unauthorized"})
            return
        route = (self.command, self.path)
        if route == ("GET", "/services/mqtt"):
            if state.mqtt is None:
                self._send(400, {"result": "error", "message": "Service not enabled"})
            else:
                self._send(200, {"result": "ok", "data": {**state.mqtt, "addon": "core_mosquitto"}})
        elif route == ("POST", "/discovery"):
            if not isinstance(body, dict) or "service" not in body or "config" not in body:
                self._send(400, {"result": "error", "message": "service and config required"})
            else:
                self._send(200, {"result": "ok", "data": {"uuid": uuid.uuid4().hex}})
        elif route == ("GET", "/addons/self/info"):
            self._send(
                200, {"result": "ok", "data": {"slug": "tts_bridge", "network": state.network}}
            )
        elif route == ("GET", "/network/info"):
            interface = {
                "interface": "eth0",
                "primary": True,
                "ipv4": {"address": [state.host_address]},
            }
            self._send(200, {"result": "ok", "data": {"interfaces": [interface]}})
        else:
            self._send(404, {"result": "error", "message": "not found"})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: SupervisorState) -> None:
        super().__init__(address, _Handler)
        self.state = state


class FakeSupervisor:
    """``with FakeSupervisor(mqtt={...}) as sv:`` serves on ``sv.url`` until the block ends."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **state: Any) -> None:
        self.state = SupervisorState(**state)
        self._server = _Server((host, port), self.state)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeSupervisor:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", default=TOKEN)
    parser.add_argument("--mqtt-host", help="the broker the MQTT service names (none: no service)")
    parser.add_argument("--mqtt-port", type=int, default=1883)
    parser.add_argument("--record", type=Path, required=True, help="JSON lines of the requests")
    args = parser.parse_args()
    mqtt = None
    if args.mqtt_host:
        mqtt = {"host": args.mqtt_host, "port": args.mqtt_port, "ssl": False, "protocol": "3.1.1"}
        mqtt |= {"username": "addons", "password": "secret"}
    supervisor = FakeSupervisor(
        args.host, args.port, token=args.token, mqtt=mqtt, record_file=args.record
    )
    with supervisor:
        threading.Event().wait()


if __name__ == "__main__":
    main()
