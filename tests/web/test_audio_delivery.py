"""Audio by URL and per-target formats in process: the real service with its HTTP audio server on
a free loopback port, a fake MQTT connection, and real HTTP requests for the answers' URLs."""

from __future__ import annotations

import io
import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import soundfile

from tests.mqtt.test_say import (
    JOE_RATE,
    REPLY,
    SAY,
    assert_audio_message,
    say,
    say_json,
    wait_audio,
    wait_response,
)
from tests.support.answers import assert_error, parse_wav
from tests.support.fake import BASE, FakeConnection, Services, props
from tests.support.web import fetch
from tts_bridge.mqtt.client import OutgoingMessage

# PubSubClient on an ESP32 takes MQTT messages up to 64 KiB (its buffer, header included).
ESP32_LIMIT = 64 * 1024
# A normal announcement: about four seconds of joe, whose WAV alone is well over 64 KiB.
SENTENCE = "The washing machine has finished, and the laundry is ready to hang up."


def decode(data: bytes) -> tuple[npt.NDArray[np.float64], int, str]:
    """(frames x channels, rate, libsndfile's format name)."""
    info = soundfile.info(io.BytesIO(data))
    audio, rate = soundfile.read(io.BytesIO(data), always_2d=True)
    return audio, int(rate), str(info.format)


def frames_at(wav: bytes, rate: int) -> int:
    """How many frames the answer's WAV has once resampled to `rate` (what a gapless decoder
    of the encoded audio gives back)."""
    samples = parse_wav(wav).samples.size
    return round(samples * rate / JOE_RATE)


def answer_of(conn: FakeConnection, payload: str, target: str = "kitchen") -> dict[str, Any]:
    since = say(conn, payload, target)
    response = wait_response(conn, since)
    assert response["status"] == "ok", response
    data: dict[str, Any] = response["data"]
    return data


def audio_after(conn: FakeConnection, since: int, target: str = "kitchen") -> OutgoingMessage:
    return wait_audio(conn, target, since)


@pytest.fixture
def conn(services: Services) -> FakeConnection:
    return services()[1]


def test_every_answer_carries_a_url_that_serves_its_audio(conn: FakeConnection) -> None:
    since = say(conn, SENTENCE)
    data = wait_response(conn, since)["data"]
    wav = audio_after(conn, since)
    # A target without configuration keeps its WAV bytes, exactly as before.
    assert_audio_message(wav, request_id=props(wav)["id"], sample_rate=JOE_RATE)
    assert "format" not in props(wav)
    assert data["bytes"] == len(wav.payload)

    assert (data["format"], data["content_type"]) == ("mp3", "audio/mpeg")  # http.format
    assert data["url"].endswith(".mp3")
    status, headers, body = fetch(data["url"])
    assert status == 200
    assert headers["Content-Type"] == "audio/mpeg"
    audio, rate, major = decode(body)
    assert (major, rate, audio.shape[1]) == ("MP3", 44100, 1)
    assert audio.shape[0] == frames_at(wav.payload, 44100)
    assert abs(audio.shape[0] / rate * 1000 - data["duration_ms"]) <= 1


def test_a_repeat_gets_the_same_url_and_another_sentence_another(conn: FakeConnection) -> None:
    first = answer_of(conn, "Dinner is ready.")
    again = answer_of(conn, "Dinner is ready.")
    other = answer_of(conn, "The front door is open.")
    assert again["cached"] is True
    assert again["url"] == first["url"]
    assert other["url"] != first["url"]
    # The URL is a token, never the text (announcements can be private).
    assert "Dinner" not in first["url"] and "dinner" not in first["url"].lower()
    assert fetch(again["url"])[0] == 200


def test_a_target_format_is_on_its_audio_topic_and_behind_its_url(services: Services) -> None:
    _, conn = services(
        targets={
            "kitchen": {"format": "flac", "sample_rate": 48000, "channels": 2},
            "hall": {"format": "mp3", "sample_rate": 44100},
            "attic": {"format": "ogg"},  # an alias: Ogg Opus
        }
    )
    for target, (container, major, rate, channels, content_type) in {
        "kitchen": ("flac", "FLAC", 48000, 2, "audio/flac"),
        "hall": ("mp3", "MP3", 44100, 1, "audio/mpeg"),
        "attic": ("opus", "OGG", 24000, 1, "audio/ogg"),
    }.items():
        since = say(conn, SENTENCE, target)
        data = wait_response(conn, since)["data"]
        message = audio_after(conn, since, target)
        assert message.content_type == content_type
        assert props(message)["format"] == container
        assert data["bytes"] == len(message.payload)
        assert data["content_type"] == content_type
        audio, decoded_rate, decoded_major = decode(message.payload)
        assert (decoded_major, decoded_rate, audio.shape[1]) == (major, rate, channels)
        # The same audio behind the URL, and as long as the answer says.
        status, _, body = fetch(data["url"])
        assert status == 200 and body == message.payload
        assert abs(audio.shape[0] / rate * 1000 - data["duration_ms"]) <= 1, target


