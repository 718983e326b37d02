"""The one place that builds the service from `Settings`.

Cache, engine pool and synthesizer; scheduler, router and idle work; the speech pipeline; the
journal; the MQTT connection, outbox and bridge with its front ends. A new MQTT front end is its
module plus one line in `build`'s list; a front end that is not MQTT (a server with `start()`
and `stop()`, given the pipeline) is one line in `servers`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from tts_bridge.config import Settings
from tts_bridge.control.actions import Control
from tts_bridge.mqtt import discovery
from tts_bridge.mqtt.api import BridgeApi
from tts_bridge.mqtt.bridge import OFFLINE, Bridge
from tts_bridge.mqtt.client import MqttConnection, OutgoingMessage
from tts_bridge.mqtt.hermes import HermesFrontEnd
from tts_bridge.mqtt.journal import Journal, JournalError
from tts_bridge.mqtt.outbox import Connection, Outbox
from tts_bridge.mqtt.protocol import Topics
from tts_bridge.mqtt.reports import Reports
from tts_bridge.mqtt.say import SayFrontEnd
from tts_bridge.players import connection as players_connection
from tts_bridge.players.announce import Announcer
from tts_bridge.players.restores import FILE_NAME as PLAYER_RESTORES_FILE
from tts_bridge.players.service import Players
from tts_bridge.speech.activity import ActivityLog
from tts_bridge.speech.delivery import AudioDelivery
from tts_bridge.speech.idle import IdleWork, read_phrases
from tts_bridge.speech.metrics import Metrics, State
from tts_bridge.speech.phrase_list import FILE_NAME as PHRASES_FILE
from tts_bridge.speech.phrase_list import PhraseList
from tts_bridge.speech.pipeline import Pipeline
from tts_bridge.speech.preferences import Preferences, restore_default_voice
from tts_bridge.speech.routing import TierRouter
from tts_bridge.speech.scheduler import Scheduler
from tts_bridge.speech.synthesis import Synthesizer
from tts_bridge.speech.voice_admin import VoiceAdmin, VoiceAdminError
from tts_bridge.system import folders
from tts_bridge.system.connections import ConnectionCaps, fit_connection_caps, open_files
from tts_bridge.system.degraded import Degraded
from tts_bridge.system.faults import is_storage_fault
from tts_bridge.system.threads import ThreadPlan
from tts_bridge.web import status_page
from tts_bridge.web.api_keys import ApiKeys, ApiKeysError
from tts_bridge.web.metrics_route import MetricsRoute
from tts_bridge.web.server import AudioServer
from tts_bridge.web.speech_api import SpeechApi
from tts_bridge.web.ui import WebUi
from tts_bridge.wyoming.server import WyomingServer

if TYPE_CHECKING:
    from tts_bridge.engines.base import Engine

_LOGGER = logging.getLogger(__name__)


class Server(Protocol):
    """A front end with its own listener (Wyoming, HTTP), given the pipeline."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def thread_plan(settings: Settings) -> ThreadPlan:
    """The hardware plan, with the settings' explicit values taking precedence."""
    from tts_bridge.system.threads import plan_for_settings

    return plan_for_settings(settings)


def build_synthesizer(
    settings: Settings, plan: ThreadPlan | None = None, metrics: Metrics | None = None
) -> Synthesizer:
    """The engine pool and the sentence cache behind a synthesizer (no model is loaded yet);
    `metrics` counts its cache lookups and synthesis times."""
    from tts_bridge.engines.registry import EnginePool
    from tts_bridge.speech.cache import SentenceCache
    from tts_bridge.speech.pronunciations import Pronunciations
    from tts_bridge.system.threads import numpy_blas_on_one_thread

    numpy_blas_on_one_thread()
    pool = EnginePool(
        settings,
        plan=plan if plan is not None else thread_plan(settings),
        on_load=_count_load(metrics) if metrics is not None else None,
        on_unload=_count_unload(metrics) if metrics is not None else None,
    )
    # The lexicon's edits live in the state folder, beside the journal.
    lexicon = Pronunciations.from_settings(settings, settings.journal.path.parent)
    return Synthesizer(
        settings, pool, SentenceCache(settings.cache), pronunciations=lexicon, metrics=metrics
    )


def _count_load(metrics: Metrics) -> Callable[[Engine, float], None]:
    return lambda engine, seconds: metrics.model_loaded(engine.identity, seconds)


def _count_unload(metrics: Metrics) -> Callable[[Engine], None]:
    return lambda engine: metrics.model_unloaded(engine.identity)


