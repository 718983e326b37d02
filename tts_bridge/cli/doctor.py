"""`tts-bridge doctor`: a checklist of everything the bridge depends on, one line per check.

Each check is a small function that returns a :class:`CheckResult`, so tests (and other
commands) can run one check on its own. ``run_doctor`` runs them in the order a user would debug
a silent speaker: the machine and the thread plan, the broker, the cache and its disk, then each
voice's model and a one-sentence timing through its engine.

``container_health`` is the Docker health check: healthy, degraded (serving without some part,
exit status 0) or unhealthy (serving nothing, 1).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import shutil
import socket
import sqlite3
import ssl
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode

from tts_bridge import __version__
from tts_bridge.config import ConfigError, Settings, load_settings
from tts_bridge.engines import catalog as _engines  # noqa: F401 (voices are checked as they load)
from tts_bridge.mqtt import callbacks
from tts_bridge.mqtt.client import new_client
from tts_bridge.mqtt.settings import MqttSettings
from tts_bridge.speech.settings import CacheSettings
from tts_bridge.system.hardware import Hardware, detect_hardware
from tts_bridge.system.threads import ThreadPlan

if TYPE_CHECKING:
    from tts_bridge.engines.registry import Voice

_LOGGER = logging.getLogger(__name__)

TIMING_SENTENCE = "The front door is open."
TIMING_SENTENCES = {"zh": "前门开着。"}
"""The sentence a voice that does not speak English is timed with, by its language."""
_MIB = 1024 * 1024
# Below this, diskcache's SQLite file and new entries cannot be written reliably.
_MIN_FREE_DISK_MB = 64
# After SUBACK the broker sends the retained state at once; this only covers a slow link.
_RETAINED_GRACE_S = 0.5
# Where the Docker image looks for a configuration file when TTS_BRIDGE_CONFIG is not set;
# docker/entrypoint.sh uses the same path.
CONTAINER_CONFIG = Path("/config/config.yaml")


class Status(enum.StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: one line in the checklist, plus optional indented notes."""

    name: str
    """Short name shown in the checklist, e.g. ``broker`` or ``voice joe``."""
    status: Status
    """PASS, WARN (works, but worth a look) or FAIL (the bridge will not work as configured)."""
    detail: str
    """One line saying what was found, or what is wrong and what to change."""
    notes: tuple[str, ...] = ()
    """Further lines shown under the check (the thread plan's reasons)."""

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL


# -- the machine -----------------------------------------------------------------------------


def check_hardware(hardware: Hardware) -> CheckResult:
    """What the thread plan is based on; informational, it always passes."""
    return CheckResult("hardware", Status.PASS, "; ".join(hardware.describe()))


def check_plan(plan: ThreadPlan) -> CheckResult:
    """The thread plan; a warning when it oversubscribes the CPUs (overrides can do that)."""
    first, *rest = plan.describe()
    warnings = [reason for reason in plan.reasons if reason.startswith("warning:")]
    status = Status.WARN if warnings else Status.PASS
    return CheckResult("thread plan", status, first, tuple(rest))


# -- the broker ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerAnswer:
    """What a short MQTT 5 session with the broker found out."""

    connected: bool
    """True when the broker accepted the connection (CONNACK success)."""
    problem: str | None
    """Why there is no usable connection: the CONNACK reason or the socket error, else None."""
    subscribe_refused: str | None = None
    """The SUBACK reason when the broker refused the subscription to the bridge's state."""
    bridge_state: str | None = None
    """The retained ``<base>/bridge/state`` (``online``/``offline``); None when there is none."""


def broker_url(settings: MqttSettings) -> str:
    """How the checklist names the broker; the one place that will say mqtts:// with TLS."""
    scheme = "mqtts" if settings.tls.enabled else "mqtt"
    return f"{scheme}://{settings.host}:{settings.port}"


def _make_client(settings: MqttSettings) -> mqtt.Client:
    # A client id of its own: connecting with the bridge's id would take over (and so
    # disconnect) a running bridge's session.
    # A failed TLS handshake arrives as ssl.SSLError and _socket_problem words it.
    return new_client(settings, client_id=f"{settings.client_id}-doctor-{uuid.uuid4().hex[:8]}")


