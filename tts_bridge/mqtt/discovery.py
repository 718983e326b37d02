"""Home Assistant MQTT device discovery: one retained config that describes the whole bridge.

Pure builders, no network. The bridge publishes ``device_config(...)`` retained to
``discovery_topic(prefix, node_id)`` when it connects and whenever Home Assistant's birth message
(``<prefix>/status`` = ``online``) arrives, and publishes ``removal_payload()`` retained to the same
topic when discovery is turned off, which makes Home Assistant remove the device and its entities.
Every say answer also goes out as ``answer_event(...)`` on ``<base>/bridge/event``, which the
device's ``event`` entity shows (so a refused announcement is visible in Home Assistant).

Keys use Home Assistant's documented abbreviations (``cmd_t``, ``stat_t``, ...) because the
config is retained on the broker and re-read by every Home Assistant start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_PREFIX = "homeassistant"
DEVICE_NAME = "TTS Bridge"
ORIGIN_NAME = "tts_bridge"

# Home Assistant accepts only these characters in the node id of a discovery topic.
_NODE_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The same rule as a target in <base>/say/<target>: one safe topic level.
_TARGET_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Home Assistant accepts a device's configuration URL only with a scheme it can open.
_URL_RE = re.compile(r"^https?://[^\s/?#]+[^\s]*$")

# The notify platform renders its template with the message as ``value`` and publishes only
# that; ``tojson`` quotes and escapes the message, so quotes, backslashes and newlines in an
# announcement still give valid JSON for the bridge's parser.
NOTIFY_COMMAND_TEMPLATE = '{{ {"text": value} | tojson }}'
SELECT_COMMAND_TEMPLATE = '{{ {"voice": value} | tojson }}'
AVAILABILITY_TEMPLATE = "{{ value_json.state }}"

# Home Assistant's MQTT sensor shows a rendered "None" as unknown; ``default(None)`` turns a
# missing key into that instead of an empty string, which a numeric sensor would log as an error.
_QUEUE_DEPTH_TEMPLATE = "{{ value_json.queue_depth | default(None) }}"
_CACHE_HIT_RATE_TEMPLATE = (
    "{{ (value_json.cache_hit_rate * 100) | round(1) "
    "if value_json.cache_hit_rate is number else None }}"
)
_LAST_LATENCY_TEMPLATE = "{{ value_json.last_latency_ms | default(None) }}"
TIERS = ("quality", "fast")
"""The options of the tier-in-use ``enum`` sensor (the tiers bridge/health reports)."""
# An enum sensor refuses a state outside its options (Home Assistant logs an error and keeps
# the old state); anything else is rendered "None", which it shows as unknown.
_TIER_IN_USE_TEMPLATE = (
    "{% set tier = value_json.tier_in_use | default(None) %}"
    "{{ tier if tier in " + json.dumps(list(TIERS)) + " else None }}"
)
_DEFAULT_VOICE_TEMPLATE = "{{ value_json.default_voice }}"

EVENT_TYPES = ("ok", "error")
"""The ``event_type`` of each say answer's event: ok (audio went out) or error (refused)."""
# What an answer's event carries besides its type; every key is present (None when it does not
# apply), so an ok event does not keep showing the error of the answer before it.
# url is the answer's audio on the HTTP server (None when it is off), for an automation to play.
EVENT_ATTRIBUTES = ("id", "target", "code", "error", "voice", "tier", "duration_ms", "url")


def discovery_topic(prefix: str, node_id: str) -> str:
    """``<prefix>/device/<node_id>/config``, Home Assistant's device discovery topic."""
    _check_prefix(prefix)
    _check_node_id(node_id)
    return f"{prefix}/device/{node_id}/config"


def birth_topic(prefix: str) -> str:
    """Where Home Assistant announces itself (``online``) after a restart."""
    _check_prefix(prefix)
    return f"{prefix}/status"


def is_birth(payload: bytes) -> bool:
    """True for Home Assistant's birth message: the discovery config must be sent again."""
    return payload.strip() == b"online"


