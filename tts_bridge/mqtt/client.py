"""The bridge's MQTT 5 connection (paho-mqtt 2.x): Last Will, reconnect, subscriptions.

paho runs its network loop on its own thread and silently stops that loop when a callback raises,
so every callback is set through ``callbacks.attach``, which catches and logs. The message
handler must only parse and enqueue: inference never runs on the network thread.

Faults the broker reports are made visible:

* a publish the broker refuses (PUBACK reason code >= 0x80, e.g. 135 "Not authorized" from an
  ACL) is logged with its topic and reason, counted in ``refusals`` and reported to the
  publisher's ``on_result``. paho ignores the reason code of a QoS 2 PUBREC; such a refusal
  surfaces as the PUBCOMP's "Packet identifier not found" instead, also a failure.
* a session taken over by another client with the same client id (MQTT 5 reason 142, or
  connections that keep ending within seconds) is one error line naming ``mqtt.client_id``,
  and the reconnects back off (doubling up to ``_TAKEOVER_MAX_DELAY_S``) instead of taking
  the session back every second.
* a message delivered from the broker's retained store carries ``retained=True``: the bridge
  does not execute retained say or API requests (they would run again at every reconnect).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from tts_bridge.mqtt import callbacks
from tts_bridge.mqtt.settings import MqttSettings
from tts_bridge.system.faults import LogThrottle

_LOGGER = logging.getLogger(__name__)
_SESSION_TAKEN_OVER = 142
_TAKEOVER_MAX_DELAY_S = 300
_SHORT_CONNECTION_S = 10.0
"""A connection the broker ends sooner than this, twice in a row, is taken to be a takeover
fight too: mosquitto 2.0 closes the older connection without sending reason 142."""
_STABLE_CONNECTION_S = 60.0
"""After this long connected, a takeover diagnosis is over and reconnects are quick again."""
_PENDING_MAX_AGE_S = 600.0
"""Publishes never acknowledged (the session was lost) are forgotten after this long."""
_REFUSAL_LOG_INTERVAL_S = 60.0


@dataclass(frozen=True)
class IncomingMessage:
    """What the bridge needs of a received message, detached from paho's objects."""

    topic: str
    payload: bytes
    response_topic: str | None
    correlation_data: bytes | None
    duplicate: bool
    mid: int = 0
    qos: int = 0
    retained: bool = False
    """Delivered from the broker's retained store (it was published with the retain flag
    before this subscription). Still ack it; do not execute it."""


@dataclass(frozen=True)
class PublishResult:
    """The broker's answer to one publish (PUBACK, PUBCOMP; QoS 0: sent)."""

    topic: str
    mid: int
    reason_code: int
    """MQTT 5 reason code: 0 = accepted (16 = no matching subscribers, also fine); >= 0x80 =
    refused (135 = not authorized)."""
    reason: str
    """The reason code's name, e.g. 'Not authorized'."""

    @property
    def ok(self) -> bool:
        return self.reason_code < 0x80


def _safe_text(value: str) -> str:
    """Replace characters brokers refuse in UTF-8 strings (a malformed packet would cost the
    connection, and paho would resend it after every reconnect)."""
    return "".join("?" if unicodedata.category(c)[0] == "C" else c for c in value)


@dataclass(frozen=True)
class OutgoingMessage:
    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False
    content_type: str | None = None
    correlation_data: bytes | None = None
    user_properties: Sequence[tuple[str, str]] = ()
    expiry_s: int | None = None

    def properties(self) -> Properties | None:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        used = False
        if self.content_type:
            props.ContentType = self.content_type
            used = True
        if self.correlation_data is not None:
            props.CorrelationData = self.correlation_data
            used = True
        if self.user_properties:
            props.UserProperty = [(k, _safe_text(v)) for k, v in self.user_properties]
            used = True
        if self.expiry_s:
            props.MessageExpiryInterval = self.expiry_s
            used = True
        return props if used else None