def _socket_problem(settings: MqttSettings, exc: OSError, timeout_s: float) -> str:
    where = f"{settings.host}:{settings.port}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused: nothing listens on {where} (is the broker running?)"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name {settings.host!r} ({exc.strerror})"
    if isinstance(exc, TimeoutError):
        return f"no answer from {where} within {timeout_s:g} s (wrong host, or a firewall?)"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake with {where} failed: {exc.reason or exc}"
    return f"cannot connect to {where}: {exc.strerror or exc}"


def probe_broker(
    settings: MqttSettings, timeout_s: float = 5.0, *, state_wait_s: float = _RETAINED_GRACE_S
) -> BrokerAnswer:
    """Connect with MQTT 5, subscribe to the bridge's state topic, read it, disconnect.

    Runs paho's loop on this thread (no background thread), bounded by ``timeout_s`` for the
    connection and ``state_wait_s`` for the retained state after the SUBACK.
    """
    state_topic = f"{settings.base_topic}/bridge/state"
    connack: list[ReasonCode] = []
    suback: list[ReasonCode] = []
    state: list[bytes] = []

    def on_message(message: mqtt.MQTTMessage) -> None:
        if message.topic == state_topic and message.retain:
            state.append(bytes(message.payload))

    client = _make_client(settings)
    client.connect_timeout = timeout_s
    callbacks.attach(
        client,
        connected=lambda reason, flags, properties: connack.append(reason),
        subscribed=suback.extend,
        received=on_message,
    )
    try:
        client.connect(settings.host, settings.port, keepalive=max(5, int(timeout_s) * 2))
    except OSError as exc:
        return BrokerAnswer(False, _socket_problem(settings, exc, timeout_s))
    try:
        lost = _loop_until(client, lambda: bool(connack), time.monotonic() + timeout_s)
        if not connack:
            return BrokerAnswer(
                False, lost or f"no CONNACK within {timeout_s:g} s (is this an MQTT broker?)"
            )
        if connack[0].is_failure:
            return BrokerAnswer(False, f"refused by the broker: {connack[0].getName()}")
        client.subscribe(state_topic, qos=1)
        _loop_until(client, lambda: bool(suback), time.monotonic() + timeout_s)
        refused = next((r.getName() for r in suback if r.is_failure), None)
        if suback and refused is None:
            _loop_until(client, lambda: bool(state), time.monotonic() + state_wait_s)
        return BrokerAnswer(
            True,
            None,
            subscribe_refused=refused if suback else "no SUBACK",
            bridge_state=_state_name(state[0]) if state else None,
        )
    finally:
        client.disconnect()


def _loop_until(client: mqtt.Client, done: Callable[[], bool], deadline: float) -> str | None:
    """Run paho's loop until ``done()`` or the deadline; the error text if the link dropped."""
    while not done() and time.monotonic() < deadline:
        rc = client.loop(timeout=0.05)
        if rc != mqtt.MQTT_ERR_SUCCESS:
            # The broker closes the socket right after a refusing CONNACK; that CONNACK has
            # already reached on_connect, so only a loss before it is worth reporting.
            return f"the broker closed the connection ({mqtt.error_string(rc)})"
    return None


def _state_name(payload: bytes) -> str:
    try:
        return str(json.loads(payload)["state"])
    except (ValueError, KeyError, TypeError):
        return f"unreadable ({payload[:40]!r})"


def check_broker(settings: MqttSettings, timeout_s: float = 5.0) -> CheckResult:
    """A real MQTT 5 connect with the configured credentials; the CONNACK reason on refusal."""
    who = f"as {settings.username!r}" if settings.username is not None else "anonymously"
    where = f"{broker_url(settings)} {who}"
    answer = probe_broker(settings, timeout_s)
    if not answer.connected:
        hint = _connack_hint(answer.problem or "")
        return CheckResult("broker", Status.FAIL, f"{where}: {answer.problem}{hint}")
    if answer.subscribe_refused is not None:
        return CheckResult(
            "broker",
            Status.FAIL,
            f"{where}: connected, but subscribing to {settings.base_topic}/bridge/state was "
            f"refused ({answer.subscribe_refused}); check the broker's ACL for this user",
        )
    if answer.bridge_state is None:
        bridge = "no bridge has connected yet"
    else:
        bridge = f"bridge {answer.bridge_state}"
    return CheckResult("broker", Status.PASS, f"{where}: connected (MQTT 5); {bridge}")