def entity_slug(text: str) -> str:
    """Lower-case ``[a-z0-9_]`` form of a name, as Home Assistant builds entity ids."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unnamed"


def device_config(
    *,
    base_topic: str,
    node_id: str,
    version: str,
    targets: Sequence[str],
    voices: Sequence[str],
    default_voice: str,
    support_url: str | None = None,
    configuration_url: str | None = None,
) -> dict[str, Any]:
    """The device discovery payload: device, origin, availability and every component.

    ``targets`` become ``notify`` entities (``notify.<node_id>_<target>``); ``voices`` are the
    options of the default-voice ``select``; ``configuration_url`` (the bridge's own web page,
    when it serves one) becomes the device's "Visit" link. Raises ValueError for names Home
    Assistant or the bridge's topics would not accept, duplicate targets, a default voice not in
    ``voices``, or a configuration URL that is not http(s).
    """
    _check_node_id(node_id)
    if not base_topic or any(c in base_topic for c in "+#\x00"):
        raise ValueError(f"invalid base topic {base_topic!r}")
    _check_targets(targets)
    if not voices:
        raise ValueError("at least one voice is needed for the default-voice select")
    if default_voice not in voices:
        raise ValueError(f"default voice {default_voice!r} is not one of {list(voices)}")
    if configuration_url is not None and not _URL_RE.match(configuration_url):
        raise ValueError(f"configuration URL {configuration_url!r} must be an http(s) URL")

    origin: dict[str, Any] = {"name": ORIGIN_NAME, "sw": version}
    if support_url:
        origin["url"] = support_url
    health = f"{base_topic}/bridge/health"
    node_slug = entity_slug(node_id)

    components: dict[str, dict[str, Any]] = {}
    for target in targets:
        components[f"notify_{target}"] = {
            "p": "notify",
            "name": target,
            "uniq_id": f"{node_id}_notify_{target}",
            # The entity id users write in automations (notify.tts_bridge_kitchen), independent
            # of later renames of the device in Home Assistant.
            "def_ent_id": f"notify.{node_slug}_{entity_slug(target)}",
            "cmd_t": f"{base_topic}/say/{target}",
            "cmd_tpl": NOTIFY_COMMAND_TEMPLATE,
            # QoS 1: an announcement must not be lost on a busy Wi-Fi link.
            "qos": 1,
            "ic": "mdi:bullhorn",
        }
    components["queue_depth"] = _health_sensor(
        node_id,
        "queue_depth",
        name="Queue depth",
        health_topic=health,
        value_template=_QUEUE_DEPTH_TEMPLATE,
        extra={"stat_cla": "measurement", "ic": "mdi:tray-full"},
    )
    components["cache_hit_rate"] = _health_sensor(
        node_id,
        "cache_hit_rate",
        name="Cache hit rate",
        health_topic=health,
        value_template=_CACHE_HIT_RATE_TEMPLATE,
        extra={"unit_of_meas": "%", "stat_cla": "measurement", "ic": "mdi:cached"},
    )
    components["last_latency"] = _health_sensor(
        node_id,
        "last_latency",
        name="Last latency",
        health_topic=health,
        value_template=_LAST_LATENCY_TEMPLATE,
        extra={"dev_cla": "duration", "unit_of_meas": "ms", "stat_cla": "measurement"},
    )
    components["tier_in_use"] = _health_sensor(
        node_id,
        "tier_in_use",
        name="Tier in use",
        health_topic=health,
        value_template=_TIER_IN_USE_TEMPLATE,
        extra={"dev_cla": "enum", "ops": list(TIERS), "ic": "mdi:speedometer"},
    )
    components["default_voice"] = {
        "p": "select",
        "name": "Default voice",
        "uniq_id": f"{node_id}_default_voice",
        "ops": list(voices),
        "cmd_t": f"{base_topic}/bridge/request/default_voice",
        "cmd_tpl": SELECT_COMMAND_TEMPLATE,
        # Not optimistic: the select shows what the bridge reports in its retained info, so a
        # refused change does not leave Home Assistant showing a voice the bridge is not using.
        "stat_t": f"{base_topic}/bridge/info",
        "val_tpl": _DEFAULT_VOICE_TEMPLATE,
        "ent_cat": "config",
        "qos": 1,
        "ic": "mdi:account-voice",
    }
    components["answer"] = {
        "p": "event",
        "name": "Answer",
        "uniq_id": f"{node_id}_answer",
        # Automations trigger on it ("when an announcement fails"): a stable entity id.
        "def_ent_id": f"event.{node_slug}_answer",
        # The bridge publishes answer_event(...) here for every say answer; the payload is
        # already the JSON object with event_type the event platform needs, so no template.
        "stat_t": f"{base_topic}/bridge/event",
        "evt_typ": list(EVENT_TYPES),
        "qos": 1,
        "ic": "mdi:message-alert",
    }

    device: dict[str, Any] = {
        "ids": [f"tts_bridge_{node_id}"],
        "name": DEVICE_NAME,
        "mf": "tts_bridge",
        "mdl": "MQTT text-to-speech bridge",
        "sw": version,
    }
    if configuration_url is not None:
        device["cu"] = configuration_url
    return {
        "dev": device,
        "o": origin,
        # Shared by every component: the bridge's retained state, {"state": "online"|"offline"}
        # (the Last Will sets offline), so all entities go unavailable when the bridge is gone.
        "avty_t": f"{base_topic}/bridge/state",
        "avty_tpl": AVAILABILITY_TEMPLATE,
        "pl_avail": "online",
        "pl_not_avail": "offline",
        "cmps": components,
    }


def config_payload(config: Mapping[str, Any]) -> bytes:
    """The config as compact UTF-8 JSON, ready to publish retained."""
    return json.dumps(config, ensure_ascii=False, separators=(",", ":")).encode()


def removal_payload() -> bytes:
    """Published retained to the discovery topic, an empty payload removes the device."""
    return b""


def answer_event(answer: Mapping[str, Any], target: str) -> bytes:
    """The event of one say answer, for ``<base>/bridge/event`` (not retained: Home Assistant
    drops replayed retained events).

    ``answer`` is the answer as published on ``<base>/bridge/response/say`` (``{"status": "ok",
    "id", "data": {...}}`` or ``{"status": "error", "id", "code", "error"}``); ``target`` is the
    request's target, which an error answer does not carry. Raises ValueError for another status.
    """
    status = answer.get("status")
    if status not in EVENT_TYPES:
        raise ValueError(f"an answer's status is one of {list(EVENT_TYPES)}, not {status!r}")
    data = answer.get("data")
    details: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
    event: dict[str, Any] = {"event_type": status}
    for key in EVENT_ATTRIBUTES:
        event[key] = answer.get(key, details.get(key))
    event["target"] = target
    try:
        return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate from a request's id: escaped, still sent
        return json.dumps(event, ensure_ascii=True, separators=(",", ":")).encode()


def _health_sensor(
    node_id: str,
    key: str,
    *,
    name: str,
    health_topic: str,
    value_template: str,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "p": "sensor",
        "name": name,
        "uniq_id": f"{node_id}_{key}",
        "stat_t": health_topic,
        "val_tpl": value_template,
        "ent_cat": "diagnostic",
        **extra,
    }


def _check_prefix(prefix: str) -> None:
    if not prefix or prefix != prefix.strip("/") or any(c in prefix for c in "+#\x00"):
        raise ValueError(f"invalid discovery prefix {prefix!r}")


def _check_node_id(node_id: str) -> None:
    if not _NODE_ID_RE.match(node_id):
        raise ValueError(f"node id {node_id!r} must be 1-64 letters, digits, '_' or '-'")


def _check_targets(targets: Sequence[str]) -> None:
    seen: set[str] = set()
    for target in targets:
        if not _TARGET_RE.match(target):
            raise ValueError(f"target {target!r} must be 1-64 letters, digits, '_' or '-'")
        if target in seen:
            raise ValueError(f"target {target!r} is listed twice")
        seen.add(target)
