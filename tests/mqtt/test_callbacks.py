"""paho's callbacks, set in one place: the short handlers get what paho passes, and a handler
that raises is logged instead of stopping paho's network loop."""

from __future__ import annotations

import logging
from collections.abc import Callable

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from tts_bridge.mqtt import callbacks
from tts_bridge.mqtt.client import new_client


def _paho(handler: object) -> Callable[..., None]:
    assert callable(handler)
    return handler


def test_handlers_get_the_packets_parts() -> None:
    client = new_client()
    seen: list[object] = []
    callbacks.attach(
        client,
        connected=lambda reason, flags, properties: seen.append(("connack", reason.value)),
        disconnected=lambda reason: seen.append(("disconnect", reason.value)),
        subscribed=lambda reasons: seen.append(("suback", [r.value for r in reasons])),
        received=lambda message: seen.append(("message", message.topic)),
        published=lambda mid, reason: seen.append(("puback", mid, reason.value)),
        connect_failed=lambda: seen.append("failed"),
    )
    ok = ReasonCode(PacketTypes.CONNACK, identifier=0)
    _paho(client.on_connect)(client, None, mqtt.ConnectFlags(False), ok, None)
    gone = ReasonCode(PacketTypes.DISCONNECT, identifier=142)
    _paho(client.on_disconnect)(client, None, mqtt.DisconnectFlags(False), gone, None)
    granted = ReasonCode(PacketTypes.SUBACK, identifier=1)
    _paho(client.on_subscribe)(client, None, 3, [granted], None)
    message = mqtt.MQTTMessage(topic=b"tts/say")
    _paho(client.on_message)(client, None, message)
    acked = ReasonCode(PacketTypes.PUBACK, identifier=16)
    _paho(client.on_publish)(client, None, 7, acked, None)
    _paho(client.on_connect_fail)(client, None)
    assert seen == [
        ("connack", 0),
        ("disconnect", 142),
        ("suback", [1]),
        ("message", "tts/say"),
        ("puback", 7, 16),
        "failed",
    ]


def test_a_handler_that_raises_is_logged_and_goes_no_further(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = new_client()

    def broken(message: mqtt.MQTTMessage) -> None:
        raise RuntimeError("handler bug")

    callbacks.attach(client, received=broken)
    with caplog.at_level(logging.ERROR, logger="tts_bridge.mqtt.callbacks"):
        _paho(client.on_message)(client, None, mqtt.MQTTMessage(topic=b"t"))
    (record,) = caplog.records
    assert record.getMessage() == "Error while handling a message"
    assert record.exc_info is not None and "handler bug" in str(record.exc_info[1])


def test_unset_handlers_stay_unset() -> None:
    client = new_client()
    callbacks.attach(client, received=lambda message: None)
    assert client.on_connect is None and client.on_publish is None