def _connack_hint(reason: str) -> str:
    lowered = reason.lower()
    if "not authorized" in lowered or "user name or password" in lowered:
        return " (check mqtt.username and mqtt.password)"
    if "client identifier" in lowered:
        return " (check mqtt.client_id)"
    if "unsupported protocol" in lowered:
        return " (the broker does not speak MQTT 5; mosquitto 1.6 or newer does)"
    return ""


def container_health(
    environ: dict[str, str] | None = None,
    default_config: Path = CONTAINER_CONFIG,
    timeout_s: float = 3.0,
) -> int:
    """Docker HEALTHCHECK: 0 while the bridge serves (``healthy``, or ``degraded`` with the
    parts that are off and why), 1 only when it serves nothing.

    The bridge's own report at ``/health`` on its HTTP port is asked first: it knows every part
    (cache, journal, broker, servers). Without an answer there, the Wyoming server is asked to
    describe itself and the broker for the bridge's retained state (online on every connect,
    offline by its Last Will): a process that merely exists proves nothing, since it is PID 1.
    The settings are read as docker/entrypoint.sh reads them.
    """
    env = dict(os.environ if environ is None else environ)
    path = Path(env.get("TTS_BRIDGE_CONFIG") or default_config)
    env.pop("TTS_BRIDGE_CONFIG", None)
    try:
        settings = load_settings(path if path.is_file() else None, environ=env)
    except ConfigError as exc:
        print(f"unhealthy: {exc}")
        return 1
    problems: dict[str, str] = {}
    if settings.http.enabled:
        report, why = _http_health(settings.http.port, timeout_s)
        if report is not None:
            return _print_status(report)
        problems["http"] = why
    serving = []
    if settings.wyoming.enabled:
        problem = _wyoming_problem(settings.wyoming.port, timeout_s)
        if problem is None:
            serving.append("wyoming")
        else:
            problems["wyoming"] = problem
    answer = probe_broker(settings.mqtt, timeout_s, state_wait_s=timeout_s)
    if not answer.connected:
        problems["mqtt"] = f"broker {broker_url(settings.mqtt)}: {answer.problem}"
    elif answer.bridge_state != "online":
        problems["mqtt"] = f"bridge state is {answer.bridge_state or 'not published'}"
    else:
        serving.append("mqtt")
    if not serving:
        print("unhealthy: " + "; ".join(f"{part}: {why}" for part, why in problems.items()))
        return 1
    return _print_status({"status": "degraded" if problems else "ok", "degraded": problems})


def _print_status(report: dict[str, Any]) -> int:
    degraded = report.get("degraded") or {}
    if report.get("status") == "ok" and not degraded:
        print("healthy: serving")
    else:
        print("degraded: " + "; ".join(f"{part}: {why}" for part, why in degraded.items()))
    return 0


def _local_host() -> str:
    return "127.0.0.1"


def _http_health(port: int, timeout_s: float) -> tuple[dict[str, Any] | None, str]:
    """The bridge's /health report, or None and why there is none."""
    import urllib.error
    import urllib.request

    url = f"http://{_local_host()}:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            report = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return None, f"{url}: HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return None, f"{url}: {getattr(exc, 'reason', exc)}"
    if not isinstance(report, dict) or "status" not in report:
        return None, f"{url}: not a health report"
    return report, ""


def _wyoming_problem(port: int, timeout_s: float) -> str | None:
    """None when the Wyoming server answers ``describe`` with ``info``, else why not."""
    try:
        with socket.create_connection((_local_host(), port), timeout=timeout_s) as sock:
            sock.sendall(b'{"type": "describe"}\n')
            line = sock.makefile("rb").readline(65536)
    except OSError as exc:
        return f"port {port}: {exc.strerror or exc}"
    try:
        event = json.loads(line)
    except ValueError:
        return f"port {port}: no Wyoming answer"
    if not isinstance(event, dict) or event.get("type") != "info":
        return f"port {port}: answered {str(event)[:60]!r} to describe"
    return None


# -- the cache and its disk --------------------------------------------------------------------


