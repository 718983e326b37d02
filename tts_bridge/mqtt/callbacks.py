"""paho's callbacks set in one place, for every MQTT client of the project (the bridge, the
player and ``doctor``).

paho (version 2 callbacks) calls each handler with the client, its user data and the packet's
parts, on its network thread, and silently stops that loop when a handler raises. ``attach``
takes handlers in short signatures (only what the project reads) and runs each one guarded: an
exception is logged with what was being handled, and the loop keeps running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

_LOGGER = logging.getLogger(__name__)

Connected = Callable[[ReasonCode, mqtt.ConnectFlags, Properties | None], None]
"""The CONNACK: its reason (a failure when refused), flags (session present) and properties."""
Disconnected = Callable[[ReasonCode], None]
Subscribed = Callable[[list[ReasonCode]], None]
"""The SUBACK's reason per topic filter."""
Received = Callable[[mqtt.MQTTMessage], None]
Published = Callable[[int, ReasonCode], None]
"""A publish's mid and the broker's answer (PUBACK, PUBCOMP; QoS 0: sent)."""
ConnectFailed = Callable[[], None]


def _guard(what: str, handler: Callable[..., None]) -> Callable[..., None]:
    def guarded(*args: Any) -> None:
        try:
            handler(*args)
        except Exception:
            _LOGGER.exception("Error while handling %s", what)

    return guarded


def attach(
    client: mqtt.Client,
    *,
    connected: Connected | None = None,
    disconnected: Disconnected | None = None,
    subscribed: Subscribed | None = None,
    received: Received | None = None,
    published: Published | None = None,
    connect_failed: ConnectFailed | None = None,
) -> None:
    """Set ``client``'s paho callbacks to the given handlers (None: paho's default, nothing).

    Each handler runs on paho's network thread: it must not block; an exception it raises is
    logged here and goes no further.
    """
    if connected is not None:
        on_connect = _guard("the connection", connected)

        def _connect(
            client: mqtt.Client,
            userdata: Any,
            flags: mqtt.ConnectFlags,
            reason: ReasonCode,
            properties: Properties | None,
        ) -> None:
            on_connect(reason, flags, properties)

        client.on_connect = _connect
    if disconnected is not None:
        on_disconnect = _guard("a disconnect", disconnected)

        def _disconnect(
            client: mqtt.Client,
            userdata: Any,
            flags: mqtt.DisconnectFlags,
            reason: ReasonCode,
            properties: Properties | None,
        ) -> None:
            on_disconnect(reason)

        client.on_disconnect = _disconnect
    if subscribed is not None:
        on_subscribe = _guard("a subscription", subscribed)

        def _subscribe(
            client: mqtt.Client,
            userdata: Any,
            mid: int,
            reasons: list[ReasonCode],
            properties: Properties | None,
        ) -> None:
            on_subscribe(reasons)

        client.on_subscribe = _subscribe
    if received is not None:
        on_message = _guard("a message", received)

        def _message(client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
            on_message(message)

        client.on_message = _message
    if published is not None:
        on_publish = _guard("a publish acknowledgement", published)

        def _publish(
            client: mqtt.Client,
            userdata: Any,
            mid: int,
            reason: ReasonCode,
            properties: Properties | None,
        ) -> None:
            on_publish(mid, reason)

        client.on_publish = _publish
    if connect_failed is not None:
        on_connect_fail = _guard("a failed connection", connect_failed)

        def _connect_fail(client: mqtt.Client, userdata: Any) -> None:
            on_connect_fail()

        client.on_connect_fail = _connect_fail
