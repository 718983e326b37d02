"""Play an answer on the Home Assistant media players its target names, and say per player
what happened.

Everything that talks to Home Assistant runs on this service's own thread and event loop, the
players of one answer at once: the synthesis worker that hands an answer over goes straight
back to work, and the answer (with `data.players`) is published by the `done` callback on a
thread of its own once every player has an outcome. Per player, announcements take turns: a
`normal` one waits until the bridge's previous announcement on that player has had its length,
an `alert` one plays at once (Home Assistant's announce interrupts what the player is playing).
Home Assistant tells nobody when a player's announcement of someone else ends, so only the
bridge's own are waited for.

Volume: with `volume_restore: bridge` the player's volume is noted (on disk, `restores`)
before the announcement volume is set, and put back after the audio's length plus a margin; a
second announcement before then keeps the first one's noted volume. Pending restores survive
a restart (they run when the bridge is back) and are retried while Home Assistant is away.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tts_bridge.config import Settings
from tts_bridge.players.client import (
    NOT_FOUND_CODE,
    REFUSED_CODE,
    HomeAssistantClient,
    PlayerError,
)
from tts_bridge.players.connection import HomeAssistantConnection
from tts_bridge.players.restores import PendingRestores, Restore
from tts_bridge.speech.settings import TargetSettings

_LOGGER = logging.getLogger(__name__)

OK = "ok"
NOT_CONFIGURED_CODE = "homeassistant_not_configured"
NO_URL_CODE = "url_unavailable"
BUSY_CODE = "player_busy"
FAILED_CODE = "player_failed"
UNAVAILABLE_CODE = "player_unavailable"
VOLUME_SET_FEATURE = 4
"""MediaPlayerEntityFeature.VOLUME_SET in a player's supported_features."""
PLAY_MEDIA_FEATURE = 512
"""MediaPlayerEntityFeature.PLAY_MEDIA: without it Home Assistant refuses play_media."""
RESTORE_MARGIN_S = 3.0
"""Time after the audio's length before the volume goes back: the player fetches and buffers
the URL first (a Cast device takes a second or two), and a restore too early is heard."""
CALL_TIMEOUT_S = 10.0
RETRY_MAX_S = 60.0
STOP_RESTORE_S = 5.0
MAX_REFUSED_RESTORES = 10

Outcomes = dict[str, str]


@dataclass(frozen=True)
class PlayOrder:
    """One answer for a target's media players."""

    request_id: str | int
    target: str
    url: str | None
    """The answer's audio URL (None: the HTTP audio server is off)."""
    duration_ms: int
    """The audio's length as delivered (lead-in and lead-out included)."""
    priority: str = "normal"


