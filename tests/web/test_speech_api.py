"""The HTTP speech API with the official `openai` package as the client, and curl-style requests
to /api/speak: the real service in process (real voices, pipeline, scheduler and HTTP server on a
free loopback port; a fake MQTT connection), every answer decoded back."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import openai
import pytest
import soundfile

from tests.support.fake import Services
from tests.support.harness import BridgeFactory
from tests.support.web import raw_request
from tts_bridge import app
from tts_bridge.audio.stream import PCM_RATE
from tts_bridge.bench.localbroker import free_port
from tts_bridge.web import speech_api
from tts_bridge.web.api_keys import ApiKeys, read_keys_file
from tts_bridge.web.server import AudioServer

JOE_RATE = 22050
HEART_RATE = 24000
TWO_SENTENCES = "The front door is open. Please close it before you leave."


def audio_server(service: app.Service) -> AudioServer:
    return next(s for s in service.servers if isinstance(s, AudioServer))


def client_for(service: app.Service, key: str = "unused") -> openai.OpenAI:
    port = audio_server(service).port
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)


def decode(data: bytes) -> tuple[npt.NDArray[np.float64], int, str]:
    info = soundfile.info(io.BytesIO(data))
    audio, rate = soundfile.read(io.BytesIO(data), always_2d=True)
    return audio, int(rate), str(info.format)


@pytest.fixture
def served(services: Services) -> app.Service:
    service, _ = services()
    return service


def speak(
    service: app.Service,
    body: bytes,
    content_type: str,
    headers: dict[str, str] | None = None,
    path: str = "/api/speak",
) -> tuple[int, dict[str, str], bytes]:
    """A POST as curl sends it."""
    port = audio_server(service).port
    all_headers = {
        "Content-Type": content_type,
        "Content-Length": str(len(body)),
        **(headers or {}),
    }
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=all_headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def error_of(body: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# -- the openai package ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "libsndfile_format", "rate"),
    [
        ("wav", "WAV", JOE_RATE),
        ("flac", "FLAC", JOE_RATE),
        ("mp3", "MP3", JOE_RATE),
        ("opus", "OGG", HEART_RATE),
    ],
)
def test_every_format_decodes_and_the_repeat_is_cached(
    served: app.Service, fmt: str, libsndfile_format: str, rate: int
) -> None:
    client = client_for(served)
    text = f"The {fmt} answer is ready."
    first = client.audio.speech.with_raw_response.create(
        model="tts-1-hd",
        voice="joe",
        input=text,
        response_format=fmt,  # type: ignore[arg-type]
    )
    audio, got_rate, kind = decode(first.content)
    assert (kind, got_rate) == (libsndfile_format, rate)
    assert audio.shape[0] > rate // 2  # at least half a second of speech
    assert first.headers["X-TTS-Voice"] == "joe"
    assert first.headers["X-TTS-Tier"] == "quality"
    again = client.audio.speech.with_raw_response.create(
        model="tts-1-hd",
        voice="joe",
        input=text,
        response_format=fmt,  # type: ignore[arg-type]
    )
    if fmt in ("mp3", "flac"):  # whole answers say whether the cache made them
        assert first.headers["X-TTS-Cached"] == "false"
        assert again.headers["X-TTS-Cached"] == "true"
    if fmt != "opus":  # Opus is lossy, and its encoder is not deterministic across streams
        assert again.content == first.content
    info = served.pipeline.synthesizer.cache.stats()
    assert info["entries"] >= 1


def test_pcm_is_24_khz_16_bit_mono(served: app.Service) -> None:
    client = client_for(served)
    wav = client.audio.speech.create(
        model="tts-1-hd", voice="joe", input="Dinner is ready.", response_format="wav"
    ).content
    pcm = client.audio.speech.create(
        model="tts-1-hd", voice="joe", input="Dinner is ready.", response_format="pcm"
    ).content
    samples, rate, _ = decode(wav)
    assert rate == JOE_RATE
    assert len(pcm) % 2 == 0
    expected = samples.shape[0] * PCM_RATE / JOE_RATE
    assert abs(len(pcm) // 2 - expected) <= 64  # the resampler's edge, not a lost piece


def test_the_model_picks_the_tier(served: app.Service) -> None:
    client = client_for(served)
    fast = client.audio.speech.with_raw_response.create(
        model="tts-1", voice="joe", input="The fast answer.", response_format="wav"
    )
    assert fast.headers["X-TTS-Tier"] == "fast"
    assert fast.headers["X-TTS-Voice"] == "heart"  # joe's fast voice
    assert decode(fast.content)[1] == HEART_RATE


def test_streaming_joins_to_the_whole_answer(served: app.Service) -> None:
    client = client_for(served)
    with client.audio.speech.with_streaming_response.create(
        model="tts-1-hd", voice="joe", input=TWO_SENTENCES, response_format="wav"
    ) as response:
        assert response.headers["Transfer-Encoding"] == "chunked"
        streamed = b"".join(response.iter_bytes())
    # The same text again, whole (/api/speak), from the cache the stream filled.
    status, headers, whole = speak(
        served, json.dumps({"text": TWO_SENTENCES, "voice": "joe"}).encode(), "application/json"
    )
    assert status == 200
    assert headers["X-TTS-Cached"] == "true"
    streamed_audio, rate, _ = decode(streamed)
    whole_audio, whole_rate, _ = decode(whole)
    assert rate == whole_rate == JOE_RATE
    assert np.array_equal(streamed_audio, whole_audio)


def test_voices_and_models(served: app.Service) -> None:
    client = client_for(served)
    models = {m.id for m in client.models.list()}
    assert {"tts-1", "tts-1-hd"} <= models
    status, _, body = raw_request(audio_server(served).port, "GET", "/v1/audio/voices")
    assert status == 200
    voices = json.loads(body)
    assert voices["voices"] == [v.name for v in served.pipeline.voices().voices]
    assert voices["default_voice"] == "joe"
    assert {v["id"] for v in voices["data"]} == set(voices["voices"])


def test_an_openai_voice_name_means_the_default_voice(served: app.Service) -> None:
    response = client_for(served).audio.speech.with_raw_response.create(
        model="tts-1-hd", voice="alloy", input="Hello.", response_format="wav"
    )
    assert response.headers["X-TTS-Voice"] == served.pipeline.voices().default_voice


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"voice": "bob"}, "unknown_voice"),
        ({"model": "tts-9"}, "unknown_model"),
        ({"response_format": "aac"}, "unsupported_format"),
        ({"input": "  "}, "empty_text"),
        ({"speed": 9.0}, "invalid_options"),
    ],
)
def test_bad_requests_get_openais_error_shape(
    served: app.Service, args: dict[str, Any], code: str
) -> None:
    request: dict[str, Any] = {
        "model": "tts-1-hd",
        "voice": "joe",
        "input": "Hello.",
        "response_format": "wav",
        **args,
    }
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(served).audio.speech.create(**request)
    assert caught.value.status_code == 400
    assert caught.value.code == code
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == code and body["message"]
    # The bridge goes on serving.
    ok = client_for(served).audio.speech.create(
        model="tts-1-hd", voice="joe", input="Still here.", response_format="wav"
    )
    assert decode(ok.content)[1] == JOE_RATE


def test_too_long_text_is_refused(services: Services) -> None:
    service, _ = services(limits={"max_text_chars": 40})
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(service).audio.speech.create(
            model="tts-1-hd", voice="joe", input="word " * 20, response_format="wav"
        )
    assert caught.value.code == "text_too_long"


def test_a_busy_bridge_answers_503(services: Services) -> None:
    service, _ = services(
        limits={"max_queue": 1}, scheduler={"idle_enabled": False, "latency_budget_ms": 600_000}
    )
    scheduler = service.pipeline.scheduler
    gate = threading.Event()

    def held() -> None:
        gate.wait(30)

    try:
        # Occupy every worker: a job that stays queued means none is free, and the queue full.
        while True:
            assert scheduler.submit_live(held)
            deadline = time.monotonic() + 2.0
            while scheduler.depth and time.monotonic() < deadline:
                time.sleep(0.01)
            if scheduler.depth:
                break
        status, headers, body = speak(
            service, json.dumps({"text": "Hello."}).encode(), "application/json"
        )
    finally:
        gate.set()
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert error_of(body)["code"] == "busy"


# -- keys ------------------------------------------------------------------------------------


def test_keys_are_required_when_configured(services: Services, tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# the kitchen tablet\nfile-key\n", encoding="utf-8")
    service, _ = services(http={"api_keys": ["listed-key"], "api_keys_file": str(keys_file)})
    with pytest.raises(openai.AuthenticationError) as caught:
        client_for(service, key="wrong").audio.speech.create(
            model="tts-1-hd", voice="joe", input="Hello.", response_format="wav"
        )
    assert caught.value.code == "invalid_api_key"
    status, _, body = speak(service, b'{"text": "Hello."}', "application/json")
    assert status == 401 and error_of(body)["code"] == "invalid_api_key"
    for key in ("listed-key", "file-key"):
        ok = client_for(service, key=key).audio.speech.create(
            model="tts-1-hd", voice="joe", input="Hello.", response_format="wav"
        )
        assert decode(ok.content)[1] == JOE_RATE


def test_api_keys_compare_whole_keys() -> None:
    keys = ApiKeys(["secret"])
    assert keys.required
    assert keys.allows("Bearer secret")
    assert keys.allows("bearer  secret ")
    for header in (None, "", "secret", "Bearer secre", "Bearer secret2", "Basic secret"):
        assert not keys.allows(header)
    assert ApiKeys([]).allows(None)


def test_keys_file_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("a\n\n  # nothing\nb  # the tablet\n", encoding="utf-8")
    assert read_keys_file(path) == ["a", "b"]


def test_the_api_can_be_turned_off(services: Services) -> None:
    service, _ = services(http={"api_enabled": False})
    status, _, _ = speak(service, b'{"text": "Hello."}', "application/json")
    assert status == 404


# -- another site's page ---------------------------------------------------------------------

OPENAI_BODY = b'{"model": "tts-1-hd", "input": "Hello.", "voice": "joe", "response_format": "wav"}'
ROUTES = [("/v1/audio/speech", OPENAI_BODY), ("/api/speak", b"Hello.")]
# What a browser adds to a "simple" POST (text/plain needs no permission from the bridge).
CROSS_SITE = [
    {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
    {"Origin": "http://other.home.arpa:8123", "Sec-Fetch-Site": "same-site"},
    {"Origin": "http://evil.example"},  # a browser without Sec-Fetch-Site
    {"Origin": "null"},  # a sandboxed frame, a file
]


def own_origin(service: app.Service) -> str:
    return f"http://127.0.0.1:{audio_server(service).port}"


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_another_sites_page_is_refused(
    served: app.Service, path: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    for headers in CROSS_SITE:
        status, _, answer = speak(served, body, "text/plain", headers, path=path)
        assert status == 403, (headers, answer[:200])
        error = error_of(answer)
        assert (error["code"], error["type"]) == ("cross_origin", "invalid_request_error")
    # Counted each time, logged once (the fault throttle).
    refusals = [r for r in caplog.records if "another site" in r.getMessage()]
    assert len(refusals) == 1
    assert "'http://evil.example'" in refusals[0].getMessage()


@pytest.mark.parametrize(("path", "body"), ROUTES)
def test_own_origin_and_programs_are_served(served: app.Service, path: str, body: bytes) -> None:
    for headers in (
        {},  # curl, Home Assistant, the openai package
        {"Origin": own_origin(served), "Sec-Fetch-Site": "same-origin"},
        {"Origin": own_origin(served)},
    ):
        status, _, audio = speak(served, body, "text/plain", headers, path=path)
        assert status == 200, (headers, audio[:200])
        assert decode(audio)[1] == JOE_RATE


def test_a_valid_key_is_served_from_another_site(services: Services) -> None:
    service, _ = services(http={"api_keys": ["kitchen"]})
    headers = {**CROSS_SITE[0], "Authorization": "Bearer kitchen"}
    for path, body in ROUTES:
        status, _, audio = speak(service, body, "text/plain", headers, path=path)
        assert status == 200, audio[:200]
        assert decode(audio)[1] == JOE_RATE
        # Without the key: the key's refusal, as before.
        status, _, answer = speak(service, body, "text/plain", CROSS_SITE[0], path=path)
        assert status == 401 and error_of(answer)["code"] == "invalid_api_key"


# -- /api/speak ------------------------------------------------------------------------------


def test_speak_takes_json_form_multipart_and_plain_text(served: app.Service) -> None:
    text = "The laundry is dry."
    boundary = uuid.uuid4().hex
    multipart = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="text"\r\n\r\n{text}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="format"\r\n\r\nflac\r\n'
        f"--{boundary}--\r\n"
    ).encode()
    requests = [
        (json.dumps({"text": text, "voice": "joe"}).encode(), "application/json", "WAV"),
        (
            urllib.parse.urlencode({"text": text, "format": "mp3"}).encode(),
            "application/x-www-form-urlencoded",
            "MP3",
        ),
        (multipart, f"multipart/form-data; boundary={boundary}", "FLAC"),
        (text.encode(), "text/plain; charset=utf-8", "WAV"),
    ]
    for body, content_type, kind in requests:
        status, headers, audio = speak(served, body, content_type)
        assert status == 200, audio[:200]
        assert int(headers["Content-Length"]) == len(audio)
        samples, rate, got = decode(audio)
        assert (got, rate) == (kind, JOE_RATE)
        assert samples.shape[0] > JOE_RATE // 2


@pytest.mark.parametrize(
    ("body", "content_type", "code"),
    [
        (b'{"text": 5}', "application/json", "invalid_request"),
        (b'{"text": "hi", "colour": "red"}', "application/json", "invalid_request"),
        (b"{not json", "application/json", "invalid_json"),
        (b'{"text": "hi", "tier": "slow"}', "application/json", "invalid_request"),
        (b'{"text": "hi", "format": "aac"}', "application/json", "unsupported_format"),
        (b"\xff\xfe", "text/plain", "invalid_utf8"),
        (b'{"text": "' + b"a" * 20_000 + b'"}', "application/json", "payload_too_large"),
        (b'{"text": "hi", "priority": "urgent"}', "application/json", "invalid_priority"),
        # Deeper than the JSON parser's recursion limit: refused, not an internal error.
        (b"[" * 5000 + b"]" * 5000, "application/json", "json_too_deep"),
        (b'{"text": "hi", "a": ' + b"[" * 9 + b"]" * 9 + b"}", "application/json", "json_too_deep"),
    ],
)
def test_speak_refusals(served: app.Service, body: bytes, content_type: str, code: str) -> None:
    status, _, answer = speak(served, body, content_type)
    assert status == (413 if code == "payload_too_large" else 400)
    assert error_of(answer)["code"] == code


def _post_in_pieces(
    service: app.Service, pieces: list[bytes], length: int, pause_s: float
) -> bytes:
    """A POST whose body arrives in pieces, `pause_s` apart (a slow phone on Wi-Fi)."""
    port = audio_server(service).port
    head = (
        f"POST /api/speak HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(head)
        for piece in pieces:
            time.sleep(pause_s)
            conn.sendall(piece)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_a_body_that_arrives_in_pieces_is_read_whole(served: app.Service) -> None:
    body = json.dumps({"text": "The parcel is at the door.", "priority": "high"}).encode()
    answer = _post_in_pieces(served, [body[:10], body[10:]], len(body), 0.3)
    head, _, audio = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer[:300]
    assert decode(audio)[1] == JOE_RATE


def test_a_body_that_never_arrives_is_refused(
    served: app.Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(speech_api, "BODY_TIMEOUT_S", 0.5)
    answer = _post_in_pieces(served, [b'{"text": "'], 100, 0.0)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:300]
    assert error_of(body)["code"] == "request_timeout"
    # and the bridge goes on serving
    status, _, _ = speak(served, b'{"text": "Still here."}', "application/json")
    assert status == 200


def _occupy_every_worker(service: app.Service, gate: threading.Event) -> None:
    """Jobs that wait for `gate` until one stays queued: no worker is free."""
    scheduler = service.pipeline.scheduler

    def held() -> None:
        gate.wait(60)

    while True:
        assert scheduler.submit_live(held)
        deadline = time.monotonic() + 2.0
        while scheduler.depth and time.monotonic() < deadline:
            time.sleep(0.01)
        if scheduler.depth:
            return


def test_the_openai_client_can_ask_for_a_priority(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One voice for all, no rerouting to the fast voice, nothing cached: only the priority can
    # put the alert, asked last and the longest (shorter work goes first within a priority),
    # before the normal requests queued ahead of it.
    service, _ = services(scheduler={"idle_enabled": False, "latency_budget_ms": 600_000})
    engine = service.pipeline.synthesizer.engines.voice("joe").engine
    spoken: list[str] = []
    synthesize = engine.synthesize

    def record(text: str, *rest: Any) -> Any:
        spoken.append(text)
        return synthesize(text, *rest)

    monkeypatch.setattr(engine, "synthesize", record)
    monkeypatch.setattr(engine, "synthesize_stream", None, raising=False)
    run = "".join(chr(ord("a") + int(digit, 16)) for digit in uuid.uuid4().hex[:8])
    normals = [f"A normal {word} request, {run}." for word in ("alpha", "bravo", "charlie")]
    # Under the clause threshold (a streamed answer renders a long sentence clause by clause),
    # so the engine is given each request whole and the order below reads one entry each.
    alert = f"Smoke in the kitchen, {run}: everybody leave the house."
    answers: dict[str, bytes] = {}

    def ask(text: str, priority: str) -> None:
        answers[text] = (
            client_for(service)
            .audio.speech.create(
                model="tts-1-hd",  # the quality lane, whose workers are all busy
                voice="joe",
                input=text,
                response_format="wav",
                extra_body={"priority": priority},
            )
            .read()
        )

    gate = threading.Event()
    asked: list[threading.Thread] = []
    try:
        _occupy_every_worker(service, gate)
        for text, priority in [*((n, "normal") for n in normals), (alert, "alert")]:
            asked.append(threading.Thread(target=ask, args=(text, priority)))
            asked[-1].start()
            deadline = time.monotonic() + 30
            while service.pipeline.scheduler.doors().get("http", 0) < len(asked):
                assert time.monotonic() < deadline, "the request was not queued"
                time.sleep(0.01)
    finally:
        gate.set()
    for thread in asked:
        thread.join(60)
    order = [next(t for t in (alert, *normals) if t.split(",")[0] in said) for said in spoken]
    assert order == [alert, *normals]
    assert all(decode(answers[text])[0].shape[0] > 0 for text in (alert, *normals))


def test_concurrent_requests_each_get_their_own_audio(served: app.Service) -> None:
    texts = [f"Request number {n} is done." for n in range(3)]
    results: dict[str, bytes] = {}

    def ask(text: str) -> None:
        results[text] = (
            client_for(served)
            .audio.speech.create(model="tts-1-hd", voice="joe", input=text, response_format="wav")
            .content
        )

    threads = [threading.Thread(target=ask, args=(t,)) for t in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert set(results) == set(texts)
    for text in texts:
        again = (
            client_for(served)
            .audio.speech.create(model="tts-1-hd", voice="joe", input=text, response_format="wav")
            .content
        )
        assert again == results[text]  # from the cache: the very same audio


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # httpx honours proxy variables; loopback requests must never leave the machine.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield


def test_a_client_that_leaves_mid_stream_does_not_stop_the_bridge(served: app.Service) -> None:
    import http.client

    port = audio_server(served).port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    text = " ".join(f"Sentence number {n} of a long announcement." for n in range(8))
    fields = {"model": "tts-1-hd", "voice": "joe", "input": text, "response_format": "pcm"}
    body = json.dumps(fields)
    conn.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.read(64)
    conn.close()  # gone mid-answer
    ok = client_for(served).audio.speech.create(
        model="tts-1-hd", voice="joe", input="Still here.", response_format="wav"
    )
    assert decode(ok.content)[1] == JOE_RATE


@pytest.mark.slow
def test_the_openai_client_against_a_running_bridge(bridge_factory: BridgeFactory) -> None:
    port = free_port()
    bridge_factory(http={"host": "127.0.0.1", "port": port, "api_keys": ["kitchen-key"]})
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="kitchen-key", max_retries=0
    )
    text = "The bridge answers the official client."
    first = client.audio.speech.with_raw_response.create(
        model="tts-1-hd", voice="joe", input=text, response_format="mp3"
    )
    audio, rate, kind = decode(first.content)
    assert (kind, rate) == ("MP3", JOE_RATE)
    assert audio.shape[0] > JOE_RATE // 2
    again = client.audio.speech.with_raw_response.create(
        model="tts-1-hd", voice="joe", input=text, response_format="mp3"
    )
    assert (first.headers["X-TTS-Cached"], again.headers["X-TTS-Cached"]) == ("false", "true")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0
        ).audio.speech.create(model="tts-1", voice="joe", input="No.", response_format="wav")
