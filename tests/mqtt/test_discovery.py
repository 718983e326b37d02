"""Home Assistant device discovery: the payload's shape, its templates, and retained publishing.

The templates are rendered with Jinja2's sandbox, the engine Home Assistant renders them with, and
the notify template's output goes through the bridge's own say parser, so the test covers the
path an announcement takes from a Home Assistant automation to the bridge.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest

from tests.support.harness import MqttProbe, ProbeFactory
from tts_bridge.mqtt.discovery import (
    AVAILABILITY_TEMPLATE,
    EVENT_TYPES,
    NOTIFY_COMMAND_TEMPLATE,
    TIERS,
    answer_event,
    birth_topic,
    config_payload,
    device_config,
    discovery_topic,
    is_birth,
    removal_payload,
)
from tts_bridge.mqtt.protocol import SayPayload, Topics, error_response, ok_response, parse_say
from tts_bridge.speech.settings import LimitsSettings
from tts_bridge.speech.synthesis import RequestError, prepare_text

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


def test_configuration_url_only_when_given() -> None:
    # The device page's "Visit" link: the bridge's HTTP server, when it runs.
    assert "cu" not in make_config()["dev"]
    url = "http://192.168.1.20:8080/"
    assert make_config(configuration_url=url)["dev"]["cu"] == url


def test_every_component_has_platform_and_distinct_unique_id() -> None:
    config = make_config()
    components = config["cmps"]
    platforms = sorted(c["p"] for c in components.values())
    assert platforms == ["event"] + ["notify"] * 3 + ["select"] + ["sensor"] * 4
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


def test_tier_in_use_is_an_enum_sensor() -> None:
    sensor = make_config()["cmps"]["tier_in_use"]
    assert sensor["dev_cla"] == "enum"
    assert sensor["ops"] == ["quality", "fast"]
    # Home Assistant refuses options together with a state class or a unit.
    assert "stat_cla" not in sensor and "unit_of_meas" not in sensor
    # The options are the tiers a request can name, which are the tiers health reports.
    tier_field = SayPayload.model_fields["tier"].annotation
    assert set(TIERS) == set(typing.get_args(typing.get_args(tier_field)[0]))


def test_event_entity_for_answers() -> None:
    event = make_config()["cmps"]["answer"]
    assert event["p"] == "event"
    assert event["uniq_id"] == f"{NODE}_answer"
    assert event["def_ent_id"] == "event.tts_bridge_answer"
    assert event["stat_t"] == f"{BASE}/bridge/event" == Topics(BASE).event  # where the bridge sends
    assert event["evt_typ"] == ["ok", "error"]
    assert "val_tpl" not in event  # the payload is the event as it is
    other = make_config(node_id="garage_bridge", base_topic="garage_tts")["cmps"]["answer"]
    assert other["stat_t"] == "garage_tts/bridge/event"
    assert other["def_ent_id"] == "event.garage_bridge_answer"


def ha_event(
    component: dict[str, Any], payload: bytes, *, retain: bool = False
) -> tuple[str, dict[str, Any]] | None:
    """What Home Assistant's MQTT event platform makes of a message (its documented handling):
    retained messages are dropped, the value template (if any) renders the payload, the result
    must be a JSON object whose event_type is one of the configured event types; the other keys
    become the event's attributes. None where Home Assistant would drop the message."""
    if retain:
        return None
    text = payload.decode("utf-8")
    if "val_tpl" in component:
        text = render(component["val_tpl"], value=text, value_json=json.loads(text))
    if not text or text in ("None", "{}"):
        return None
    try:
        attributes = json.loads(text)
    except ValueError:
        return None
    if not isinstance(attributes, dict) or "event_type" not in attributes:
        return None
    event_type = str(attributes.pop("event_type"))
    if event_type not in component["evt_typ"]:
        return None
    return event_type, attributes


