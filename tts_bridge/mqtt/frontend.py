"""What the bridge needs of an MQTT front end (say, Hermes, bridge API, reports)."""

from __future__ import annotations

from typing import Protocol

from tts_bridge.config import Settings
from tts_bridge.mqtt.client import IncomingMessage


class MqttFrontEnd(Protocol):
    """A front end served over the bridge's MQTT connection.

    The bridge subscribes to every front end's `subscriptions()` and hands each message to the
    first front end that `owns` its topic, on the network thread: `on_message` must only parse
    and queue, and acknowledge the message (through the outbox) once it is safe to.
    """

    takes_requests: bool = True
    """Its messages are requests (say, API): one delivered from the broker's retained store is
    acked and not executed (it would run again at every reconnect). False for state topics
    that are retained by design (Home Assistant's birth message)."""

    def subscriptions(self) -> list[str]: ...

    def owns(self, topic: str) -> bool: ...

    def on_message(self, message: IncomingMessage) -> None: ...

    def on_connected(self) -> None:
        """After every (re)connect, once the bridge has published its online state."""
        return

    def maintain(self, now: float) -> None:
        """About once a second on the maintenance thread (`now` is time.monotonic())."""
        return

    def stop(self) -> None:
        """After live work has drained, before the connection closes."""
        return


def shared(settings: Settings, topics: list[str]) -> list[str]:
    """Topics as a shared subscription when the bridge runs in a group (load balancing)."""
    group = settings.mqtt.share_group
    return [f"$share/{group}/{t}" for t in topics] if group else topics
