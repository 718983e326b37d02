"""Home Assistant device discovery: the payload's shape, its templates, and retained publishing.

The templates are rendered with Jinja2's sandbox, the engine Home Assistant renders them with, and
the notify template's output goes through the bridge's own say parser, so the test covers the
path an announcement takes from a Home Assistant automation to the bridge.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.harness import MqttProbe, ProbeFactory
from tts_bridge.config import LimitsSettings
from tts_bridge.mqtt.discovery import (
    AVAILABILITY_TEMPLATE,
    NOTIFY_COMMAND_TEMPLATE,
    birth_topic,
    config_payload,
    device_config,
    discovery_topic,
    is_birth,
    removal_payload,
)
from tts_bridge.mqtt.protocol import parse_say

BASE = "tts_bridge"
NODE = "tts_bridge"
TARGETS = ("kitchen", "hall", "Living-Room")
VOICES = ("joe", "heart")


def make_config(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "base_topic": BASE,
        "node_id": NODE,
        "version": "1.2.3",
        "targets": TARGETS,
        "voices": VOICES,
        "default_voice": "joe",
    }
    args.update(overrides)
    return device_config(**args)


def render(template: str, **variables: Any) -> str:
    """Render as Home Assistant does: Jinja2's immutable sandbox, result as a string."""
    sandbox = pytest.importorskip("jinja2.sandbox")
    env = sandbox.ImmutableSandboxedEnvironment()
    return str(env.from_string(template).render(**variables))


def test_discovery_and_birth_topics() -> None:
    assert discovery_topic("homeassistant", NODE) == "homeassistant/device/tts_bridge/config"
    assert birth_topic("homeassistant") == "homeassistant/status"
    assert is_birth(b"online") and is_birth(b"online\n")
    assert not is_birth(b"offline") and not is_birth(b"")


@pytest.mark.parametrize(
    ("prefix", "node_id"),
    [("homeassistant", "tts bridge"), ("homeassistant", "a/b"), ("", NODE), ("ha/#", NODE)],
)
def test_discovery_topic_refuses_bad_names(prefix: str, node_id: str) -> None:
    with pytest.raises(ValueError, match=r"prefix|node id"):
        discovery_topic(prefix, node_id)


def test_device_origin_and_availability() -> None:
    config = make_config(support_url="https://example.org/tts_bridge")
    assert config["dev"] == {
        "ids": ["tts_bridge_tts_bridge"],
        "name": "TTS Bridge",
        "mf": "tts_bridge",
        "mdl": "MQTT text-to-speech bridge",
        "sw": "1.2.3",
    }
    assert config["o"] == {
        "name": "tts_bridge",
        "sw": "1.2.3",
        "url": "https://example.org/tts_bridge",
    }
    assert config["avty_t"] == f"{BASE}/bridge/state"
    assert config["avty_tpl"] == "{{ value_json.state }}"
    assert (config["pl_avail"], config["pl_not_avail"]) == ("online", "offline")
    # Without a support URL the origin has none, rather than a made-up one.
    assert "url" not in make_config()["o"]


def test_every_component_has_platform_and_distinct_unique_id() -> None:
    config = make_config()
    components = config["cmps"]
    platforms = sorted(c["p"] for c in components.values())
    assert platforms == ["notify"] * 3 + ["select"] + ["sensor"] * 4
    ids = [c["uniq_id"] for c in components.values()]
    assert len(set(ids)) == len(ids)
    # Another bridge (another node id) on the same broker gets other ids.
    other = make_config(node_id="garage_bridge")
    assert not set(ids) & {c["uniq_id"] for c in other["cmps"].values()}
    # Stable: the same settings give the same ids, so Home Assistant keeps its entities.
    assert ids == [c["uniq_id"] for c in make_config()["cmps"].values()]


def test_one_notify_per_target() -> None:
    components = make_config()["cmps"]
    kitchen = components["notify_kitchen"]
    assert kitchen["p"] == "notify"
    assert kitchen["name"] == "kitchen"
    assert kitchen["cmd_t"] == f"{BASE}/say/kitchen"
    assert kitchen["cmd_tpl"] == NOTIFY_COMMAND_TEMPLATE
    assert kitchen["def_ent_id"] == "notify.tts_bridge_kitchen"
    assert kitchen["qos"] == 1
    assert components["notify_Living-Room"]["def_ent_id"] == "notify.tts_bridge_living_room"
    assert components["notify_Living-Room"]["cmd_t"] == f"{BASE}/say/Living-Room"


def test_sensors_read_health_and_select_reads_info() -> None:
    components = make_config()["cmps"]
    for key in ("queue_depth", "cache_hit_rate", "last_latency", "tier_in_use"):
        sensor = components[key]
        assert sensor["p"] == "sensor"
        assert sensor["stat_t"] == f"{BASE}/bridge/health"
        assert sensor["ent_cat"] == "diagnostic"
    assert components["last_latency"]["unit_of_meas"] == "ms"
    assert components["cache_hit_rate"]["unit_of_meas"] == "%"
    select = components["default_voice"]
    assert select["p"] == "select"
    assert select["ops"] == list(VOICES)
    assert select["cmd_t"] == f"{BASE}/bridge/request/default_voice"
    assert select["stat_t"] == f"{BASE}/bridge/info"
    assert select["val_tpl"] == "{{ value_json.default_voice }}"


