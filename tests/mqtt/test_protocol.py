"""Say payload parsing: every malformed payload maps to one clear error code."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tts_bridge.config import LimitsSettings
from tts_bridge.formats import AudioFormat
from tts_bridge.mqtt.protocol import ProtocolError, Topics, parse_say

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
    try:
        request = parse_say("fuzz", json.dumps(data).encode(), LIMITS)
    except ProtocolError as exc:
        assert exc.code in {"invalid_request", "json_too_deep", "payload_too_large"}
    else:
        assert request.text == data["text"]
