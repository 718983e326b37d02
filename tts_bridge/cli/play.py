"""A reference speaker: subscribe to a target's audio and play each WAV, or write it to a folder.

``tts-bridge play --target kitchen`` turns a computer with a sound card (a Raspberry Pi, a
laptop) into a speaker; with ``--out DIR`` it writes the files instead, so a setup can be tested
without any audio hardware. It listens to ``<base>/audio/<target>`` (one WAV per announcement)
and ``<base>/audio/<target>/stream`` (one WAV per sentence).

paho's network thread only queues what arrives; writing and playing happen on the caller's
thread, so a long announcement never stalls the MQTT connection.
"""

from __future__ import annotations

import logging
import queue
import re
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from tts_bridge.mqtt import callbacks
from tts_bridge.mqtt.client import new_client
from tts_bridge.mqtt.settings import MqttSettings
from tts_bridge.system.durable import write_atomic

_LOGGER = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_BROKER = 1
"""The broker could not be reached or refused the connection."""
EXIT_SETUP = 2
"""Nothing to play with (no player program) or the output folder is unusable."""

# Each reads a WAV from standard input; the first one installed is used.
PLAYER_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("aplay", "-q", "-"),
    ("paplay",),
    ("ffplay", "-nodisp", "-autoexit", "-loglevel", "error", "-"),
)
CONNECT_TIMEOUT_S = 10.0
_POLL_S = 0.2
_TARGET_RE = re.compile(r"^([A-Za-z0-9_-]{1,64}|\+)$")
_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class AudioMessage:
    """One received audio message, detached from paho's objects."""

    topic: str
    payload: bytes
    retained: bool
    user_properties: dict[str, str]

    @property
    def request_id(self) -> str | None:
        return self.user_properties.get("id")

    @property
    def seq(self) -> str | None:
        """The sentence number of a streamed chunk; None for a whole announcement."""
        return self.user_properties.get("seq")


def find_player(commands: Sequence[Sequence[str]] = PLAYER_COMMANDS) -> list[str] | None:
    """The first installed player command (with its arguments), or None."""
    for command in commands:
        path = shutil.which(command[0])
        if path:
            return [path, *command[1:]]
    return None


def file_part(text: str | None, limit: int = 64) -> str:
    """``text`` reduced to characters that are safe in a file name on every system."""
    cleaned = _UNSAFE_FILE_CHARS.sub("_", text or "").strip("._-")[:limit]
    return cleaned or "noid"


def is_wav(payload: bytes) -> bool:
    return len(payload) >= 12 and payload[:4] == b"RIFF" and payload[8:12] == b"WAVE"


