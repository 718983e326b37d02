"""The say front end in process: the real service (real voices, cache, journal, scheduler) on a
fake connection. What needs a real broker (retained flags, the Last Will, restarts, MQTT 5
packets on the wire) stays in test_bridge_e2e.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.answers import Wav, assert_error, assert_ok, parse_wav
from tests.support.fake import BASE, FakeConnection, Services, body, journal_of, props
from tts_bridge.engines.piper import bundled_model
from tts_bridge.mqtt.client import OutgoingMessage

SAY = f"{BASE}/say"
RESPONSE = f"{BASE}/bridge/response/say"
REPLY = "e2e/reply"
JOE_RATE = 22050
HEART_RATE = 24000


def say(
    conn: FakeConnection, payload: bytes | str, target: str | None = "kitchen", **kw: Any
) -> int:
    since = conn.mark()
    conn.deliver(SAY if target is None else f"{SAY}/{target}", payload, **kw)
    return since


def say_json(
    conn: FakeConnection, request: dict[str, Any], target: str | None = "kitchen", **kw: Any
) -> int:
    return say(conn, json.dumps(request), target, **kw)


def wait_response(
    conn: FakeConnection, since: int, *, request_id: Any = None, status: str | None = None
) -> dict[str, Any]:
    def matches(m: OutgoingMessage) -> bool:
        if m.topic != RESPONSE:
            return False
        answer = body(m)
        return (request_id is None or answer["id"] == request_id) and (
            status is None or answer["status"] == status
        )

    found: dict[str, Any] = body(
        conn.wait_for(matches, since=since, what=f"a response on {RESPONSE} (id={request_id!r})")
    )
    return found


def wait_audio(
    conn: FakeConnection, target: str, since: int, *, request_id: Any = None
) -> OutgoingMessage:
    topic = f"{BASE}/audio/{target}"

    def matches(m: OutgoingMessage) -> bool:
        return m.topic == topic and (request_id is None or props(m).get("id") == str(request_id))

    return conn.wait_for(matches, since=since, what=f"audio on {topic}")


def assert_audio_message(
    audio: OutgoingMessage, *, request_id: Any, sample_rate: int, cached: bool | None = None
) -> Wav:
    """One plausible mono WAV with the contract's MQTT 5 properties, QoS 1, not retained."""
    assert audio.qos == 1, f"audio must be QoS 1, came as QoS {audio.qos}"
    assert not audio.retain, "audio must not be retained"
    assert audio.content_type == "audio/wav", audio.content_type
    assert audio.expiry_s is not None and audio.expiry_s > 0, f"no expiry: {audio.expiry_s}"
    p = props(audio)
    assert p.get("id") == str(request_id), p
    assert p.get("tier") in ("quality", "fast"), p
    assert p.get("cached") in ("true", "false"), p
    if cached is not None:
        assert p["cached"] == ("true" if cached else "false"), p
    wav = parse_wav(audio.payload)
    assert wav.channels == 1, f"expected mono, got {wav.channels} channels"
    assert wav.sample_rate == sample_rate
    assert float(np.max(np.abs(wav.samples))) > 0.01, "the audio is silent"
    return wav


@pytest.fixture
def conn(services: Services) -> FakeConnection:
    return services()[1]


# -- the happy paths ---------------------------------------------------------------------------


def test_plain_text_to_target(conn: FakeConnection) -> None:
    since = say(conn, "Dinner is ready", "kitchen")
    response = wait_response(conn, since)
    audio = wait_audio(conn, "kitchen", since)
    assert_ok(response, target="kitchen", voice="joe", engine="piper", audio=audio)
    assert response["data"]["cached"] is False, "a fresh cache cannot have this sentence"
    assert isinstance(response["id"], str) and response["id"], response
    wav = assert_audio_message(audio, request_id=response["id"], sample_rate=JOE_RATE, cached=False)
    assert 0.5 <= wav.duration_s <= 6.0, f"'Dinner is ready' lasted {wav.duration_s:.2f} s"
    # The answer goes to the shared response topic only: the audio is the reply's payload.
    assert len(conn.on(RESPONSE, since)) == 1


def test_say_without_target_goes_to_default(conn: FakeConnection) -> None:
    since = say(conn, "Hello there", target=None)
    response = wait_response(conn, since)
    audio = wait_audio(conn, "default", since)
    assert_ok(response, target="default", voice="joe", engine="piper", audio=audio)
    assert_audio_message(audio, request_id=response["id"], sample_rate=JOE_RATE)