def open_journal(settings: Settings) -> Journal | None:
    """Open the request journal; a damaged one is moved aside (its entries are lost, logged).

    None when its storage cannot be written (a full disk cannot hold a new journal): the
    bridge then serves without one, acking each request after its answer, and tries again.
    """
    path = settings.journal.path
    try:
        return Journal(path, keep_done_s=settings.journal.keep_done_s)
    except JournalError as exc:
        if "in use" in str(exc):
            raise
        if _storage_fault(exc):
            _LOGGER.error(
                "%s; serving without the journal (each request acknowledged after its answer) "
                "and trying again every minute",
                exc,
            )
            return None
        aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
        _LOGGER.error("%s; moving it to %s and starting a new journal", exc, aside)
        try:
            path.rename(aside)
            return Journal(path, keep_done_s=settings.journal.keep_done_s)
        except (OSError, JournalError) as again:
            if isinstance(again, OSError) or _storage_fault(again):
                _LOGGER.error("%s; serving without the journal", again)
                return None
            raise


def _storage_fault(exc: JournalError) -> bool:
    """A journal that fails for its storage (not its content): kept, opened again later."""
    cause = exc.__cause__
    return cause is not None and is_storage_fault(cause)


def build_pipeline(
    settings: Settings,
    synthesizer: Synthesizer,
    workers: int = 1,
    idle_nice: int = 10,
    *,
    metrics: Metrics | None = None,
    activity: ActivityLog | None = None,
) -> Pipeline:
    sched = settings.scheduler
    # Phrases added at run time live in the state folder, beside the journal.
    phrases = PhraseList(read_phrases(settings), settings.journal.path.parent / PHRASES_FILE)
    idle = IdleWork(settings, synthesizer, phrases)
    scheduler = Scheduler(
        workers,
        settings.limits.max_queue,
        background=idle if sched.idle_enabled else None,
        idle_delay_s=sched.idle_delay_s,
        idle_max_load=sched.idle_max_load,
        idle_nice=idle_nice,
        door_share=settings.limits.door_share,
        peer_share=settings.limits.peer_share,
    )
    router = TierRouter(sched.latency_budget_ms, sched.hysteresis)
    return Pipeline(
        settings, synthesizer, scheduler, router, idle, metrics=metrics, activity=activity
    )