def check_cache(settings: CacheSettings) -> tuple[CheckResult, int]:
    """The cache folder can be created and written, and the cache opens; also its bytes used."""
    directory = settings.dir
    if not settings.enabled:
        return (
            CheckResult(
                "cache",
                Status.WARN,
                f"disabled (cache.enabled: false): every sentence is synthesized, even repeats "
                f"({directory} not checked)",
            ),
            0,
        )
    # Imported here (as the engine registry below) so that the container health check, which
    # runs every 30 s on small boards, does not pay for numpy and diskcache.
    from tts_bridge.speech.cache import SentenceCache

    try:
        cache = SentenceCache(settings)  # creates the folder (0700) and opens its SQLite index
    except (OSError, sqlite3.Error) as exc:
        return CheckResult("cache", Status.FAIL, _write_problem(directory, exc)), 0
    try:
        # diskcache can open an existing index read-only; a real file proves new entries fit.
        with tempfile.NamedTemporaryFile(dir=cache.directory, prefix=".doctor-") as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
        stats = cache.stats()
    except (OSError, sqlite3.Error) as exc:
        return CheckResult("cache", Status.FAIL, _write_problem(directory, exc)), 0
    finally:
        cache.close()
    used = int(stats["bytes"])
    hit_rate = stats["hit_rate"]
    hits = f", lifetime hit rate {hit_rate:.0%}" if hit_rate is not None else ""
    detail = (
        f"{directory} writable; {stats['entries']} sentences, {used / _MIB:.1f} MB of "
        f"{int(stats['max_bytes']) // _MIB} MB{hits}"
    )
    return CheckResult("cache", Status.PASS, detail), used


def _write_problem(directory: Path, exc: OSError | sqlite3.Error) -> str:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    where = getattr(exc, "filename", None) or directory
    return f"cannot write the cache folder {directory}: {reason} ({where}); check cache.dir"