def test_notify_template_escapes_with_tojson() -> None:
    # Checked without Jinja2 too: the message must go through a JSON encoder, never be pasted
    # between quotes, or a quote in an announcement would break the payload.
    assert "tojson" in NOTIFY_COMMAND_TEMPLATE
    assert "value" in NOTIFY_COMMAND_TEMPLATE


@pytest.mark.parametrize(
    "message",
    [
        "Dinner is ready",
        'She said "hello" \\ and left',
        "Line one\nline two\ttabbed",
        "</script><b>&amp;</b> it's {{ not a template }}",
        "Température 21 °C, 晚饭好了 🍲",
        "",
    ],
)
def test_notify_template_renders_json_the_bridge_accepts(message: str) -> None:
    rendered = render(NOTIFY_COMMAND_TEMPLATE, value=message)
    assert json.loads(rendered) == {"text": message}
    request = parse_say("kitchen", rendered.encode(), LimitsSettings())
    assert request.text == message


def test_select_template_renders_json() -> None:
    template = make_config()["cmps"]["default_voice"]["cmd_tpl"]
    assert json.loads(render(template, value="heart")) == {"voice": "heart"}


def test_availability_template() -> None:
    assert render(AVAILABILITY_TEMPLATE, value_json={"state": "online"}) == "online"
    assert render(AVAILABILITY_TEMPLATE, value_json={"state": "offline"}) == "offline"


HEALTH_SENSORS = ("queue_depth", "cache_hit_rate", "last_latency", "tier_in_use")


@pytest.mark.parametrize(
    ("health", "expected"),
    [
        (
            {"queue_depth": 3, "cache_hit_rate": 0.5, "last_latency_ms": 41.2, "tier_in_use": "q"},
            ("3", "50.0", "41.2", "q"),
        ),
        (
            {
                "queue_depth": 0,
                "cache_hit_rate": None,
                "last_latency_ms": None,
                "tier_in_use": None,
            },
            ("0", "None", "None", "None"),
        ),
        # Fields the bridge does not send (yet): "None", which Home Assistant shows as unknown.
        ({}, ("None", "None", "None", "None")),
    ],
)
def test_health_value_templates(health: dict[str, Any], expected: tuple[str, ...]) -> None:
    components = make_config()["cmps"]
    rendered = tuple(
        render(components[key]["val_tpl"], value_json=health, value=json.dumps(health))
        for key in HEALTH_SENSORS
    )
    assert rendered == expected


def test_select_state_template() -> None:
    template = make_config()["cmps"]["default_voice"]["val_tpl"]
    assert render(template, value_json={"default_voice": "heart", "version": "1"}) == "heart"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"targets": ("kitchen", "kitchen")}, "listed twice"),
        ({"targets": ("kitchen/upstairs",)}, "target"),
        ({"targets": ("",)}, "target"),
        ({"default_voice": "bob"}, "default voice"),
        ({"voices": ()}, "at least one voice"),
        ({"node_id": "my bridge"}, "node id"),
        ({"base_topic": "tts/#"}, "base topic"),
    ],
)
def test_bad_settings_are_refused(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        make_config(**overrides)


def test_no_targets_still_gives_the_bridge_entities() -> None:
    components = make_config(targets=())["cmps"]
    assert {c["p"] for c in components.values()} == {"sensor", "select"}


def _retained_on(probe: MqttProbe, topic: str) -> list[bytes]:
    """Retained payloads a fresh subscription gets on ``topic``.

    A live marker is published after the SUBACK; the broker sends retained messages when the
    subscription is made, so everything before the marker is what was retained.
    """
    probe.subscribe(topic)
    probe.publish(topic, b"marker")
    marker = probe.wait_for(lambda m: m.payload == b"marker", 10.0, what="the marker")
    return [m.payload for m in probe.messages[: marker.seq] if m.retain]


def test_config_is_retained_and_removed_on_a_real_broker(probe_factory: ProbeFactory) -> None:
    topic = discovery_topic("homeassistant", NODE)
    config = make_config()
    watcher = probe_factory("homeassistant/#")
    publisher = probe_factory()

    publisher.publish(topic, config_payload(config), retain=True)
    # Home Assistant subscribing later (a restart) still gets the whole config.
    retained = _retained_on(probe_factory(), topic)
    assert len(retained) == 1
    assert json.loads(retained[0]) == config
    watcher.wait_for(lambda m: m.topic == topic and m.json() == config, 10.0)

    publisher.publish(topic, removal_payload(), retain=True)
    # A running Home Assistant sees the empty config (it removes the device) ...
    watcher.wait_for(lambda m: m.topic == topic and m.payload == b"", 10.0, what="removal")
    # ... and one that starts later finds nothing to re-create.
    assert _retained_on(probe_factory(), topic) == []


def test_config_payload_round_trips() -> None:
    config = make_config()
    payload = config_payload(config)
    assert json.loads(payload.decode("utf-8")) == config
    assert b"\n" not in payload