class Players:
    """The media players of every target; start() before play(), stop() at the end."""

    def __init__(
        self,
        settings: Settings,
        connection: HomeAssistantConnection | None,
        restores_path: Path,
        *,
        timeout_s: float = CALL_TIMEOUT_S,
        margin_s: float = RESTORE_MARGIN_S,
        retry_s: float = 1.0,
    ) -> None:
        self._targets = {n: t for n, t in settings.targets.items() if t.media_players}
        self._connection = connection
        self._restores = PendingRestores(restores_path)
        self._timeout_s = timeout_s
        self._margin_s = margin_s
        self._retry_s = retry_s
        self._max_wait_s = settings.limits.max_audio_s + margin_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: HomeAssistantClient | None = None
        self._answers = ThreadPoolExecutor(1, thread_name_prefix="tts-players-answer")
        self._waiting = 0
        self._idle = threading.Condition()
        # Used on the loop only.
        self._locks: dict[str, asyncio.Lock] = {}
        self._busy_until: dict[str, float] = {}
        self._restore_tasks: dict[str, asyncio.Task[None]] = {}

    def plays(self, target: str) -> bool:
        """Whether answers to `target` go to media players (and wait for their outcomes)."""
        return target in self._targets

    @property
    def pending_restores(self) -> dict[str, Restore]:
        return self._restores.items()

    def start(self) -> None:
        if self._thread is not None:
            return
        if self._connection is None:
            if self._targets:
                _LOGGER.error(
                    "Targets %s name media players, but Home Assistant is not configured "
                    "(homeassistant.url and a token, or the add-on): they will not play",
                    ", ".join(sorted(self._targets)),
                )
            return
        if not self._targets and not self._restores.items():
            return
        _LOGGER.info(
            "Media players of %d target(s) play through Home Assistant (%s, via %s)",
            len(self._targets),
            self._connection.url,
            self._connection.via,
        )
        loop = asyncio.new_event_loop()
        self._client = HomeAssistantClient(
            self._connection.url, self._connection.token, self._timeout_s
        )
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="tts-players", daemon=True)
        self._thread.start()
        started.wait()
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self._schedule_pending(), loop)

    def play(self, order: PlayOrder, done: Callable[[Outcomes], None]) -> None:
        """Play `order` on its target's players; `done(outcomes)` runs once all have one, on
        another thread (or at once, here, when nothing can play)."""
        entities = self._targets[order.target].media_players
        loop = self._loop
        if loop is None or order.url is None:
            code = NOT_CONFIGURED_CODE if loop is None else NO_URL_CODE
            _LOGGER.warning(
                "Request %s: no media player of %s plays (%s)", order.request_id, order.target, code
            )
            done(dict.fromkeys(entities, code))
            return
        with self._idle:
            self._waiting += 1
        future = asyncio.run_coroutine_threadsafe(self._announce(order), loop)
        future.add_done_callback(lambda f: self._answers.submit(self._answer, order, f, done))

    def drain(self, timeout_s: float) -> bool:
        """Wait until every answer handed over is out (False: some still wait after timeout)."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def stop(self, *, restore_now: bool = True) -> None:
        """Put back the volumes still pending (bounded; those that fail stay on disk for the
        next start), then stop the loop. restore_now=False leaves them all for next time."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            self._answers.shutdown(wait=True)
            return
        future = asyncio.run_coroutine_threadsafe(self._shutdown(restore_now), loop)
        try:
            future.result(STOP_RESTORE_S + 1.0)
        except Exception as exc:  # a timeout: the rest waits for the next start
            _LOGGER.warning("Media player volumes not all put back at stop: %r", exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
        self._answers.shutdown(wait=True)
        self._loop = self._thread = None

    # the answer thread

    def _answer(
        self, order: PlayOrder, future: Future[Outcomes], done: Callable[[Outcomes], None]
    ) -> None:
        try:
            try:
                outcomes = future.result()
            except Exception:
                _LOGGER.exception("Request %s: the media players failed", order.request_id)
                outcomes = dict.fromkeys(self._targets[order.target].media_players, FAILED_CODE)
            done(outcomes)
        except Exception:
            _LOGGER.exception("Request %s: its answer failed", order.request_id)
        finally:
            with self._idle:
                self._waiting -= 1
                self._idle.notify_all()

    # the loop

    async def _announce(self, order: PlayOrder) -> Outcomes:
        target = self._targets[order.target]
        entities = target.media_players
        results = await asyncio.gather(*(self._one(e, order, target) for e in entities))
        return dict(zip(entities, results, strict=True))

    async def _one(self, entity: str, order: PlayOrder, target: TargetSettings) -> str:
        try:
            lock = await self._turn(entity, order.priority)
            try:
                await self._play(entity, order, target)
            finally:
                lock.release()
        except PlayerError as exc:
            _LOGGER.warning(
                "Request %s: %s did not play (%s): %s", order.request_id, entity, exc.code, exc
            )
            return exc.code
        _LOGGER.info("Request %s: playing on %s", order.request_id, entity)
        return OK

    def _lock(self, entity: str) -> asyncio.Lock:
        return self._locks.setdefault(entity, asyncio.Lock())

    async def _turn(self, entity: str, priority: str) -> asyncio.Lock:
        """The player's lock, once it is this announcement's turn (see the module's text)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_wait_s
        lock = self._lock(entity)
        while True:
            if priority != "alert":
                wait = self._busy_until.get(entity, 0.0) - loop.time()
                if wait > 0:
                    if loop.time() + wait > deadline:
                        raise PlayerError(BUSY_CODE, f"{entity} stayed busy with announcements")
                    await asyncio.sleep(wait)
                    continue
            await lock.acquire()
            if priority == "alert" or self._busy_until.get(entity, 0.0) <= loop.time():
                return lock
            lock.release()

    async def _play(self, entity: str, order: PlayOrder, target: TargetSettings) -> None:
        client = self._client
        assert client is not None and order.url is not None
        state = await client.state(entity)
        if state.get("state") == "unavailable":
            raise PlayerError(UNAVAILABLE_CODE, f"{entity} is unavailable in Home Assistant")
        features = (state.get("attributes") or {}).get("supported_features")
        if isinstance(features, int) and not features & PLAY_MEDIA_FEATURE:
            # Refused before its volume is touched: Home Assistant would refuse play_media only
            # after the announcement volume was set, and the player would jump there and back.
            raise PlayerError(REFUSED_CODE, f"{entity} cannot play media (media_player.play_media)")
        length_s = order.duration_ms / 1000
        data: dict[str, Any] = {
            "entity_id": entity,
            "media_content_id": order.url,
            "media_content_type": "music",
            "announce": True,
        }
        noted = False
        if target.volume is not None:
            if target.volume_restore == "player":
                data["extra"] = {"volume": target.volume}
            else:
                noted = await self._set_volume(entity, state, target.volume, length_s)
        try:
            await client.call("play_media", data)
        except PlayerError:
            if noted:  # nothing plays: the volume goes back at once
                await self._reschedule(entity, time.time())
            raise
        if noted:
            await self._reschedule(entity, time.time() + length_s + self._margin_s)
        loop = asyncio.get_running_loop()
        self._busy_until[entity] = loop.time() + length_s

    async def _set_volume(
        self, entity: str, state: dict[str, Any], volume: float, length_s: float
    ) -> bool:
        """Note the player's volume (on disk first), then set `volume`; False when the player
        reports no volume it could get back (off, or without volume control)."""
        client = self._client
        assert client is not None
        attributes = state.get("attributes") or {}
        level = attributes.get("volume_level")
        features = attributes.get("supported_features") or 0
        if not isinstance(level, int | float) or not int(features) & VOLUME_SET_FEATURE:
            _LOGGER.info("%s reports no volume to restore; it plays at its own volume", entity)
            return False
        # A bound on when to restore even if the bridge stops before it learns more.
        due = time.time() + 2 * self._timeout_s + length_s + self._margin_s
        await asyncio.to_thread(self._restores.note, entity, float(level), due)
        self._schedule_restore(entity)
        try:
            await client.call("volume_set", {"entity_id": entity, "volume_level": volume})
        except PlayerError:
            await self._reschedule(entity, time.time())
            raise
        return True

    async def _reschedule(self, entity: str, due: float) -> None:
        """Move the pending restore to `due`; called with the player's lock held, so its task
        is asleep or waiting for the lock, and is started again for the new time."""
        restore = self._restores.get(entity)
        if restore is not None and restore.due != due:
            await asyncio.to_thread(self._restores.note, entity, restore.volume, due)
        task = self._restore_tasks.pop(entity, None)
        if task is not None:
            task.cancel()
        self._schedule_restore(entity)

    async def _schedule_pending(self) -> None:
        for entity in self._restores.items():
            self._schedule_restore(entity)

    def _schedule_restore(self, entity: str) -> None:
        task = self._restore_tasks.get(entity)
        if task is None or task.done():
            loop = asyncio.get_running_loop()
            self._restore_tasks[entity] = loop.create_task(self._restore_when_due(entity))

    async def _restore_when_due(self, entity: str) -> None:
        delay = self._retry_s
        refused = 0
        while True:
            restore = self._restores.get(entity)
            if restore is None:
                return
            wait = restore.due - time.time()
            if wait > 0:
                await asyncio.sleep(min(wait, RETRY_MAX_S))  # then again: it may have moved
                continue
            async with self._lock(entity):
                if self._restores.get(entity) != restore:
                    continue
                try:
                    await self._put_back(entity, restore)
                    return
                except PlayerError as exc:
                    # Not found counts like a refusal: while Home Assistant starts, a player
                    # may not be set up yet, and only one that stays away is given up.
                    refused += exc.code in (REFUSED_CODE, NOT_FOUND_CODE)
                    if refused >= MAX_REFUSED_RESTORES:
                        _LOGGER.error("Giving up restoring %s's volume: %s", entity, exc)
                        await asyncio.to_thread(self._restores.done, entity, restore)
                        return
                    _LOGGER.warning(
                        "Cannot restore %s's volume yet (%s); trying again in %.0f s",
                        entity,
                        exc,
                        delay,
                    )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _put_back(self, entity: str, restore: Restore) -> None:
        client = self._client
        assert client is not None
        # Home Assistant answers a service call for an entity it has not set up (yet, while it
        # starts) with success and does nothing: the player must be there first.
        state = await client.state(entity)
        if state.get("state") == "unavailable":
            raise PlayerError(UNAVAILABLE_CODE, f"{entity} is unavailable in Home Assistant")
        await client.call("volume_set", {"entity_id": entity, "volume_level": restore.volume})
        await asyncio.to_thread(self._restores.done, entity, restore)
        _LOGGER.info("%s's volume is back at %.2f", entity, restore.volume)

    async def _shutdown(self, restore_now: bool) -> None:
        for task in self._restore_tasks.values():
            task.cancel()
        if restore_now:
            pending = self._restores.items()
            results = await asyncio.gather(
                *(
                    asyncio.wait_for(self._put_back(e, r), STOP_RESTORE_S)
                    for e, r in pending.items()
                ),
                return_exceptions=True,
            )
            for entity, result in zip(pending, results, strict=True):
                if isinstance(result, BaseException):
                    _LOGGER.warning("%s's volume is put back at the next start: %r", entity, result)
        if self._client is not None:
            await self._client.close()