def check_disk(settings: CacheSettings, cache_bytes: int = 0) -> CheckResult:
    """Free space where the cache lives, against the room ``cache.max_mb`` may still take."""
    existing = settings.dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        usage = shutil.disk_usage(existing)
    except OSError as exc:
        return CheckResult("disk", Status.FAIL, f"cannot read free space at {existing}: {exc}")
    free_mb = usage.free // _MIB
    growth_mb = max(0, settings.max_mb - cache_bytes // _MIB) if settings.enabled else 0
    detail = f"{_size_text(usage.free)} free of {_size_text(usage.total)} at {existing}"
    if free_mb < _MIN_FREE_DISK_MB:
        return CheckResult("disk", Status.FAIL, f"{detail}; the cache cannot grow")
    if free_mb < growth_mb:
        return CheckResult(
            "disk",
            Status.WARN,
            f"{detail}, but the cache may grow by {growth_mb} MB more; lower cache.max_mb",
        )
    return CheckResult("disk", Status.PASS, detail)


def _size_text(size: int) -> str:
    if size >= 1024 * _MIB:
        return f"{size / (1024 * _MIB):.1f} GB"
    return f"{size / _MIB:.0f} MB"


# -- voices ------------------------------------------------------------------------------------


def check_voice(settings: Settings, name: str, threads: int) -> tuple[CheckResult, Voice | None]:
    """The voice's model file is present and hashed and its engine accepts it (no model load).

    Returns the voice for the timing check, or None when it cannot be built.
    """
    from tts_bridge.engines.base import EngineError
    from tts_bridge.engines.catalog import model_path
    from tts_bridge.engines.registry import EnginePool

    label = f"voice {name}"
    # A pool of this voice alone, so one broken voice does not hide the state of the others.
    alone = settings.model_copy(
        update={"voices": {name: settings.voices[name]}, "default_voice": name}
    )
    try:
        model = model_path(settings.voices[name], settings.models.dir)
        voice = EnginePool(alone, threads=threads).voice(name)
        size = model.stat().st_size if model is not None else None
    except (EngineError, OSError) as exc:
        return CheckResult(label, Status.FAIL, str(exc)), None
    engine = voice.engine
    default = " (default)" if name == settings.default_voice else ""
    model_text = ""
    if model is not None and size is not None:
        # Bundled models live deep in site-packages; their file name says enough.
        where = model.name if settings.voices[name].model is None else str(model)
        model_text = f"model {where} ({size / _MIB:.1f} MB), "
    detail = (
        f"{engine.name}, {voice.tier} tier, {'/'.join(sorted(engine.languages))}, "
        f"{engine.sample_rate} Hz{default}; {model_text}identity {engine.identity}"
    )
    return CheckResult(label, Status.PASS, detail), voice


def check_timing(voice: Voice, sentence: str = TIMING_SENTENCE) -> CheckResult:
    """Load the voice's engine and speak one sentence twice: load, first and steady timing.

    The first synthesis after a load pays onnxruntime's first-run allocations; the second shows
    the speed a live request gets. The engine is unloaded afterwards.
    """
    from tts_bridge.engines.base import EngineError, SynthesisOptions

    label = f"timing {voice.name}"
    engine = voice.engine
    options = SynthesisOptions(speed=voice.settings.speed)
    try:
        started = time.perf_counter()
        engine.load()
        load_s = time.perf_counter() - started
        started = time.perf_counter()
        list(engine.synthesize(sentence, voice.speaker, options))
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        samples = sum(len(c) for c in engine.synthesize(sentence, voice.speaker, options))
        synth_s = time.perf_counter() - started
    except EngineError as exc:
        return CheckResult(label, Status.FAIL, f"{engine.identity}: {exc}")
    except Exception as exc:  # an engine bug is a failed check, not a crashed doctor
        _LOGGER.exception("Engine %s failed", engine.identity)
        return CheckResult(label, Status.FAIL, f"{engine.identity}: {type(exc).__name__}: {exc}")
    finally:
        engine.unload()
    if samples == 0:
        return CheckResult(label, Status.FAIL, f"{engine.identity} produced no audio")
    audio_s = samples / engine.sample_rate
    rtf = synth_s / audio_s
    detail = (
        f"load {load_s * 1000:.0f} ms; {sentence!r} first {first_s * 1000:.0f} ms, then "
        f"{synth_s * 1000:.0f} ms for {audio_s:.2f} s of audio: RTF {rtf:.3f} "
        f"({_times_real_time(rtf)} real time)"
    )
    if rtf >= 1.0:
        return CheckResult(label, Status.WARN, f"{detail}; slower than real time: listeners wait")
    return CheckResult(label, Status.PASS, detail)


# -- the checklist -----------------------------------------------------------------------------


def format_result(result: CheckResult) -> str:
    lines = [f"{result.status.value}  {result.name:<16} {result.detail}"]
    lines += [f"{'':6}{'':<16} {note}" for note in result.notes]
    return "\n".join(lines)


def run_doctor(
    settings: Settings,
    plan: ThreadPlan,
    out: TextIO,
    *,
    hardware: Hardware | None = None,
    broker_timeout_s: float = 5.0,
) -> int:
    """Print the checklist to ``out``; 1 when any check failed, else 0 (warnings pass)."""
    results: list[CheckResult] = []

    def report(result: CheckResult) -> None:
        results.append(result)
        print(format_result(result), file=out, flush=True)

    print(f"tts-bridge {__version__} doctor", file=out)
    report(check_hardware(hardware or detect_hardware()))
    report(check_plan(plan))
    report(check_broker(settings.mqtt, broker_timeout_s))
    cache_result, cache_bytes = check_cache(settings.cache)
    report(cache_result)
    report(check_disk(settings.cache, cache_bytes))
    for name in settings.voices:
        voice_result, voice = check_voice(settings, name, plan.onnx_intra_op_threads)
        report(voice_result)
        if voice is not None:
            languages = voice.engine.languages
            chinese = "en" not in languages and "zh" in languages
            report(check_timing(voice, TIMING_SENTENCES["zh"] if chinese else TIMING_SENTENCE))

    failed = sum(r.status is Status.FAIL for r in results)
    warned = sum(r.status is Status.WARN for r in results)
    warnings = f", {warned} warning(s)" if warned else ""
    if failed:
        print(f"{failed} of {len(results)} checks FAILED{warnings}", file=out)
        return 1
    print(f"all {len(results)} checks passed{warnings}", file=out)
    return 0


def _times_real_time(rtf: float) -> str:
    """1/RTF for people: "39x", "1.3x", "0.45x" (whole numbers hide a voice slower than real
    time as "0x")."""
    speed = 1 / rtf
    return f"{speed:.0f}x" if speed >= 10 else f"{speed:.2g}x"
