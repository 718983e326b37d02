"""A stub of Home Assistant's REST API on loopback (aiohttp, its own thread): the two calls the
bridge makes, GET /api/states/<entity> and POST /api/services/media_player/<service>, with
every service call recorded, per-entity behaviour (unavailable, slow, refusing), a token check
and a restart on the same port."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tts_bridge.bench.localbroker import free_port

TOKEN = "stub-token-9f3b1c77-never-to-be-seen"


@dataclass(frozen=True)
class Call:
    service: str
    data: dict[str, Any]
    at: float
    """time.monotonic() when it arrived."""


@dataclass
class Player:
    state: str = "idle"
    volume_level: float | None = 0.3
    supported_features: int = 4 | 512 | 0x100000  # volume set, play media, media announce
    refuse: bool = False
    """Answer play_media with HTTP 500 (a platform error)."""
    gate: threading.Event | None = None
    """play_media answers only once this is set (a slow player)."""

    def as_state(self, entity: str) -> dict[str, Any]:
        attributes: dict[str, Any] = {"supported_features": self.supported_features}
        if self.volume_level is not None:
            attributes["volume_level"] = self.volume_level
        return {"entity_id": entity, "state": self.state, "attributes": attributes}


@dataclass
class HomeAssistantStub:
    players: dict[str, Player] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    calls: list[Call] = field(default_factory=list)
    seen_tokens: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._serve())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="ha-stub", daemon=True)
        self._thread.start()
        assert ready.wait(10), "the stub did not start"

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop = self._thread = None

    def service_calls(self, service: str | None = None, entity: str | None = None) -> list[Call]:
        with self._lock:
            return [
                c
                for c in self.calls
                if (service is None or c.service == service)
                and (entity is None or c.data.get("entity_id") == entity)
            ]

    def wait_for(
        self, service: str, entity: str, count: int = 1, timeout_s: float = 30.0
    ) -> list[Call]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.service_calls(service, entity)
            if len(found) >= count:
                return found
            time.sleep(0.02)
        raise AssertionError(
            f"no {count} {service} call(s) for {entity} within {timeout_s} s; calls: {self.calls}"
        )

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/api/states/{entity}", self._state)
        app.router.add_post("/api/services/media_player/{service}", self._service)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        with self._lock:
            self.seen_tokens.add(header)
        return header == f"Bearer {TOKEN}"

    async def _state(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"message": "Unauthorized"}, status=401)
        entity = request.match_info["entity"]
        player = self.players.get(entity)
        if player is None:
            return web.json_response({"message": "Entity not found."}, status=404)
        return web.json_response(player.as_state(entity))

    async def _service(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"message": "Unauthorized"}, status=401)
        service = request.match_info["service"]
        data = await request.json()
        entity = data.get("entity_id")
        with self._lock:
            self.calls.append(Call(service, data, time.monotonic()))
        player = self.players.get(entity)
        if player is None:
            # Home Assistant (2026.2) runs a service call for an entity it does not have (yet)
            # as a no-op: 200 and only a warning in its own log.
            return web.json_response([])
        if service == "volume_set":
            player.volume_level = float(data["volume_level"])
        elif service == "play_media":
            if not player.supported_features & 512:
                # Home Assistant's REST API answers ServiceNotSupported so.
                return web.Response(text="500 Internal Server Error", status=500)
            if player.gate is not None:
                gate = player.gate
                await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)
            if player.refuse:
                return web.Response(text="500 Internal Server Error", status=500)
            player.state = "playing"
        return web.json_response([])