def test_json_with_id_and_voice_heart(conn: FakeConnection) -> None:
    since = say_json(conn, {"text": "The front door is open", "id": "req-42", "voice": "heart"})
    response = wait_response(conn, since, request_id="req-42")
    audio = wait_audio(conn, "kitchen", since, request_id="req-42")
    assert response["id"] == "req-42"
    assert_ok(response, target="kitchen", voice="heart", engine="hibari", audio=audio)
    wav = assert_audio_message(audio, request_id="req-42", sample_rate=HEART_RATE)
    assert 0.5 <= wav.duration_s <= 6.0, f"lasted {wav.duration_s:.2f} s"


def test_integer_id_is_echoed(conn: FakeConnection) -> None:
    since = say_json(conn, {"text": "Good morning", "id": 7})
    response = wait_response(conn, since, request_id=7)
    audio = wait_audio(conn, "kitchen", since)
    assert response["id"] == 7 and not isinstance(response["id"], bool)
    assert_audio_message(audio, request_id="7", sample_rate=JOE_RATE)


@pytest.mark.parametrize(
    "payload", [b"The laundry is done", b'{"text": "The laundry is done"}'], ids=["text", "json"]
)
def test_generated_id_matches_audio_property(conn: FakeConnection, payload: bytes) -> None:
    since = say(conn, payload, "hall")
    response = wait_response(conn, since)
    generated = response["id"]
    assert isinstance(generated, str) and generated.strip(), response
    audio = wait_audio(conn, "hall", since)
    assert props(audio).get("id") == generated, props(audio)
    assert_ok(response, target="hall", voice="joe", engine="piper", audio=audio)


def test_response_topic_gets_wav_with_correlation_data(conn: FakeConnection) -> None:
    reply_topic = f"{REPLY}/wav"
    correlation = b"\x00corr-\xff-1"
    since = say(
        conn,
        "Someone is at the door",
        "porch",
        response_topic=reply_topic,
        correlation_data=correlation,
    )
    reply = conn.wait_for(lambda m: m.topic == reply_topic, since=since, what="a reply")
    assert reply.content_type == "audio/wav", reply.content_type
    assert reply.correlation_data == correlation, reply.correlation_data
    wav = parse_wav(reply.payload)
    assert wav.channels == 1 and wav.sample_rate == JOE_RATE
    assert 0.5 <= wav.duration_s <= 6.0, f"lasted {wav.duration_s:.2f} s"
    # The same audio goes to the target's topic too, and the JSON answer to the shared topic.
    assert wait_audio(conn, "porch", since).payload == reply.payload
    assert wait_response(conn, since)["status"] == "ok"


def test_response_topic_gets_error_as_json(conn: FakeConnection) -> None:
    reply_topic = f"{REPLY}/error"
    correlation = b"err-1"
    since = say(conn, b"", "porch", response_topic=reply_topic, correlation_data=correlation)
    reply = conn.wait_for(lambda m: m.topic == reply_topic, since=since, what="a reply")
    assert reply.content_type == "application/json", reply.content_type
    assert reply.correlation_data == correlation, reply.correlation_data
    assert_error(body(reply), "empty_text")
    assert body(reply) == wait_response(conn, since), "the two answers differ"


# -- the cache ---------------------------------------------------------------------------------


def test_repeated_sentence_is_served_from_cache(conn: FakeConnection) -> None:
    since = say_json(conn, {"text": "The washing machine has finished", "id": "first"})
    first = wait_response(conn, since, request_id="first")
    first_audio = wait_audio(conn, "kitchen", since, request_id="first")
    assert first["status"] == "ok", first
    assert first["data"]["cached"] is False, first

    since = say_json(conn, {"text": "The washing machine has finished", "id": "second"})
    second = wait_response(conn, since, request_id="second")
    second_audio = wait_audio(conn, "kitchen", since, request_id="second")
    assert_ok(second, target="kitchen", voice="joe", engine="piper", audio=second_audio)
    assert second["data"]["cached"] is True, second
    assert_audio_message(second_audio, request_id="second", sample_rate=JOE_RATE, cached=True)
    assert second_audio.payload == first_audio.payload, "cached audio differs from the first"


# -- acknowledgement and duplicates -------------------------------------------------------------