OK_DATA = {
    "target": "kitchen",
    "tier": "fast",
    "engine": "piper",
    "voice": "joe",
    "requested_voice": "joe",
    "cached": False,
    "duration_ms": 1820,
    "latency_ms": 240.5,
    "bytes": 58000,
}


def test_an_ok_answer_is_an_ok_event_with_its_details() -> None:
    component = make_config()["cmps"]["answer"]
    answer = json.loads(ok_response("r1", OK_DATA))
    assert ha_event(component, answer_event(answer, "kitchen")) == (
        "ok",
        {
            "id": "r1",
            "target": "kitchen",
            "code": None,
            "error": None,
            "voice": "joe",
            "tier": "fast",
            "duration_ms": 1820,
            "url": None,  # the HTTP server is off
        },
    )
    # With the HTTP server on, the event carries the answer's URL for an automation to play.
    url = "http://192.168.1.20:10201/audio/Jk3vQw.mp3"
    with_url = json.loads(ok_response("r1", {**OK_DATA, "url": url, "format": "mp3"}))
    _, attributes = ha_event(component, answer_event(with_url, "kitchen")) or ("", {})
    assert attributes["url"] == url
    assert "format" not in attributes  # only the declared attributes


def test_an_emoji_only_announcement_is_an_error_event() -> None:
    # The path a Home Assistant notify takes for "🎉🍲": the bridge refuses it, and the refusal
    # (not silence) reaches Home Assistant as an error event with the reason.
    with pytest.raises(RequestError) as refused:
        prepare_text("🎉🍲", LimitsSettings().max_text_chars)
    answer = json.loads(error_response("r2", refused.value.code, str(refused.value)))
    payload = answer_event(answer, "kitchen")
    assert ha_event(make_config()["cmps"]["answer"], payload) == (
        "error",
        {
            "id": "r2",
            "target": "kitchen",
            "code": "nothing_speakable",
            "error": str(refused.value),
            "voice": None,
            "tier": None,
            "duration_ms": None,
            "url": None,
        },
    )
    # Home Assistant drops events replayed from a retained message; the bridge never retains them.
    assert ha_event(make_config()["cmps"]["answer"], payload, retain=True) is None


def test_every_event_type_is_declared_and_nothing_else_is_sent() -> None:
    assert EVENT_TYPES == ("ok", "error")
    with pytest.raises(ValueError, match="status"):
        answer_event({"status": "pending", "id": "r3"}, "kitchen")
    # An answer with an id the bridge made up (the request had none) still names its target.
    event = json.loads(answer_event(json.loads(error_response(None, "invalid_json", "x")), "hall"))
    assert event["target"] == "hall" and event["id"] is None and event["code"] == "invalid_json"


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
            {
                "queue_depth": 3,
                "cache_hit_rate": 0.5,
                "last_latency_ms": 41.2,
                "tier_in_use": "fast",
            },
            ("3", "50.0", "41.2", "fast"),
        ),
        (
            {
                "queue_depth": 1,
                "cache_hit_rate": 1.0,
                "last_latency_ms": 0,
                "tier_in_use": "quality",
            },
            ("1", "100.0", "0", "quality"),
        ),
        # A tier the enum does not list is unknown, not a state Home Assistant would refuse.
        (
            {"queue_depth": 0, "cache_hit_rate": 0.0, "last_latency_ms": 1, "tier_in_use": "turbo"},
            ("0", "0.0", "1", "None"),
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
        ({"configuration_url": "bridge.local:8080"}, "configuration URL"),
        ({"configuration_url": "ftp://bridge.local/"}, "configuration URL"),
        ({"configuration_url": "http:// spaced"}, "configuration URL"),
    ],
)
def test_bad_settings_are_refused(overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        make_config(**overrides)


def test_no_targets_still_gives_the_bridge_entities() -> None:
    components = make_config(targets=())["cmps"]
    assert {c["p"] for c in components.values()} == {"sensor", "select", "event"}


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
