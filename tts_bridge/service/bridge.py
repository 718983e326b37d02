"""The MQTT side's lifecycle: connect, subscribe for the front ends, dispatch, maintain, stop.

The bridge owns no request logic: each message goes to the front end that owns its topic
(say, Hermes, bridge API, reports). Besides dispatching it resumes the journal's unfinished
requests at start, runs the periodic chores, and says online/offline on <base>/bridge/state.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence

from tts_bridge.config import Settings
from tts_bridge.mqtt.client import IncomingMessage, OutgoingMessage
from tts_bridge.service.frontend import MqttFrontEnd
from tts_bridge.service.journal import Journal
from tts_bridge.service.outbox import Connection, Outbox
from tts_bridge.service.pipeline import Pipeline
from tts_bridge.service.say import SayFrontEnd

_LOGGER = logging.getLogger(__name__)

ONLINE = json.dumps({"state": "online"}).encode()
OFFLINE = json.dumps({"state": "offline"}).encode()


class Bridge:
    """`start` resumes the journal and connects; `stop` drains live work and says goodbye."""

    def __init__(
        self,
        settings: Settings,
        connection: Connection,
        *,
        outbox: Outbox,
        pipeline: Pipeline,
        journal: Journal,
        say: SayFrontEnd,
        front_ends: Sequence[MqttFrontEnd],
    ) -> None:
        self._settings = settings
        self._connection = connection
        self._outbox = outbox
        self._pipeline = pipeline
        self._journal = journal
        self._say = say
        self.front_ends = [say, *(f for f in front_ends if f is not say)]
        self.topics = outbox.topics
        self._stopped = threading.Event()
        self._maintenance = threading.Thread(
            target=self._maintenance_loop, name="maintenance", daemon=True
        )

    def subscriptions(self) -> list[str]:
        return [topic for front in self.front_ends for topic in front.subscriptions()]

    def start(self) -> None:
        """Resume the journal (the pipeline must be started), then connect."""
        self._resume()
        self._connection.start(self.subscriptions(), self.on_message, self.on_connected)
        self._maintenance.start()

    def stop(self, timeout_s: float = 20.0) -> None:
        """Finish queued live work (bounded), publish the offline state, disconnect."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        _LOGGER.info("Stopping: finishing %d queued request(s)", self._pipeline.scheduler.depth)
        if not self._pipeline.stop(timeout_s):
            _LOGGER.warning("Synthesis still running after %.0f s; exiting anyway", timeout_s)
        for front in self.front_ends:
            front.stop()
        self._connection.stop(OutgoingMessage(self.topics.state, OFFLINE, qos=1, retain=True))

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connection.connected.wait(timeout_s)

    def _resume(self) -> None:
        """Serve what was accepted (and acked) but not answered before the last stop."""
        self._journal.prune()
        entries = self._journal.unfinished()
        if entries:
            _LOGGER.info("Resuming %d unfinished request(s) from the journal", len(entries))
        for entry in entries:
            self._say.resume(entry)

    # the network thread

    def on_connected(self) -> None:
        self._outbox.retained_json(self.topics.state, ONLINE)
        for front in self.front_ends:
            front.on_connected()

    def on_message(self, message: IncomingMessage) -> None:
        for front in self.front_ends:
            if front.owns(message.topic):
                front.on_message(message)
                return
        self._outbox.ack(message)
        _LOGGER.debug("Ignoring message on %s", message.topic)

    # the maintenance thread

    def _maintenance_loop(self) -> None:
        """Periodic chores: the front ends' (health reports), unloading idle models, pruning
        the journal."""
        idle_unload = self._settings.models.idle_unload_s
        engines = self._pipeline.synthesizer.engines
        next_prune = time.monotonic() + self._settings.scheduler.health_interval_s
        while not self._stopped.wait(1.0):
            now = time.monotonic()
            try:
                for front in self.front_ends:
                    front.maintain(now)
                if idle_unload and not self._pipeline.scheduler.active:
                    engines.unload_idle(idle_unload)
                if now >= next_prune:
                    next_prune = now + 3600
                    self._journal.prune()
            except Exception:
                _LOGGER.exception("Maintenance failed")