def test_a_request_is_acked_once_journaled_and_a_duplicate_is_answered_from_the_journal(
    services: Services,
) -> None:
    service, conn = services()
    since = conn.mark()
    first = conn.deliver(f"{SAY}/kitchen", json.dumps({"text": "Tea is ready", "id": "dup-1"}))
    answer = wait_response(conn, since, request_id="dup-1")
    assert answer["status"] == "ok", answer
    assert (first.mid, 1) in conn.acks
    entry = journal_of(service).unfinished()
    assert entry == [], f"an answered request is still unfinished: {entry}"

    since = conn.mark()
    again = conn.deliver(
        f"{SAY}/kitchen", json.dumps({"text": "Tea is ready", "id": "dup-1"}), duplicate=True
    )
    assert (again.mid, 1) in conn.acks
    repeated = wait_response(conn, since, request_id="dup-1")
    assert "duplicate" not in answer, answer
    # The first answer again, saying that it is one (it spoke nothing this time).
    assert repeated == {**answer, "duplicate": True}, "a duplicate must get the first answer again"
    assert not conn.on(f"{BASE}/audio/kitchen", since), "a duplicate is not rendered again"


def test_unfinished_journal_entries_are_served_at_start(services: Services) -> None:
    """An entry accepted (and acked) before a stop is answered by the next start."""
    service, _ = services(start=False)
    payload = json.dumps({"text": "Resume me", "id": "resume-1"}).encode()
    accepted = journal_of(service).accept(
        "key-resume-1",
        f"{SAY}/attic",
        payload,
        response_topic=None,
        correlation_data=None,
        received_at=0.0,
        dedupe=True,
    )
    assert accepted.entry_id is not None
    service.start()
    services.running.append(service)
    conn: FakeConnection = service.bridge._connection  # type: ignore[assignment]
    answer = wait_response(conn, 0, request_id="resume-1")
    assert answer["status"] == "ok" and answer["data"]["target"] == "attic", answer
    assert_audio_message(wait_audio(conn, "attic", 0), request_id="resume-1", sample_rate=JOE_RATE)
    service.pipeline.scheduler.stop(10)  # the answer is journaled once the worker finishes
    assert journal_of(service).unfinished() == []


# -- bad input: a clear error, then the service keeps serving -----------------------------------


@dataclass(frozen=True)
class BadInput:
    payload: bytes
    code: str
    config: dict[str, Any] | None = None
    request_id: Any = None
    """The id the error response must echo (None: any non-empty id, generated if need be)."""


def _nested(depth: int) -> bytes:
    return b'{"text": "hi", "x": ' + b"[" * depth + b"]" * depth + b"}"


