"""Say payload parsing: every malformed payload maps to one clear error code."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tts_bridge.audio.formats import AudioFormat
from tts_bridge.mqtt.protocol import (
    ProtocolError,
    Topics,
    api_response,
    error_response,
    estimated_audio_seconds,
    parse_api_request,
    parse_say,
    response_topic_refusal,
    speech_request,
    topic_matches,
)
from tts_bridge.speech.settings import LimitsSettings, TargetSettings

LIMITS = LimitsSettings(max_payload_bytes=4096, max_json_depth=8)


def test_plain_text_gets_a_generated_id() -> None:
    first = parse_say("kitchen", b"Dinner is ready", LIMITS)
    second = parse_say("kitchen", b"Dinner is ready", LIMITS)
    assert first.text == "Dinner is ready"
    assert first.target == "kitchen"
    assert isinstance(first.id, str) and first.id
    assert first.id != second.id


def test_json_fields_are_read() -> None:
    payload = {"text": "Hi", "id": 42, "voice": "heart", "lang": "en-US", "cache": False}
    request = parse_say("hall", json.dumps(payload).encode(), LIMITS)
    assert (request.id, request.voice, request.lang) == (42, "heart", "en")
    assert request.use_cache is False


@pytest.mark.parametrize(
    ("payload", "code", "request_id"),
    [
        (b"\xff\xfe\xfa", "invalid_utf8", None),
        (b'{"text": ', "invalid_json", None),
        (b"  [1, 2]", "invalid_request", None),
        (b'{"text": 5, "id": "a1"}', "invalid_request", "a1"),
        (b'{"text": "hi", "colour": "red", "id": 7}', "invalid_request", 7),
        (b'{"id": "x"}', "invalid_request", "x"),
        (b'{"text": "hi", "id": true}', "invalid_request", None),
        (b'{"text": "hi", "id": ""}', "invalid_request", None),
        (b'{"text": "hi", "id": "a\\u0000b"}', "invalid_request", None),
        (b'{"text": "hi", "id": "\\ud800"}', "invalid_request", None),
        (b'{"text": "hi", "lang": "english!"}', "invalid_request", None),
        (b'{"text": "hi", "id": "f", "format": "aac"}', "invalid_format", "f"),
        (b'{"text": "hi", "id": 3, "format": 5}', "invalid_format", 3),
        (b'{"text": "hi", "format": {"format": "mp3", "sample_rate": 1}}', "invalid_format", None),
        (b'{"text": "hi", "format": {"format": "wav", "channels": 3}}', "invalid_format", None),
        (b'{"text": "hi", "format": {"sample_rate": 48000}}', "invalid_format", None),
        (b'{"text": "hi", "format": {"format": "mp3", "x": 1}}', "invalid_format", None),
        (b'{"text": "hi", "x": ' + b"[" * 50 + b"]" * 50 + b"}", "json_too_deep", None),
        (b"[" * 100_000 + b"]" * 100_000, "payload_too_large", None),
        (b"x" * 5000, "payload_too_large", None),
    ],
)
def test_bad_payloads(payload: bytes, code: str, request_id: object) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_say("kitchen", payload, LIMITS)
    assert caught.value.code == code
    assert caught.value.request_id == request_id
    assert str(caught.value)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (b'{"txt": "Dinner is ready"}', ["'txt'", "did you mean 'text'?"]),
        (b'{"text": "hi", "Voice": "joe"}', ["'Voice'", "did you mean 'voice'?"]),
        (b'{"text": "hi", "colour": "red"}', ["'colour'", "known fields: text, id, voice"]),
    ],
)
def test_an_unknown_key_is_named_before_a_missing_text(payload: bytes, words: list[str]) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_say("kitchen", payload, LIMITS)
    message = str(caught.value)
    assert caught.value.code == "invalid_request"
    assert "required" not in message
    for word in words:
        assert word in message


def test_a_long_unknown_key_is_cut_short_in_the_message() -> None:
    payload = json.dumps({"text": "hi", "k" * 500: 1}).encode()
    with pytest.raises(ProtocolError) as caught:
        parse_say("kitchen", payload, LIMITS)
    assert "k" * 40 + "..." in str(caught.value)
    assert "k" * 41 not in str(caught.value)


def test_a_format_is_read_from_a_name_or_a_mapping() -> None:
    assert parse_say("k", b'{"text": "hi"}', LIMITS).format is None
    assert parse_say("k", b"plain text", LIMITS).format is None
    named = parse_say("k", b'{"text": "hi", "format": "Ogg"}', LIMITS)
    assert named.format == AudioFormat("opus")
    payload = {"text": "hi", "format": {"format": "mp3", "sample_rate": 48000, "channels": 2}}
    mapped = parse_say("k", json.dumps(payload).encode(), LIMITS)
    assert mapped.format == AudioFormat("mp3", 48000, 2)


def test_an_invalid_format_says_what_is_allowed() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_say("k", b'{"text": "hi", "format": "aac"}', LIMITS)
    assert "field 'format'" in str(caught.value)
    assert "wav, flac, mp3, opus" in str(caught.value)


def test_recursion_bomb_within_size_limit() -> None:
    big = LimitsSettings(max_payload_bytes=1_000_000)
    with pytest.raises(ProtocolError) as caught:
        parse_say("kitchen", b"[" * 200_000 + b"]" * 200_000, big)
    assert caught.value.code == "json_too_deep"


@pytest.mark.parametrize("target", ["", "a b", "x" * 65, "ümlaut", "a/b"])
def test_invalid_targets(target: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_say(target, b"hello", LIMITS)
    assert caught.value.code == "invalid_target"


def test_topics() -> None:
    topics = Topics("home/tts")
    assert topics.target_of("home/tts/say") == "default"
    assert topics.target_of("home/tts/say/kitchen") == "kitchen"
    assert topics.target_of("home/tts/bridge/request/x") is None
    assert topics.audio("kitchen") == "home/tts/audio/kitchen"
    assert topics.response("say") == "home/tts/bridge/response/say"
    assert topics.event == "home/tts/bridge/event"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_parse_or_fail_cleanly(payload: bytes) -> None:
    try:
        request = parse_say("fuzz", payload, LIMITS)
    except ProtocolError as exc:
        assert exc.code in {
            "invalid_utf8",
            "invalid_json",
            "json_too_deep",
            "invalid_request",
            "payload_too_large",
        }
    else:
        assert isinstance(request.text, str)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["text", "id", "voice", "lang", "cache", "x"]), json_values))
def test_arbitrary_json_objects_parse_or_fail_cleanly(data: dict[str, object]) -> None:
    payload = json.dumps(data)
    try:
        request = parse_say("fuzz", payload.encode(), LIMITS)
    except ProtocolError as exc:
        if exc.code == "invalid_json":  # NaN and Infinity are Python's extension, not JSON
            assert "NaN" in payload or "Infinity" in payload
        else:
            assert exc.code in {"invalid_request", "json_too_deep", "payload_too_large"}
    else:
        assert request.text == data["text"]


# -- every request gets an answer that can be sent; costs are bounded ----------------------


def test_refusals_encode_lone_surrogates() -> None:
    for payload in (
        b'{"text": 5, "id": "\\ud800"}',
        b'{"text": "hi", "options": {"\\udfff": 1}}',
        b'{"text": "hi", "\\ud800": 1}',
    ):
        with pytest.raises(ProtocolError) as caught:
            parse_say("kitchen", payload, LIMITS)
        body = error_response(caught.value.request_id, caught.value.code, str(caught.value))
        decoded = json.loads(body.decode("utf-8"))  # valid UTF-8, valid JSON
        assert decoded["status"] == "error"
    assert json.loads(error_response("\ud800", "x", "\udfff")) == {
        "status": "error",
        "id": "\ud800",
        "error": "\udfff",
        "code": "x",
    }
    assert json.loads(api_response("error", {"k\ud800": 1}, "t\udc00", "e", "c"))["data"] == {
        "k\ud800": 1
    }
    # Text UTF-8 can carry stays as it is (not escaped).
    assert "é".encode() in error_response("é", "x", "y")


def test_a_byte_order_mark_before_json_is_stripped() -> None:
    request = parse_say("kitchen", b'\xef\xbb\xbf{"text": "Hi", "id": "b1"}', LIMITS)
    assert (request.text, request.id) == ("Hi", "b1")
    assert parse_say("kitchen", b"\xef\xbb\xbfDinner is ready", LIMITS).text == "Dinner is ready"
    assert parse_api_request(b'\xef\xbb\xbf{"a": 1}', LIMITS) == {"a": 1}


@pytest.mark.parametrize(
    "options",
    [
        b'{"speed": 0.005}',
        b'{"speed": 0}',
        b'{"speed": -1}',
        b'{"speed": 1000}',
        b'{"speed": 1e999}',
        b'{"speed": true}',
        b'{"temperature": 1e999}',
        b'{"seed": 123456789012345678901234567890123456789}',
        b'{"bad name": 1}',
    ],
)
def test_options_out_of_range_are_refused(options: bytes) -> None:
    payload = b'{"text": "hi", "id": "o1", "options": ' + options + b"}"
    with pytest.raises(ProtocolError) as caught:
        parse_say("kitchen", payload, LIMITS)
    assert (caught.value.code, caught.value.request_id) == ("invalid_options", "o1")


def test_speed_refusal_names_the_allowed_range() -> None:
    with pytest.raises(ProtocolError, match=r"speed 0.005 out of range 0.25..4"):
        parse_say("k", b'{"text": "hi", "options": {"speed": 0.005}}', LIMITS)
    assert parse_say("k", b'{"text": "hi", "options": {"speed": 0.25}}', LIMITS).options == {
        "speed": 0.25
    }


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_not_json(constant: bytes) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_say("k", b'{"text": "hi", "options": {"speed": ' + constant + b"}}", LIMITS)
    assert caught.value.code == "invalid_json"


def test_audio_length_is_capped() -> None:
    limits = LimitsSettings(max_payload_bytes=4096, max_audio_s=10)
    text = "The washing machine has finished. " * 6  # about 200 characters, ~13 s
    with pytest.raises(ProtocolError) as caught:
        parse_say("k", text.encode(), limits)
    assert caught.value.code == "audio_too_long"
    assert "limits.max_audio_s" in str(caught.value)
    fast = json.dumps({"text": text, "options": {"speed": 2.0}, "id": 3}).encode()
    assert parse_say("k", fast, limits).text == text  # twice as fast fits
    slow = json.dumps({"text": text[:100], "options": {"speed": 0.25}, "id": 4}).encode()
    with pytest.raises(ProtocolError, match="audio"):
        parse_say("k", slow, limits)
    assert estimated_audio_seconds("你好" * 10) > estimated_audio_seconds("ab" * 10)


@pytest.mark.parametrize(
    "topic",
    [
        "tts_bridge/say",
        "tts_bridge/say/kitchen",
        "tts_bridge/bridge/request/cache/clear",
        "tts_bridge/bridge/response/say",
        "tts_bridge/bridge/state",
        "tts_bridge/bridge/info",
        "tts_bridge/bridge/health",
        "tts_bridge/audio/kitchen",
        "tts_bridge",
        "homeassistant/device/tts_bridge/config",
        "ha/device/x/config",
        "hermes/tts/say",
        "hermes/audioServer/kitchen/playBytes/1",
        "clients/+/reply",
        "clients/#",
        "$SYS/broker/load",
        "",
    ],
)
def test_response_topics_that_would_turn_the_bridge_against_the_house(topic: str) -> None:
    assert response_topic_refusal(topic, "tts_bridge", discovery_prefix="ha") is not None


def test_response_topics_elsewhere_are_allowed_and_the_allow_list_narrows_them() -> None:
    assert response_topic_refusal("clients/phone/reply", "tts_bridge") is None
    assert response_topic_refusal("tts_bridgeX/reply", "tts_bridge") is None  # another prefix
    allowed = ["clients/#", "apps/+/tts"]
    assert response_topic_refusal("clients/a/b", "tts_bridge", allowed=allowed) is None
    assert response_topic_refusal("apps/phone/tts", "tts_bridge", allowed=allowed) is None
    refused = response_topic_refusal("zigbee2mqtt/front_door/set", "tts_bridge", allowed=allowed)
    assert refused == "the response topic is not in mqtt.response_topics"
    # The deny rules hold even when an allow-list would match.
    assert response_topic_refusal("tts_bridge/say", "tts_bridge", allowed=["#"]) is not None


def test_topic_filters_match_like_mqtt() -> None:
    assert topic_matches("a/#", "a") and topic_matches("a/#", "a/b/c")
    assert topic_matches("a/+/c", "a/b/c") and not topic_matches("a/+/c", "a/b/d")
    assert not topic_matches("a/+", "a/b/c") and not topic_matches("#", "$SYS/x")


def test_priority_is_read_and_a_bad_one_has_its_own_code() -> None:
    assert parse_say("k", b"Smoke!", LIMITS).priority == "normal"
    for priority in ("alert", "high", "normal", "low"):
        payload = json.dumps({"text": "Smoke!", "priority": priority}).encode()
        assert parse_say("k", payload, LIMITS).priority == priority
    for bad in ("urgent", "ALERT", 1, True, ["alert"]):
        payload = json.dumps({"text": "Smoke!", "priority": bad, "id": "p"}).encode()
        with pytest.raises(ProtocolError) as caught:
            parse_say("k", payload, LIMITS)
        assert caught.value.code == "invalid_priority"
        assert "alert, high, normal, low" in str(caught.value)
        assert caught.value.request_id == "p"


def test_the_cost_is_estimated_on_the_cleaned_text_and_the_raw_text_is_capped() -> None:
    limits = LimitsSettings(max_payload_bytes=2_000_000, max_raw_text_bytes=2_000_000)
    spaced = " " * 1_000_000 + "Hello."
    assert parse_say("k", spaced.encode(), limits).text == spaced
    invisible = json.dumps({"text": "\u200b" * 100_000 + "Hello."}, ensure_ascii=False)
    assert parse_say("k", invisible.encode(), limits).text.endswith("Hello.")
    capped = LimitsSettings(max_payload_bytes=2_000_000, max_raw_text_bytes=65_536)
    for payload in (spaced.encode(), json.dumps({"text": spaced, "id": 9}).encode()):
        with pytest.raises(ProtocolError) as caught:
            parse_say("k", payload, capped)
        assert caught.value.code == "text_too_long"
        assert "limits.max_raw_text_bytes" in str(caught.value)


def test_a_say_request_becomes_the_speech_cores_request_whole() -> None:
    payload = {
        "text": "Dinner is ready",
        "id": "d1",
        "voice": "joe",
        "lang": "en",
        "tier": "fast",
        "cache": False,
        "stream": True,
        "latency_budget_ms": 900,
        "options": {"speed": 1.2},
        "format": "mp3",
        "chime": "ding",
        "ssml": False,
        "priority": "high",
    }
    say = parse_say("kitchen", json.dumps(payload).encode(), LIMITS)
    target = TargetSettings(chime_after="alert", gain_db=-6.0)
    speech = speech_request(say, 4.5, target)
    assert (speech.id, speech.text, speech.voice, speech.language) == (
        "d1",
        "Dinner is ready",
        "joe",
        "en",
    )
    assert (speech.tier, speech.use_cache, speech.stream, speech.budget_ms) == (
        "fast",
        False,
        True,
        900,
    )
    assert speech.options == {"speed": 1.2} and speech.format == "mp3"
    assert (speech.chime, speech.chime_after, speech.ssml) == ("ding", None, False)
    assert (speech.default_chime, speech.default_chime_after) == (None, "alert")
    assert (speech.priority, speech.door, speech.target, speech.received) == (
        "high",
        "mqtt",
        "kitchen",
        4.5,
    )
    assert speech.volume == pytest.approx(10 ** (-6 / 20))
    plain = speech_request(parse_say("hall", b"Hi", LIMITS), 1.0)
    assert plain.volume is None and plain.default_chime is None and plain.target == "hall"