def new_client(
    settings: MqttSettings | None = None, *, client_id: str = "", manual_ack: bool = False
) -> mqtt.Client:
    """A paho client as every part of the project connects: MQTT 5, paho's version 2 callbacks,
    TCP_NODELAY, and (from ``settings``) the login and TLS (CA, client certificate and key,
    host name check). ``client_id`` empty: the broker assigns one. Callers set their own
    callbacks and connect."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5,
        reconnect_on_failure=True,
        manual_ack=manual_ack,
    )
    client.on_socket_open = _set_nodelay
    if settings is None:
        return client
    if settings.username is not None:
        client.username_pw_set(settings.username, settings.password)
    tls = settings.tls
    if tls.enabled:
        # A failed handshake surfaces as ssl.SSLError at connect, where callers word it.
        client.tls_set(
            ca_certs=str(tls.ca_file) if tls.ca_file else None,
            certfile=str(tls.cert_file) if tls.cert_file else None,
            keyfile=str(tls.key_file) if tls.key_file else None,
        )
        client.tls_insecure_set(tls.insecure)
    return client


def _set_nodelay(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    # Without TCP_NODELAY, Nagle's algorithm and the peer's delayed ACK hold a small packet
    # that follows a large WAV for ~40 ms per hop (the bench shows it; the broker needs
    # `set_tcp_nodelay true` too for cache hits in a few milliseconds). paho stops its loop
    # when a callback raises, so nothing escapes.
    try:
        if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        _LOGGER.debug("TCP_NODELAY not set: %s", exc)


_BAD_CREDENTIALS = (0x86, 0x87, 0x8C)
"""MQTT 5 CONNACK reasons a login fixes: bad user name or password, not authorized, bad
authentication method."""


def _refusal_hint(reason_code: int, username: str | None) -> str:
    """What to change for a refused connect, in the settings' own names."""
    if reason_code not in _BAD_CREDENTIALS:
        return ""
    if username is None:
        return ": the broker wants a login; set mqtt.username and mqtt.password"
    return f": check mqtt.username/password (user {username!r})"