BAD_INPUTS: dict[str, BadInput] = {
    "empty": BadInput(b"", "empty_text"),
    "blank": BadInput(b"  \n\t  ", "empty_text"),
    "json-empty-text": BadInput(b'{"text": ""}', "empty_text"),
    "json-blank-text": BadInput(b'{"text": "   "}', "empty_text"),
    "invalid-utf8": BadInput(b"\xff\xfe\xfa", "invalid_utf8"),
    "malformed-json": BadInput(b'{"text": ', "invalid_json"),
    "malformed-json-array": BadInput(b"[", "invalid_json"),
    "deeply-nested-json": BadInput(_nested(50), "json_too_deep"),
    "top-level-array": BadInput(b'["hi"]', "invalid_request"),
    "text-not-a-string": BadInput(b'{"text": 5}', "invalid_request"),
    "id-a-list": BadInput(b'{"text": "hi", "id": [1, 2]}', "invalid_request"),
    "cache-not-a-bool": BadInput(b'{"text": "hi", "cache": "sometimes"}', "invalid_request"),
    "no-text-field": BadInput(b'{"voice": "joe"}', "invalid_request"),
    "unknown-field": BadInput(b'{"text": "hi", "colour": "red"}', "invalid_request"),
    "text-too-long": BadInput(
        b"This sentence is rather long. " * 10, "text_too_long", {"limits": {"max_text_chars": 200}}
    ),
    "payload-too-large": BadInput(
        b"word " * 220,
        "payload_too_large",
        # The text limit is raised so that only the payload size can be the reason.
        {"limits": {"max_payload_bytes": 1024, "max_text_chars": 5000}},
    ),
    "unknown-voice": BadInput(
        b'{"text": "hello", "voice": "nobody", "id": "uv-1"}', "unknown_voice", request_id="uv-1"
    ),
    "unsupported-language": BadInput(
        b'{"text": "hello", "lang": "xx", "id": "lang-1"}',
        "unsupported_language",
        request_id="lang-1",
    ),
    "invalid-options": BadInput(
        b'{"text": "hello", "options": {"no_such_option": 1}, "id": "opt-1"}',
        "invalid_options",
        request_id="opt-1",
    ),
    "only-emoji": BadInput("🎉🎉".encode(), "nothing_speakable"),
    "only-punctuation": BadInput(b"?!...", "nothing_speakable"),
    "only-control-characters": BadInput(b"\x01\x02\x1b\x7f", "nothing_speakable"),
    "json-only-emoji": BadInput(
        '{"text": "🎉🎉", "id": "emoji-1"}'.encode(), "nothing_speakable", request_id="emoji-1"
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_bad_input_gets_error_and_service_keeps_serving(services: Services, case: BadInput) -> None:
    service, conn = services(**(case.config or {}))
    since = conn.mark()
    message = conn.deliver(f"{SAY}/errors", case.payload)
    error = wait_response(conn, since, request_id=case.request_id)
    assert_error(error, case.code)
    if case.request_id is None and case.code in (
        "invalid_utf8",
        "invalid_json",
        "json_too_deep",
        "payload_too_large",
    ):
        assert isinstance(error["id"], str), f"expected a generated string id: {error}"
    assert (message.mid, 1) in conn.acks, "a refused request must still be acknowledged"
    assert service.reports.health()["answers"]["error"] == 1

    # Still serving: a good request right after is answered with audio.
    good_since = say_json(conn, {"text": "Still here", "id": "good-1"}, "errors")
    good = wait_response(conn, good_since, request_id="good-1")
    audio = wait_audio(conn, "errors", good_since, request_id="good-1")
    assert_ok(good, target="errors", voice="joe", engine="piper", audio=audio)

    # The bad request produced no audio at all.
    stray = [
        m
        for m in conn.published[since:]
        if m.topic.startswith(f"{BASE}/audio/") and props(m).get("id") != "good-1"
    ]
    assert not stray, f"audio was published for a rejected request: {[m.topic for m in stray]}"


def test_a_bad_target_is_refused(conn: FakeConnection) -> None:
    since = conn.mark()
    message = conn.deliver(f"{SAY}/{'x' * 65}", json.dumps({"text": "Hello.", "id": "t-1"}))
    error = wait_response(conn, since)  # the target is checked before the payload is read
    assert_error(error, "invalid_target")
    assert (message.mid, 1) in conn.acks
    assert not [m for m in conn.published[since:] if m.topic.startswith(f"{BASE}/audio/")]


def test_an_empty_target_is_refused(conn: FakeConnection) -> None:
    since = conn.mark()
    conn.deliver(f"{SAY}/", json.dumps({"text": "Hello.", "id": "t-2"}))
    assert_error(wait_response(conn, since), "invalid_target")


def test_the_answer_shows_the_priority(conn: FakeConnection) -> None:
    since = say_json(conn, {"text": "Smoke in the hall!", "id": "p-1", "priority": "alert"})
    response = wait_response(conn, since, request_id="p-1")
    assert response["status"] == "ok", response
    assert response["data"]["priority"] == "alert"


def test_an_engine_failure_is_refused_as_synthesis_failed_and_journaled(
    services: Services, tmp_path: Path
) -> None:
    # A real voice config beside a model file that is not an ONNX graph: loading it fails.
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not an ONNX model")
    config = Path(f"{bundled_model()}.json")
    Path(f"{broken}.json").write_bytes(config.read_bytes())
    service, conn = services(
        voices={"joe": {"engine": "piper"}, "broken": {"engine": "piper", "model": str(broken)}},
        scheduler={"idle_enabled": False},
    )
    since = conn.mark()
    conn.deliver(f"{SAY}/kitchen", json.dumps({"text": "Hello.", "id": "sf-1", "voice": "broken"}))
    error = wait_response(conn, since, request_id="sf-1")
    assert_error(error, "synthesis_failed")
    assert not conn.on(f"{BASE}/audio/kitchen", since)
    service.pipeline.scheduler.stop(10)  # the answer is journaled once the worker finishes
    assert journal_of(service).unfinished() == [], "a refused request is finished in the journal"
    assert service.reports.health()["answers"]["error"] == 1