def test_a_request_format_overrides_the_target_and_goes_to_the_response_topic(
    conn: FakeConnection,
) -> None:
    request = {"text": SENTENCE, "id": "f1", "format": {"format": "opus", "sample_rate": 48000}}
    since = say_json(conn, request, response_topic=REPLY, correlation_data=b"c1")
    data = wait_response(conn, since, request_id="f1")["data"]
    message = wait_audio(conn, "kitchen", since, request_id="f1")
    assert message.content_type == "audio/ogg"
    audio, rate, major = decode(message.payload)
    assert (major, rate, audio.shape[1]) == ("OGG", 48000, 1)
    assert abs(audio.shape[0] / rate * 1000 - data["duration_ms"]) <= 1
    reply = conn.wait_for(
        lambda m: m.topic == REPLY and m.content_type != "application/json",
        since=since,
        what="audio on the response topic",
    )
    assert reply.payload == message.payload and reply.content_type == "audio/ogg"
    assert reply.correlation_data == b"c1"
    assert data["url"].endswith(".opus")
    assert fetch(data["url"])[2] == message.payload


def test_a_url_target_gets_a_small_link_that_fetches_the_audio(services: Services) -> None:
    _, conn = services(targets={"esp": {"payload": "url", "format": "mp3"}})
    since = say_json(conn, {"text": SENTENCE, "id": "esp-1"}, target="esp")
    data = wait_response(conn, since, request_id="esp-1")["data"]
    link = wait_audio(conn, "esp", since, request_id="esp-1")
    assert link.content_type == "application/json"
    assert props(link)["format"] == "mp3"
    message = json.loads(link.payload)
    assert set(message) == {"url", "id", "duration_ms", "format"}
    assert (message["id"], message["format"]) == ("esp-1", "mp3")
    assert message["url"] == data["url"]
    assert message["duration_ms"] == data["duration_ms"]
    status, headers, body = fetch(message["url"])
    assert status == 200 and headers["Content-Type"] == "audio/mpeg"
    assert data["bytes"] == len(body)
    audio, rate, _ = decode(body)
    assert abs(audio.shape[0] / rate * 1000 - message["duration_ms"]) <= 1
    # Nothing else went to the device's topic: no WAV, no stream.
    assert [m.topic for m in conn.on(f"{BASE}/audio/esp", since)] == [link.topic]
    assert not conn.on(f"{BASE}/audio/esp/stream", since)


def test_an_esp32_target_on_mp3_or_url_gets_a_message_under_64_kib(services: Services) -> None:
    _, conn = services(
        targets={"esp_mp3": {"format": "mp3"}, "esp_url": {"payload": "url"}, "plain": {}}
    )
    sizes = {}
    for target in ("plain", "esp_mp3", "esp_url"):
        since = say(conn, SENTENCE, target)
        wait_response(conn, since)
        sizes[target] = len(audio_after(conn, since, target).payload)
    assert sizes["plain"] > ESP32_LIMIT, f"the WAV of a normal sentence fits anyway: {sizes}"
    assert sizes["esp_mp3"] < ESP32_LIMIT, sizes
    assert sizes["esp_url"] < 1024, sizes


@pytest.mark.parametrize(
    "bad",
    ["aac", 5, {"format": "mp3", "sample_rate": 44000}, {"format": "opus", "bitrate": 3}],
)
def test_an_invalid_format_is_refused_and_the_service_keeps_serving(
    conn: FakeConnection, bad: object
) -> None:
    since = say_json(conn, {"text": "Hello there.", "id": "bad-fmt", "format": bad})
    response = wait_response(conn, since, request_id="bad-fmt")
    assert_error(response, "invalid_format")
    assert "format" in response["error"]
    assert not conn.on(f"{BASE}/audio/kitchen", since)
    assert answer_of(conn, "Hello there.")["url"]


def test_without_the_http_server_answers_have_no_url(services: Services) -> None:
    _, conn = services(http={"enabled": False}, targets={"hall": {"format": "mp3"}})
    data = answer_of(conn, "Dinner is ready.")
    assert not {"url", "format", "content_type"} & set(data)
    # A target's format still applies to its topic.
    since = say(conn, "Dinner is ready.", "hall")
    wait_response(conn, since)
    assert audio_after(conn, since, "hall").content_type == "audio/mpeg"


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_port_in_use_is_logged_and_mqtt_keeps_serving(
    services: Services, taken_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="tts_bridge.app"):
        service, conn = services(
            http={"port": taken_port}, targets={"esp": {"payload": "url"}, "hall": {}}
        )
    assert any(
        "AudioServer did not start" in r.getMessage() and str(taken_port) in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    since = say(conn, "Dinner is ready.", "hall")
    assert "url" not in wait_response(conn, since, status="ok")["data"]
    assert parse_wav(audio_after(conn, since, "hall").payload).sample_rate == JOE_RATE
    # A target that only takes URLs gets a clear error instead of silence.
    since = say_json(conn, {"text": "Dinner is ready.", "id": "u1"}, target="esp")
    assert_error(wait_response(conn, since, request_id="u1"), "url_unavailable")
    service.stop()  # a server that never started stops cleanly


def test_the_audio_server_starts_and_stops_with_the_service(services: Services) -> None:
    service, conn = services()
    url = answer_of(conn, "Dinner is ready.")["url"]
    assert fetch(url)[0] == 200
    service.stop()
    with pytest.raises(OSError):
        fetch(url)


def test_say_topic_without_target_uses_the_default_target_format(services: Services) -> None:
    _, conn = services(targets={"default": {"format": "flac"}})
    since = conn.mark()
    conn.deliver(SAY, "Dinner is ready.")
    data = wait_response(conn, since)["data"]
    message = audio_after(conn, since, "default")
    assert message.content_type == "audio/flac"
    assert data["url"].endswith(".flac")
