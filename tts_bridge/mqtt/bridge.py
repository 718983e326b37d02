"""The MQTT side's lifecycle: connect, subscribe for the front ends, dispatch, maintain, stop.

The bridge owns no request logic: each message goes to the front end that owns its topic
(say, Hermes, bridge API, reports). Besides dispatching it resumes the journal's unfinished
requests at start, runs the periodic chores, and says online/offline on <base>/bridge/state.

A request delivered from the broker's retained store (someone published a say or API request
with the retain flag) is acked and not executed: it would run again at every restart and
reconnect. The bridge does not clear it (its ACL should not let it write its own request
topics); the log says how.

Without a journal (it could not be opened at start, e.g. on a full disk) the bridge serves
anyway, each request acked after its answer, and tries to open it again every minute.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tts_bridge.config import Settings
from tts_bridge.mqtt.client import IncomingMessage, OutgoingMessage
from tts_bridge.mqtt.frontend import MqttFrontEnd
from tts_bridge.mqtt.journal import DEFAULT_MAX_ATTEMPTS, Journal
from tts_bridge.mqtt.outbox import Connection, Outbox
from tts_bridge.mqtt.say import SayFrontEnd
from tts_bridge.speech.pipeline import Pipeline
from tts_bridge.system.faults import LogThrottle
from tts_bridge.wire import encode_json

_LOGGER = logging.getLogger(__name__)

_JOURNAL_RETRY_S = 60.0

ONLINE = encode_json({"state": "online"})
OFFLINE = encode_json({"state": "offline"})


class MaintenanceFaults:
    """How the maintenance thread reports a pass that failed. A fault that lasts (no file
    descriptors, an unreadable /proc) fails every pass, once a second: its traceback once,
    then one line a minute while it lasts, and one line when a pass works again."""

    def __init__(self, throttle: LogThrottle | None = None) -> None:
        self._throttle = throttle or LogThrottle(60.0)
        self._failing: str | None = None
        self._failed_passes = 0

    def failed(self, exc: Exception) -> None:
        fault = f"{type(exc).__name__}: {exc}"
        self._failed_passes += 1
        new = fault != self._failing
        self._failing = fault
        since = self._throttle.due(fault)
        if since is None:
            return
        if new:
            _LOGGER.error("Maintenance failed", exc_info=exc)
        else:
            _LOGGER.error(
                "Maintenance still failing (%d passes since the last report): %s", since, fault
            )

    def passed(self) -> None:
        if self._failing is None:
            return
        _LOGGER.info("Maintenance works again after %d failed passes", self._failed_passes)
        self._throttle.clear()  # a fault after this is news again
        self._failing, self._failed_passes = None, 0


class Bridge:
    """`start` resumes the journal and connects; `stop` drains live work and says goodbye."""

    def __init__(
        self,
        settings: Settings,
        connection: Connection,
        *,
        outbox: Outbox,
        pipeline: Pipeline,
        journal: Journal | None,
        say: SayFrontEnd,
        front_ends: Sequence[MqttFrontEnd],
        open_journal: Callable[[], Journal | None] | None = None,
    ) -> None:
        self._settings = settings
        self._connection = connection
        self._outbox = outbox
        self._pipeline = pipeline
        self.journal = journal
        """The request journal; None while it cannot be opened (see `open_journal`)."""
        self._open_journal = open_journal
        self._journal_retry_at = time.monotonic() + _JOURNAL_RETRY_S
        self._retained_logged: set[str] = set()
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

    def faults(self) -> dict[str, Any]:
        """The journal's state and the answers refused delivery, for health."""
        journal = (
            self.journal.health()
            if self.journal is not None
            else {"degraded": "not open", "write_errors": 0, "unrecorded_answers": 0}
        )
        return {
            "journal_degraded": journal["degraded"],
            "journal_write_errors": journal["write_errors"],
            "journal_unrecorded_answers": journal["unrecorded_answers"],
            "answers_not_authorized": self._say.refused_deliveries,
        }

    def _resume(self) -> None:
        """Serve what was accepted (and acked) but not answered before the last stop; answer
        with an error what was resumed too often already (it likely stopped the bridge)."""
        journal = self.journal
        if journal is None:
            return
        journal.prune()
        resumed = journal.resume(max_attempts=DEFAULT_MAX_ATTEMPTS)
        for entry in resumed.poison:
            self._say.retire(entry, entry.attempts)
        count = len(resumed.entries) + len(resumed.suspects)
        if count:
            _LOGGER.info("Resuming %d unfinished request(s) from the journal", count)
        self._say.resume_all(resumed.entries, resumed.suspects)

    def _retry_journal(self, now: float) -> None:
        """Open the journal that could not be opened at start, then resume what it holds."""
        if self.journal is not None or self._open_journal is None or now < self._journal_retry_at:
            return
        self._journal_retry_at = now + _JOURNAL_RETRY_S
        journal = self._open_journal()
        if journal is None:
            return
        _LOGGER.warning("Request journal %s is open again; requests are journaled", journal.path)
        self.journal = journal
        self._say.use_journal(journal)
        self._resume()

    # the network thread

    def on_connected(self) -> None:
        self._outbox.retained_json(self.topics.state, ONLINE)
        for front in self.front_ends:
            front.on_connected()

    def on_message(self, message: IncomingMessage) -> None:
        for front in self.front_ends:
            if front.owns(message.topic):
                if message.retained and front.takes_requests:
                    self._skip_retained(message)
                    return
                front.on_message(message)
                return
        self._outbox.ack(message)
        _LOGGER.debug("Ignoring message on %s", message.topic)

    def _skip_retained(self, message: IncomingMessage) -> None:
        self._outbox.ack(message)
        if message.topic in self._retained_logged:
            return
        self._retained_logged.add(message.topic)
        _LOGGER.warning(
            "Ignoring a retained request on %s: it would run again at every restart. Clear it "
            "with: mosquitto_pub -t '%s' -r -n",
            message.topic,
            message.topic,
        )

    # the maintenance thread

    def _maintenance_loop(self) -> None:
        """Periodic chores: the front ends' (health reports), unloading idle models, pruning
        the journal."""
        idle_unload = self._settings.models.idle_unload_s
        engines = self._pipeline.synthesizer.engines
        next_prune = time.monotonic() + self._settings.scheduler.health_interval_s
        faults = MaintenanceFaults()
        while not self._stopped.wait(1.0):
            now = time.monotonic()
            try:
                for front in self.front_ends:
                    front.maintain(now)
                if idle_unload and not self._pipeline.scheduler.active:
                    engines.unload_idle(idle_unload)
                self._retry_journal(now)
                if now >= next_prune and self.journal is not None:
                    next_prune = now + 3600
                    self.journal.prune()
            except Exception as exc:
                faults.failed(exc)
            else:
                faults.passed()