def write_wav(out_dir: Path, message: AudioMessage, now: datetime | None = None) -> Path:
    """Write the WAV as ``<timestamp>-<id>[-<seq>].wav``; an existing file is never replaced."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S.%f")[:-3]
    stem = f"{stamp}-{file_part(message.request_id)}"
    if message.seq is not None:
        stem += f"-{file_part(message.seq, 8)}"
    path = out_dir / f"{stem}.wav"
    n = 2
    while path.exists():
        path = out_dir / f"{stem}-{n}.wav"
        n += 1
    # Written under a hidden name and renamed, so a program watching the folder never reads
    # half a file; readable by others like any file a shell writes (a player may run as
    # another user).
    write_atomic(path, message.payload, mode=0o644)
    return path


def play_wav(command: Sequence[str], wav: bytes) -> bool:
    """Pipe one WAV into the player and wait until it has played; False if the player failed."""
    try:
        result = subprocess.run(
            list(command),
            input=wav,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=False,
        )
    except OSError as exc:
        _LOGGER.error("Cannot run %s: %s", command[0], exc)
        return False
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip().splitlines()
        _LOGGER.error(
            "%s exited with status %d%s",
            Path(command[0]).name,
            result.returncode,
            f": {detail[-1]}" if detail else "",
        )
        return False
    return True


def run_player(
    host: str,
    port: int,
    base_topic: str,
    target: str,
    out_dir: Path | None,
    *,
    username: str | None = None,
    password: str | None = None,
    tls: MqttSettings | None = None,
    count: int | None = None,
    stop: threading.Event | None = None,
    ready: threading.Event | None = None,
) -> int:
    """Play (or, with ``out_dir``, write) every WAV for ``target`` until ``count`` or Ctrl-C.

    ``target`` ``+`` listens to every target. ``stop`` ends the loop from another thread;
    ``ready`` is set once the broker has confirmed the subscriptions (nothing published before
    that reaches this player, as audio is not retained). ``tls``: connect with these settings'
    TLS section (the bridge's own `mqtt.tls`). Returns a process exit status.
    """
    if not _TARGET_RE.match(target):
        _LOGGER.error("Invalid target %r: use 1-64 letters, digits, '_' or '-' (or '+')", target)
        return EXIT_SETUP
    if count is not None and count < 1:
        _LOGGER.error("count must be at least 1")
        return EXIT_SETUP

    output = _choose_output(out_dir)
    if output is None:
        return EXIT_SETUP
    player, doing = output

    topics = [f"{base_topic}/audio/{target}", f"{base_topic}/audio/{target}/stream"]
    session = _Session(
        host, port, topics, username=username, password=password, tls=tls, ready=ready
    )
    handled = 0
    stop = stop or threading.Event()
    # Once listening, Ctrl-C only sets `stop`: a KeyboardInterrupt raised inside the message
    # queue's Condition.wait can leave its lock held, and the MQTT thread then blocks on put()
    # and close() waits for it for ever.
    restore = _stop_on_ctrl_c(stop)
    # Everything from the first connection attempt on is inside the try: Ctrl-C while the
    # broker is slow to answer is as ordinary as Ctrl-C while waiting for audio.
    try:
        status = session.connect()
        if status != EXIT_OK:
            return status
        _LOGGER.info("Listening on %s; %s", " and ".join(topics), doing)
        while count is None or handled < count:
            if stop.is_set():
                break
            try:
                message = session.messages.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if _handle(message, out_dir, player):
                handled += 1
    except KeyboardInterrupt:
        _LOGGER.info("Interrupted")
    finally:
        restore()
        session.close()
    _LOGGER.info("Stopped after %d audio message(s)", handled)
    return EXIT_OK


def _stop_on_ctrl_c(stop: threading.Event) -> Callable[[], None]:
    """Make SIGINT set `stop` (main thread only; elsewhere signals cannot be handled); returns
    what puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupted(signum: int, frame: object) -> None:
        _LOGGER.info("Interrupted")
        stop.set()

    previous = signal.signal(signal.SIGINT, interrupted)

    def restore() -> None:
        signal.signal(signal.SIGINT, previous)

    return restore


def _choose_output(out_dir: Path | None) -> tuple[list[str] | None, str] | None:
    """(the player command, or None when writing files; what we do), or None if impossible."""
    if out_dir is not None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _LOGGER.error("Cannot use %s for the audio files: %s", out_dir, exc)
            return None
        return None, f"writing to {out_dir}"
    player = find_player()
    if player is None:
        _LOGGER.error(
            "No audio player found (tried %s). Install one (alsa-utils, pulseaudio-utils "
            "or ffmpeg) or write the files instead with --out DIR",
            ", ".join(c[0] for c in PLAYER_COMMANDS),
        )
        return None
    return player, f"playing with {player[0]}"


def _handle(message: AudioMessage, out_dir: Path | None, player: list[str] | None) -> bool:
    """Write or play one message; True if it counted as audio."""
    if message.retained:
        # The bridge never retains audio; a retained WAV is someone's stale test message and
        # would play again at every start.
        _LOGGER.info("Skipping a retained message on %s", message.topic)
        return False
    if not is_wav(message.payload):
        _LOGGER.warning(
            "Skipping %d bytes on %s: not a WAV file", len(message.payload), message.topic
        )
        return False
    what = f"id {message.request_id or '?'}" + (f" #{message.seq}" if message.seq else "")
    if out_dir is not None:
        try:
            path = write_wav(out_dir, message)
        except OSError as exc:
            _LOGGER.error("Cannot write the audio for %s: %s", what, exc)
        else:
            _LOGGER.info("Wrote %s (%d bytes, %s)", path, len(message.payload), what)
    elif player is not None:
        _LOGGER.info("Playing %d bytes (%s)", len(message.payload), what)
        play_wav(player, message.payload)
    return True


class _Session:
    """The player's MQTT 5 connection; paho reconnects by itself and we resubscribe."""

    def __init__(
        self,
        host: str,
        port: int,
        topics: Sequence[str],
        *,
        username: str | None,
        password: str | None,
        tls: MqttSettings | None = None,
        ready: threading.Event | None,
    ) -> None:
        self.host = host
        self.port = port
        self.topics = list(topics)
        self.messages: queue.Queue[AudioMessage] = queue.Queue()
        self._ready = ready
        self._answered = threading.Event()
        self._refused: str | None = None
        # The login is the caller's; TLS is used only when the caller passes its settings.
        login = (tls or MqttSettings(host=host, port=port)).model_copy(
            update={"username": username, "password": password}
        )
        self._client = new_client(login, client_id=f"tts-bridge-player-{uuid.uuid4().hex[:8]}")
        callbacks.attach(
            self._client,
            connected=self._on_connect,
            disconnected=self._on_disconnect,
            subscribed=self._on_subscribe,
            received=self._on_message,
        )

    def connect(self) -> int:
        try:
            self._client.connect(self.host, self.port, keepalive=30)
        except (OSError, ValueError) as exc:
            _LOGGER.error("Cannot connect to mqtt://%s:%d: %s", self.host, self.port, exc)
            return EXIT_BROKER
        self._client.loop_start()
        if not self._answered.wait(CONNECT_TIMEOUT_S):
            _LOGGER.error(
                "No answer from mqtt://%s:%d within %.0f s", self.host, self.port, CONNECT_TIMEOUT_S
            )
            return EXIT_BROKER
        if self._refused is not None:
            _LOGGER.error(
                "mqtt://%s:%d refused the connection: %s", self.host, self.port, self._refused
            )
            return EXIT_BROKER
        return EXIT_OK

    def close(self) -> None:
        """Disconnect and stop paho's thread; harmless if never connected."""
        self._client.disconnect()
        self._client.loop_stop()

    # paho callbacks (network thread, set by callbacks.attach, which logs what they raise):
    # never block.

    def _on_connect(
        self, reason: ReasonCode, flags: mqtt.ConnectFlags, properties: Properties | None
    ) -> None:
        try:
            if reason.is_failure:
                self._refused = reason.getName()
            else:
                self._client.subscribe([(t, SubscribeOptions(qos=1)) for t in self.topics])
        finally:
            self._answered.set()

    def _on_disconnect(self, reason: ReasonCode) -> None:
        if reason.is_failure and self._refused is None:
            _LOGGER.warning("Lost the broker (%s); reconnecting", reason.getName())

    def _on_subscribe(self, reasons: list[ReasonCode]) -> None:
        refused = [r.getName() for r in reasons if r.is_failure]
        if refused:
            _LOGGER.error("The broker refused the subscription: %s", ", ".join(refused))
        elif self._ready is not None:
            self._ready.set()

    def _on_message(self, msg: mqtt.MQTTMessage) -> None:
        pairs: list[tuple[str, str]] = (
            getattr(getattr(msg, "properties", None), "UserProperty", None) or []
        )
        self.messages.put(
            AudioMessage(
                topic=msg.topic,
                payload=bytes(msg.payload),
                retained=bool(msg.retain),
                user_properties=dict(pairs),
            )
        )
