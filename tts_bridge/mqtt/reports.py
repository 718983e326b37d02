"""Retained reports: bridge/info, periodic bridge/health, Home Assistant device discovery."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from tts_bridge import __version__
from tts_bridge.config import Settings
from tts_bridge.mqtt import discovery
from tts_bridge.mqtt.client import IncomingMessage, OutgoingMessage
from tts_bridge.mqtt.frontend import MqttFrontEnd
from tts_bridge.mqtt.outbox import Outbox
from tts_bridge.speech.pipeline import Pipeline
from tts_bridge.wire import encode_json

_LOGGER = logging.getLogger(__name__)


class Reports(MqttFrontEnd):
    takes_requests = False  # homeassistant/status is retained

    def __init__(
        self,
        settings: Settings,
        outbox: Outbox,
        pipeline: Pipeline,
        faults: Callable[[], Mapping[str, Any]] | None = None,
        *,
        configuration_url: Callable[[], str | None] | None = None,
        doors: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        """`faults` adds the service's fault counts to health (journal, refused answers);
        `doors` the network doors' connections and the open files;
        `configuration_url` is the bridge's status page while it is served (None when not),
        the device's "Visit" link in Home Assistant."""
        self._settings = settings
        self._configuration_url = configuration_url
        self._faults = faults
        self._doors = doors
        self._outbox = outbox
        self._pipeline = pipeline
        self.topics = outbox.topics
        self._birth_topic = discovery.birth_topic(settings.homeassistant.prefix)
        self._started = time.monotonic()
        self._health_every = settings.scheduler.health_interval_s
        self._next_health = self._started + self._health_every
        # bridge/info is retained: a voice that fell back to torch must not stay listed as ONNX.
        pipeline.synthesizer.engines.on_change = self.publish_info

    def subscriptions(self) -> list[str]:
        return [self._birth_topic] if self._settings.homeassistant.discovery else []

    def owns(self, topic: str) -> bool:
        return topic == self._birth_topic

    def on_message(self, message: IncomingMessage) -> None:
        self._outbox.ack(message)  # not journaled
        if discovery.is_birth(message.payload):
            _LOGGER.info("Home Assistant is online: publishing discovery again")
            self.publish_discovery()

    def on_connected(self) -> None:
        self.publish_info()
        self.publish_discovery()
        self.publish_health()

    def maintain(self, now: float) -> None:
        if now >= self._next_health:
            self._next_health = now + self._health_every
            if self._outbox.connected:
                self.publish_health()

    # the reports

    def info(self) -> dict[str, Any]:
        limits = self._settings.limits
        catalog = self._pipeline.voices()
        return {
            "version": __version__,
            "default_voice": catalog.default_voice,
            "voices": {
                v.name: {
                    "engine": v.engine,
                    "backend": v.backend,
                    "tier": v.tier,
                    "fast_voice": v.fast_voice,
                    "languages": list(v.languages),
                    "sample_rate": v.sample_rate,
                    "description": v.description,
                }
                for v in catalog.voices
            },
            "engines": self._pipeline.engine_identities(),
            "limits": {
                "max_text_chars": limits.max_text_chars,
                "max_payload_bytes": limits.max_payload_bytes,
                "max_queue": limits.max_queue,
                "max_raw_text_bytes": limits.max_raw_text_bytes,
                "door_share": limits.door_share,
                "peer_share": limits.peer_share,
            },
            "latency_budget_ms": self._settings.scheduler.latency_budget_ms,
            "topics": {
                "say": self.topics.say_targets,
                "audio": self.topics.audio("+"),
                "response": self.topics.response("say"),
            },
        }

    def health(self) -> dict[str, Any]:
        engines = self._pipeline.synthesizer.engines
        cache = self._pipeline.synthesizer.cache.stats()
        # The models first, then the process size: a model that is not listed has its memory
        # back before the size is read (see Residency.unload).
        loaded = engines.loaded()
        model_memory = {k: round(v) for k, v in engines.resident_mb().items()}
        rss_mb = round(psutil.Process().memory_info().rss / 2**20, 1)
        return {
            "uptime_s": round(time.monotonic() - self._started),
            **self._pipeline.describe(),
            "cache_hit_rate": cache["hit_rate"],
            "cache_entries": cache["entries"],
            "cache_bytes": cache["bytes"],
            "cache_degraded": cache["degraded"],
            "cache_write_errors": cache["write_errors"],
            **self._outbox.connection_health(),
            **(self._faults() if self._faults is not None else {}),
            **(self._doors() if self._doors is not None else {}),
            "rss_mb": rss_mb,
            "loaded_models": loaded,
            "model_memory_mb": model_memory,
            "memory_budget_mb": engines.memory_budget_mb,
        }

    def publish_info(self) -> None:
        self._outbox.retained_json(self.topics.info, encode_json(self.info()))

    def publish_health(self) -> None:
        self._outbox.retained_json(self.topics.health, encode_json(self.health()))

    def publish_discovery(self) -> None:
        """Home Assistant device discovery (retained), or its removal when turned off."""
        ha = self._settings.homeassistant
        topic = discovery.discovery_topic(ha.prefix, ha.node_id)
        if not ha.discovery:
            self._outbox.publish(OutgoingMessage(topic, discovery.removal_payload(), retain=True))
            return
        catalog = self._pipeline.voices()
        config = discovery.device_config(
            base_topic=self.topics.base,
            node_id=ha.node_id,
            version=__version__,
            targets=ha.targets,
            voices=[v.name for v in catalog.voices],
            default_voice=catalog.default_voice,
            configuration_url=self._configuration_url() if self._configuration_url else None,
        )
        self._outbox.publish(OutgoingMessage(topic, discovery.config_payload(config), retain=True))