class MqttConnection:
    """Connects, keeps reconnecting with backoff, and (re)subscribes on every connect.

    The session is persistent (clean start off, session expiry from the settings), so requests
    published while the bridge is away are queued by the broker. Messages are acknowledged by
    the caller (`ack`) once they are safe in the journal: a crash before that makes the broker
    deliver them again.
    """

    def __init__(self, settings: MqttSettings, will: OutgoingMessage) -> None:
        self._settings = settings
        self._subscriptions: list[str] = []
        self._on_message: Callable[[IncomingMessage], None] = lambda message: None
        self._on_connected: Callable[[], None] = lambda: None
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        """Set once the broker acknowledged this connection's subscriptions: from then on a
        request published by anyone reaches the bridge (one sent before may find no subscriber
        and, at QoS 0, be dropped by the broker)."""
        self.max_packet_size: int | None = None
        self.connects = 0
        client = new_client(settings, client_id=settings.client_id, manual_ack=True)
        client.max_queued_messages_set(settings.max_queued_messages)
        client.will_set(will.topic, will.payload, qos=will.qos, retain=will.retain)
        client.reconnect_delay_set(min_delay=1, max_delay=settings.reconnect_max_delay_s)
        callbacks.attach(
            client,
            connected=self._handle_connect,
            disconnected=self._handle_disconnect,
            received=self._handle_message,
            subscribed=self._handle_subscribe,
            connect_failed=self._handle_connect_fail,
            published=self._handle_publish,
        )
        self._last_failure: str | None = None
        self._last_refusal: str | None = None
        """The reason name of the last refused connect, logged once as an error."""
        self._refused_connect = False
        """The latest connect was refused (so its disconnect is no news)."""
        self._client = client
        # Publish results: callbacks by mid, and answers that came before publish() returned
        # (paho calls on_publish holding its own lock, so none of ours is held across publish).
        self._results_lock = threading.Lock()
        self._pending: dict[int, tuple[str, Callable[[PublishResult], None] | None, float]] = {}
        self._early: dict[int, tuple[int, str]] = {}
        self.refusals: Counter[str] = Counter()
        """Refused publishes by reason name, for health."""
        self._refusal_log = LogThrottle(_REFUSAL_LOG_INTERVAL_S)
        # Session takeover diagnosis.
        self._connected_at: float | None = None
        self._short_connections = 0
        self.takeovers = 0
        """Times the session was taken over by a client with the same id."""
        self._collision_reported = False
        self.reconnect_delay_s = 1
        """The current reconnect backoff floor (grows while the session is fought over)."""

    def start(
        self,
        subscriptions: Sequence[str],
        on_message: Callable[[IncomingMessage], None],
        on_connected: Callable[[], None],
    ) -> None:
        """Connect in the background; `on_message` gets every message on `subscriptions`
        (on paho's network thread), `on_connected` runs after each (re)connect."""
        self._subscriptions = list(subscriptions)
        self._on_message = on_message
        self._on_connected = on_connected
        _LOGGER.info(
            "Connecting to mqtt://%s:%d as %s",
            self._settings.host,
            self._settings.port,
            self._settings.client_id,
        )
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = self._settings.session_expiry_s
        self._client.connect_async(
            self._settings.host,
            self._settings.port,
            keepalive=self._settings.keepalive_s,
            clean_start=False,
            properties=props,
        )
        self._client.loop_start()

    def stop(self, final: OutgoingMessage | None = None, timeout_s: float = 5.0) -> None:
        """Publish a last message (the offline state) and disconnect cleanly."""
        if final is not None and self.connected.is_set():
            info = self.publish(final)
            if info is not None:
                try:
                    info.wait_for_publish(timeout_s)
                except (RuntimeError, ValueError) as exc:
                    _LOGGER.warning("Could not publish %s before exit: %s", final.topic, exc)
        self._client.disconnect()
        self._client.loop_stop()

    def ack(self, mid: int, qos: int) -> None:
        """Acknowledge a received message (after it is journaled)."""
        if qos > 0:
            self._client.ack(mid, qos)

    def max_payload(self, topic: str) -> int | None:
        """Largest payload the broker takes on `topic` (None = no known limit)."""
        limits = [x for x in (self.max_packet_size, self._settings.max_message_bytes) if x]
        if not limits:
            return None
        # Fixed header, topic, packet id and properties (user properties, expiry, content type).
        return min(limits) - len(topic.encode()) - 512

    def publish(
        self,
        message: OutgoingMessage,
        on_result: Callable[[PublishResult], None] | None = None,
    ) -> mqtt.MQTTMessageInfo | None:
        """Queue a message for sending; paho buffers it while disconnected (QoS >= 1).

        ``on_result`` is called once with the broker's answer (on the network thread: keep it
        short, never block). A refusal is logged here either way.
        """
        try:
            info = self._client.publish(
                message.topic,
                message.payload,
                qos=message.qos,
                retain=message.retain,
                properties=message.properties(),
            )
        except (ValueError, OSError) as exc:
            _LOGGER.error("Publish to %s failed: %s", message.topic, exc)
            return None
        if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            _LOGGER.error("Publish to %s failed: %s", message.topic, mqtt.error_string(info.rc))
            return info
        now = time.monotonic()
        with self._results_lock:
            early = self._early.pop(info.mid, None)
            if early is None:
                self._pending[info.mid] = (message.topic, on_result, now)
            self._forget_old(now)
        if early is not None:
            self._report(message.topic, info.mid, *early, on_result)
        return info

    def _forget_old(self, now: float) -> None:
        if len(self._pending) < 1024:
            return
        for mid, (_, _, queued) in list(self._pending.items()):
            if now - queued > _PENDING_MAX_AGE_S:
                del self._pending[mid]
        for mid in list(self._early)[: max(0, len(self._early) - 1024)]:
            del self._early[mid]

    def _report(
        self,
        topic: str,
        mid: int,
        code: int,
        reason: str,
        on_result: Callable[[PublishResult], None] | None,
    ) -> None:
        result = PublishResult(topic, mid, code, reason)
        if not result.ok:
            self.refusals[reason] += 1
            if self._refusal_log.due((topic, reason)) is not None:
                _LOGGER.error(
                    "The broker refused a publish to %s: %s (reason code %d); check the "
                    "broker's ACL for the bridge's user",
                    topic,
                    reason,
                    code,
                )
            else:
                _LOGGER.debug("The broker refused a publish to %s: %s", topic, reason)
        if on_result is not None:
            try:
                on_result(result)
            except Exception:
                _LOGGER.exception("Error in a publish result handler for %s", topic)

    # paho callbacks (set by callbacks.attach, which logs whatever they raise).

    def _handle_connect(
        self, reason: ReasonCode, flags: mqtt.ConnectFlags, properties: Properties | None
    ) -> None:
        if reason.is_failure:
            self._refused_connect = True
            name = reason.getName()
            # paho retries every few seconds: the reason is an error once, and a debug
            # line at each retry after that (until it changes or a connection succeeds).
            if name == self._last_refusal:
                _LOGGER.debug("Broker refused the connection again: %s", name)
                return
            self._last_refusal = name
            _LOGGER.error(
                "Broker %s:%d refused the connection: %s%s; retrying",
                self._settings.host,
                self._settings.port,
                name,
                _refusal_hint(reason.value, self._settings.username),
            )
            return
        self._refused_connect = False
        self._last_refusal = None
        self.connects += 1
        self._connected_at = time.monotonic()
        self.max_packet_size = getattr(properties, "MaximumPacketSize", None)
        _LOGGER.info(
            "Connected to the broker (session present: %s%s)",
            flags.session_present,
            f", maximum packet size {self.max_packet_size}" if self.max_packet_size else "",
        )
        # Subscribing again is harmless when the session kept them, and needed when not. One
        # SUBSCRIBE for all, so one SUBACK says they are all in place.
        self.subscribed.clear()
        if self._subscriptions:
            self._client.subscribe(
                [(topic, SubscribeOptions(qos=1)) for topic in self._subscriptions]
            )
        else:
            self.subscribed.set()
        self.connected.set()
        self._on_connected()

    def _handle_connect_fail(self) -> None:
        # paho retries silently and does not say why; find out once per distinct reason.
        reason = self._diagnose()
        if reason != self._last_failure:
            _LOGGER.error(
                "Cannot connect to %s:%d: %s; retrying",
                self._settings.host,
                self._settings.port,
                reason,
            )
            self._last_failure = reason

    def _diagnose(self) -> str:
        """Why a TCP (and TLS) connection to the broker fails, in words."""
        import ssl

        try:
            with socket.create_connection((self._settings.host, self._settings.port), 5) as sock:
                tls = self._settings.tls
                if not tls.enabled:
                    return "the broker closed the connection"
                context = ssl.create_default_context(
                    cafile=str(tls.ca_file) if tls.ca_file else None
                )
                if tls.cert_file:
                    context.load_cert_chain(
                        str(tls.cert_file), str(tls.key_file) if tls.key_file else None
                    )
                context.check_hostname = not tls.insecure
                with context.wrap_socket(sock, server_hostname=self._settings.host):
                    return "the TLS handshake succeeded on a second try; the broker closed it"
        except ssl.SSLError as exc:
            return f"TLS error: {exc.reason or exc}"  # e.g. CERTIFICATE_VERIFY_FAILED
        except OSError as exc:
            return exc.strerror or str(exc)

    def _handle_disconnect(self, reason: ReasonCode) -> None:
        self.connected.clear()
        self.subscribed.clear()
        lasted = time.monotonic() - self._connected_at if self._connected_at is not None else None
        self._connected_at = None
        if self._refused_connect:
            # The refusal said why; paho's "Protocol error" for the closed socket would
            # only mislead.
            _LOGGER.debug("Disconnected after a refused connection: %s", reason.getName())
            return
        if self._taken_over(reason, lasted):
            return
        if reason.is_failure:
            _LOGGER.warning("Disconnected from the broker: %s; reconnecting", reason.getName())
        else:
            _LOGGER.info("Disconnected from the broker")

    def _taken_over(self, reason: ReasonCode, lasted: float | None) -> bool:
        """Diagnose a client id collision and back off; True when this disconnect was one."""
        if lasted is not None and lasted >= _STABLE_CONNECTION_S:
            self._short_connections = 0
            self._collision_reported = False
            self._set_reconnect_delay(1)
        if reason.is_failure and lasted is not None and lasted < _SHORT_CONNECTION_S:
            self._short_connections += 1
        explicit = reason.value == _SESSION_TAKEN_OVER
        if not explicit and self._short_connections < 2:
            return False
        self.takeovers += 1
        delay = min(_TAKEOVER_MAX_DELAY_S, max(5, self.reconnect_delay_s * 2))
        self._set_reconnect_delay(delay)
        if not self._collision_reported:
            self._collision_reported = True
            _LOGGER.error(
                "Another MQTT client connected with this bridge's client id %r and took its "
                "session (%s): two bridges, or a bridge and another program, likely share the "
                "id. Give "
                "each its own mqtt.client_id (the default 'auto' is distinct per host and journal "
                "folder). Backing off: next try in %d s, waiting longer each time",
                self._settings.client_id,
                reason.getName() if explicit else "the broker keeps closing it within seconds",
                delay,
            )
        else:
            _LOGGER.debug("Session taken over again; next try in %d s", delay)
        return True

    def _set_reconnect_delay(self, delay: int) -> None:
        if delay == self.reconnect_delay_s:
            return
        self.reconnect_delay_s = delay
        self._client.reconnect_delay_set(
            min_delay=delay, max_delay=max(delay, self._settings.reconnect_max_delay_s)
        )

    def _handle_publish(self, mid: int, reason: ReasonCode) -> None:
        code, name = int(reason.value), reason.getName()
        with self._results_lock:
            pending = self._pending.pop(mid, None)
            if pending is None:
                self._early[mid] = (code, name)  # publish() has not registered it yet
                return
        topic, on_result, _ = pending
        self._report(topic, mid, code, name, on_result)

    def _handle_subscribe(self, reasons: list[ReasonCode]) -> None:
        for reason in reasons:
            if reason.is_failure:
                _LOGGER.error("Subscription refused by the broker: %s", reason.getName())
        # The connection's only SUBSCRIBE (sent on each connect) is acknowledged.
        self.subscribed.set()

    def _handle_message(self, msg: mqtt.MQTTMessage) -> None:
        try:
            props = getattr(msg, "properties", None)
            response_topic = getattr(props, "ResponseTopic", None) if props else None
            correlation = getattr(props, "CorrelationData", None) if props else None
            self._on_message(
                IncomingMessage(
                    topic=msg.topic,
                    payload=bytes(msg.payload),
                    response_topic=response_topic or None,
                    correlation_data=bytes(correlation) if correlation is not None else None,
                    duplicate=bool(msg.dup),
                    mid=msg.mid,
                    qos=msg.qos,
                    retained=bool(msg.retain),
                )
            )
        except Exception:
            _LOGGER.exception("Error while handling a message on %s", getattr(msg, "topic", "?"))
            # Ack anyway: a message that breaks the handler would break it again on redelivery.
            self.ack(msg.mid, msg.qos)