class Service:
    """Everything built, started and stopped in the right order."""

    def __init__(
        self,
        settings: Settings,
        *,
        pipeline: Pipeline,
        outbox: Outbox,
        bridge: Bridge,
        say: SayFrontEnd,
        hermes: HermesFrontEnd,
        api: BridgeApi,
        reports: Reports,
        servers: Sequence[Server] = (),
        voice_admin: VoiceAdmin | None = None,
        degraded: Degraded | None = None,
        players: Players | None = None,
    ) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.outbox = outbox
        self.bridge = bridge
        self.say = say
        self.hermes = hermes
        self.api = api
        self.reports = reports
        self.servers = list(servers)
        self.voice_admin = voice_admin
        self.degraded = degraded if degraded is not None else Degraded()
        """Parts off or reduced since start-up (folders, servers), for health."""
        self.players = players
        """The targets' Home Assistant media players (None in services built without)."""
        self._stopped = False

    @property
    def journal(self) -> Journal | None:
        """The request journal in use (None while it cannot be opened)."""
        return self.bridge.journal

    @property
    def idle(self) -> IdleWork:
        return self.pipeline.idle

    def start(self) -> None:
        """Start the pipeline, the servers (before the bridge, whose resumed requests may need
        them), then the MQTT side. A server that cannot start (its port taken) is logged, and
        the rest keeps serving without it."""
        self.pipeline.start()
        if self.players is not None:
            self.players.start()  # before the bridge: resumed requests may play
        for server in self.servers:
            try:
                server.start()
            except Exception as exc:
                _LOGGER.error(
                    "%s did not start; serving without it: %s", type(server).__name__, exc
                )
                self.degraded.set(_server_part(server), f"did not start: {exc}")
        self.bridge.start()

    def reload_voices(self) -> None:
        """Read the voices file again (SIGHUP); a bad file is logged and changes nothing."""
        if self.voice_admin is None:
            return
        try:
            self.voice_admin.reload()
        except VoiceAdminError as exc:
            _LOGGER.error("Voices not reloaded (%s): %s", exc.code, exc)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the servers, drain live work (bounded), say offline, close cache and journal."""
        if self._stopped:
            return
        self._stopped = True
        for server in reversed(self.servers):
            server.stop()
        self.bridge.stop(timeout_s)
        if self.players is not None:
            self.players.stop()  # the volumes still pending are put back
        self.pipeline.synthesizer.cache.close()
        if self.bridge.journal is not None:
            self.bridge.journal.close()
        _LOGGER.info("Stopped")


def _server_part(server: Server) -> str:
    return {WyomingServer: "wyoming", AudioServer: "http"}.get(type(server), type(server).__name__)


def build_audio_server(
    settings: Settings,
    caps: ConnectionCaps | None = None,
    *,
    health_report: Callable[[], dict[str, Any]] | None = None,
    status_page: Callable[[], str] | None = None,
) -> AudioServer | None:
    """The HTTP audio server when http.enabled (built, not yet listening); None, logged, when
    its folder or key cannot be made (the MQTT side serves without URLs)."""
    if not settings.http.enabled:
        return None
    try:
        return AudioServer.from_settings(
            settings, caps, health_report=health_report, status_page=status_page
        )
    except OSError as exc:
        _LOGGER.error("The HTTP audio server is off: %s", exc)
        return None


def watch_metrics(metrics: Metrics, pipeline: Pipeline, outbox: Outbox) -> None:
    """The service's state in its metrics (the pipeline, the synthesizer and the engine pool
    count into them from their construction)."""
    synth = pipeline.synthesizer

    def state() -> State:
        engines = synth.engines
        cache = synth.cache.stats()
        return State(
            queue_depth={
                **{lane: sum(ranks.values()) for lane, ranks in pipeline.scheduler.lanes().items()},
                "idle": pipeline.idle.pending(),
            },
            resident_bytes=psutil.Process().memory_info().rss,
            broker_connected=outbox.connected,
            loaded_models=tuple(engines.loaded()),
            model_resident_bytes={k: v * 2**20 for k, v in engines.resident_mb().items()},
            cache_entries=int(cache["entries"]),
            cache_bytes=int(cache["bytes"]),
        )

    metrics.watch(state)


def status_url(audio_server: AudioServer | None) -> str | None:
    """The status page's URL once the audio server listens (servers start before the bridge
    connects and publishes discovery, so the first discovery has the port a `port: 0` got)."""
    if audio_server is None or not audio_server.bound:
        return None
    return audio_server.base_url + "/"


def build(
    settings: Settings,
    *,
    plan: ThreadPlan | None = None,
    synthesizer: Synthesizer | None = None,
    connection: Connection | None = None,
    metrics: Metrics | None = None,
) -> Service:
    """The whole service from `settings` (`synthesizer`, `connection` and `metrics` may be
    given, as tests do; by default they are built here: a given synthesizer counts into the
    `metrics` it was built with)."""
    degraded = Degraded()
    # Before anything opens a folder: an unwritable one is one log line, not a traceback.
    settings = folders.prepare(settings, degraded)
    plan = plan if plan is not None else thread_plan(settings)
    metrics = metrics if metrics is not None else Metrics()
    synth = synthesizer if synthesizer is not None else build_synthesizer(settings, plan, metrics)
    pipeline = build_pipeline(
        settings,
        synth,
        plan.synthesis_concurrency,
        plan.idle_nice,
        metrics=metrics,
        # Every door's last requests, in memory (bounded), for the web UI's Activity page.
        activity=ActivityLog(),
    )
    journal = open_journal(settings)
    # Before anything reports the default voice: the one chosen in Home Assistant last time.
    preferences = Preferences.beside(settings.journal.path)
    restore_default_voice(preferences, synth.engines)
    if connection is None:
        will = OutgoingMessage(Topics(settings.mqtt.base_topic).state, OFFLINE, qos=1, retain=True)
        connection = MqttConnection(settings.mqtt, will)
    outbox = Outbox(settings, connection)
    # Raises the open-file limit, then fits the doors' connection caps under it.
    caps = fit_connection_caps(settings)
    wyoming = WyomingServer(settings, pipeline, caps)
    players = Players(
        settings,
        players_connection.connection(settings, os.environ),
        settings.journal.path.parent / PLAYER_RESTORES_FILE,
    )
    bridge: Bridge | None = None
    audio_server: AudioServer | None = None
    reports = Reports(
        settings,
        outbox,
        pipeline,
        lambda: _faults(bridge, degraded, synth, connection),
        configuration_url=lambda: status_url(audio_server),
        doors=lambda: {
            "connections": {
                "wyoming": wyoming.describe(),
                **({"http": audio_server.describe()} if audio_server is not None else {}),
            },
            "open_files": open_files(),
        },
    )
    audio_server = build_audio_server(
        settings,
        caps,
        health_report=reports.health,
        # With the web UI on, its Status section shows this; with it off, the page at /.
        status_page=(
            (
                lambda: status_page.render(
                    discovery.DEVICE_NAME,
                    reports.info(),
                    reports.health(),
                    _wyoming_line(settings, wyoming),
                )
            )
            if settings.http.ui == "off"
            else None
        ),
    )
    if settings.http.enabled and audio_server is None:
        degraded.set("http", "the HTTP audio server is off (see the log)")
    delivery = AudioDelivery(settings, audio_server)
    say = SayFrontEnd(settings, outbox, pipeline, journal, delivery, players=players)
    hermes = HermesFrontEnd(settings, outbox, pipeline)
    if audio_server is not None and settings.http.api_enabled:
        speech_api = _speech_api(settings, pipeline, audio_server, Announcer(delivery, players))
        if speech_api is not None:
            audio_server.routes.append(speech_api)
    watch_metrics(metrics, pipeline, outbox)
    if audio_server is not None and settings.http.metrics:
        audio_server.routes.append(MetricsRoute(metrics))
    control = Control(pipeline, preferences, reports.publish_info)

    def voices_changed() -> None:
        # Wyoming's describe and the HTTP voice list read the pool; these are retained.
        reports.publish_info()
        reports.publish_discovery()

    voice_admin = VoiceAdmin(settings, synth.engines, voices_changed)
    api = BridgeApi(
        settings,
        outbox,
        pipeline,
        reports,
        preferences,
        control=control,
        more=voice_admin.requests(),
    )
    if audio_server is not None and settings.http.ui != "off":
        audio_server.routes.append(
            WebUi(
                settings,
                pipeline,
                control,
                audio_server,
                ui_keys(settings),
                voice_admin=voice_admin,
                info=reports.info,
                health=reports.health,
                status=lambda: status_page.render_section(
                    reports.info(), reports.health(), _wyoming_line(settings, wyoming)
                ),
            )
        )
    # The MQTT front ends, in dispatch order (each owns distinct topics); a new one goes here.
    front_ends = [say, api, reports, hermes]
    bridge = Bridge(
        settings,
        connection,
        outbox=outbox,
        pipeline=pipeline,
        journal=journal,
        say=say,
        front_ends=front_ends,
        open_journal=lambda: open_journal(settings),
    )
    # Front ends with their own listeners (Wyoming, HTTP) go here, built with the pipeline.
    servers: list[Server] = [wyoming]
    if audio_server is not None:
        servers.append(audio_server)
    return Service(
        settings,
        pipeline=pipeline,
        outbox=outbox,
        bridge=bridge,
        say=say,
        hermes=hermes,
        api=api,
        reports=reports,
        servers=servers,
        voice_admin=voice_admin,
        degraded=degraded,
        players=players,
    )


def _wyoming_line(settings: Settings, wyoming: WyomingServer) -> str:
    return status_page.wyoming_state(
        settings.wyoming.enabled, wyoming.serving, settings.wyoming.port
    )


def _speech_api(
    settings: Settings, pipeline: Pipeline, audio_server: AudioServer, announcer: Announcer
) -> SpeechApi | None:
    """The speech API's routes, or None when its keys file cannot be read (logged)."""
    try:
        keys = ApiKeys.from_settings(settings.http)
    except ApiKeysError as exc:
        _LOGGER.error("The HTTP speech API is off: %s", exc)
        return None
    if not keys.required:  # said once: the web UI reads the same keys
        _LOGGER.info("The HTTP speech API takes no key: anyone who reaches the port may use it")
    return SpeechApi(settings, pipeline, keys, store=audio_server, announcer=announcer)


def ui_keys(settings: Settings) -> ApiKeys:
    """The web UI's keys: the speech API's. A keys file that cannot be read is logged, and the
    UI then asks for a key none can give (safe: it never opens because of a broken file)."""
    try:
        return ApiKeys.from_settings(settings.http)
    except ApiKeysError as exc:
        _LOGGER.error("The web UI cannot be signed in to: %s", exc)
        return ApiKeys(["\0unusable"])


def _faults(
    bridge: Bridge | None, degraded: Degraded, synth: Synthesizer, connection: Connection
) -> dict[str, object]:
    """The bridge's fault counts and the health status: ok, or degraded with the reasons."""
    found = bridge.faults() if bridge is not None else {}
    live = {
        "cache": synth.cache.degraded and f"cannot be written ({synth.cache.degraded})",
        "journal": found.get("journal_degraded") and f"{found['journal_degraded']}",
        "mqtt": None if connection.connected.is_set() else "not connected to the broker",
    }
    return {**found, **degraded.report(live)}
