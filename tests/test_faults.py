"""The service under faults, in process: a journal on a full disk, poison requests, response
topics that would make the bridge a confused deputy, publishes the broker refuses, retained
requests, costly options, a failing voice. The real service on a fake connection; the full
disk is a real tmpfs (root only)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from tests.mqtt.test_say import say, say_json, wait_audio, wait_response
from tests.support.answers import assert_error
from tests.support.fake import BASE, Services, body, journal_of, props
from tests.support.fullfs import small_tmpfs
from tts_bridge.engines.piper import bundled_model
from tts_bridge.mqtt.journal import DEFAULT_MAX_ATTEMPTS

SAY = f"{BASE}/say"
RESPONSE = f"{BASE}/bridge/response/say"
CACHE_CLEAR = f"{BASE}/bridge/request/cache/clear"


def _broken_piper(tmp_path: Path) -> Path:
    """A Piper voice whose model is not an ONNX file: it fails at its first load."""
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not an ONNX model")
    Path(f"{broken}.json").write_bytes(Path(f"{bundled_model()}.json").read_bytes())
    return broken


# -- storage -----------------------------------------------------------------------------------


def test_a_journal_on_a_full_disk_still_answers_and_recovers(
    services: Services, tmp_path: Path
) -> None:
    with small_tmpfs(tmp_path / "small", "512k") as fs:
        service, conn = services(
            journal={"path": str(fs.root / "journal.sqlite3")}, scheduler={"idle_enabled": False}
        )
        fs.fill()
        since = conn.mark()
        message = conn.deliver(f"{SAY}/kitchen", json.dumps({"text": "Full.", "id": "full-1"}))
        answer = wait_response(conn, since, request_id="full-1")
        assert answer["status"] == "ok", answer
        conn.wait_acked(message.mid)
        response = next(m for m in conn.on(RESPONSE, since) if body(m)["id"] == "full-1")
        assert conn.order((message.mid, 1)) > conn.order(response), "acked before the answer"
        health = service.reports.health()
        assert health["journal_degraded"] == "disk full" and health["journal_write_errors"] >= 1
        fs.free()
        since = say_json(conn, {"text": "Space is back.", "id": "full-2"})
        assert wait_response(conn, since, request_id="full-2")["status"] == "ok"
        service.pipeline.scheduler.stop(10)
        assert service.reports.health()["journal_degraded"] is None
        assert journal_of(service).unfinished() == []
        service.stop()


def test_a_journal_that_cannot_be_opened_at_start_is_opened_later(
    services: Services, tmp_path: Path
) -> None:
    with small_tmpfs(tmp_path / "small", "256k") as fs:
        fs.fill()
        service, conn = services(
            journal={"path": str(fs.root / "new" / "journal.sqlite3")},
            scheduler={"idle_enabled": False},
        )
        assert service.journal is None
        assert service.reports.health()["journal_degraded"] == "not open"
        since = conn.mark()
        message = conn.deliver(f"{SAY}/kitchen", json.dumps({"text": "No.", "id": "nojournal-1"}))
        assert wait_response(conn, since, request_id="nojournal-1")["status"] == "ok"
        conn.wait_acked(message.mid)
        response = conn.on(RESPONSE, since)[-1]
        assert conn.order((message.mid, 1)) > conn.order(response), "acked before the answer"
        fs.free()
        service.bridge._retry_journal(math.inf)
        assert service.journal is not None
        assert service.reports.health()["journal_degraded"] is None
        since = say_json(conn, {"text": "Journaled again.", "id": "nojournal-2"})
        assert wait_response(conn, since, request_id="nojournal-2")["status"] == "ok"
        service.stop()


def test_a_request_resumed_too_often_is_retired_with_an_error(services: Services) -> None:
    service, conn = services(start=False)
    journal = journal_of(service)
    payload = json.dumps({"text": "I crash the bridge", "id": "poison-1"}).encode()
    accepted = journal.accept(
        "key-poison-1",
        f"{SAY}/attic",
        payload,
        response_topic="me/reply",
        correlation_data=b"p1",
        received_at=0.0,
        dedupe=True,
    )
    for _ in range(DEFAULT_MAX_ATTEMPTS):  # each start that began its synthesis and then died
        journal.started(accepted.entry_id)
    service.start()
    services.running.append(service)
    error = wait_response(conn, 0, request_id="poison-1")
    assert_error(error, "poison_request")
    reply = conn.wait_for(lambda m: m.topic == "me/reply", what="the error on the reply topic")
    assert reply.correlation_data == b"p1" and body(reply)["code"] == "poison_request"
    assert not conn.on(f"{BASE}/audio/attic"), "a poison request is not served again"
    assert journal.unfinished() == []
    since = say_json(conn, {"text": "Next one.", "id": "after-poison"}, "attic")
    assert wait_response(conn, since, request_id="after-poison")["status"] == "ok"


# -- costly or odd requests ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ('{"text": "Slow.", "options": {"speed": 0.005}}', "invalid_options"),
        ('{"text": "Stop.", "options": {"speed": 0}}', "invalid_options"),
        ('{"text": "Back.", "options": {"speed": -1}}', "invalid_options"),
        ('{"text": "Fast.", "options": {"speed": 1000}}', "invalid_options"),
        ('{"text": "Not a number.", "options": {"speed": NaN}}', "invalid_json"),
        ('{"text": "Forever.", "options": {"speed": Infinity}}', "invalid_json"),
        (json.dumps({"text": "word " * 1000, "options": {"speed": 0.25}}), "audio_too_long"),
    ],
)
def test_costly_options_are_refused_and_the_service_keeps_serving(
    services: Services, payload: str, code: str
) -> None:
    _, conn = services(limits={"max_audio_s": 60})
    since = say(conn, payload)
    assert_error(wait_response(conn, since), code)
    since = say_json(conn, {"text": "Still here.", "id": "still"})
    assert wait_response(conn, since, request_id="still")["status"] == "ok"


def test_the_audio_cap_uses_the_speed_the_voice_renders_at(services: Services) -> None:
    _, conn = services(
        voices={"slow": {"engine": "piper", "options": {"speed": 0.25}}},
        default_voice="slow",
        limits={"max_audio_s": 10},
        scheduler={"idle_enabled": False},
    )
    text = "This sentence is spoken slowly by the slow voice."  # about 3 s at speed 1
    since = say_json(conn, {"text": text, "id": "slow-1"})
    error = wait_response(conn, since, request_id="slow-1")
    assert_error(error, "audio_too_long")
    assert "speed 0.25" in error["error"], error
    since = say_json(conn, {"text": text, "id": "slow-2", "options": {"speed": 1.0}})
    assert wait_response(conn, since, request_id="slow-2")["status"] == "ok"


def test_a_bom_before_json_is_not_spoken(services: Services) -> None:
    _, conn = services()
    since = say(conn, "\ufeff" + json.dumps({"text": "Hi.", "id": "bom-1"}))
    answer = wait_response(conn, since, request_id="bom-1")
    assert answer["status"] == "ok", "the JSON was read as JSON"
    assert answer["data"]["sentences"] == 1


def test_an_id_with_a_lone_surrogate_is_still_answered(services: Services) -> None:
    _, conn = services()
    since = say(conn, '{"text": "Hi.", "id": "\\ud800"}')
    error = wait_response(conn, since)
    assert_error(error, "invalid_request")


def test_a_failing_fast_voice_falls_back_to_the_quality_voice(
    services: Services, tmp_path: Path
) -> None:
    broken = _broken_piper(tmp_path)
    _, conn = services(
        voices={
            "good": {"engine": "piper", "tier": "quality", "fast_voice": "bad"},
            "bad": {"engine": "piper", "model": str(broken), "tier": "fast"},
        },
        default_voice="good",
        scheduler={"idle_enabled": False},
    )
    since = say_json(conn, {"text": "Fast first.", "id": "fb-1", "tier": "fast"})
    answer = wait_response(conn, since, request_id="fb-1")
    assert answer["status"] == "ok", answer
    assert (answer["data"]["voice"], answer["data"]["tier"]) == ("good", "quality")
    audio = wait_audio(conn, "kitchen", since, request_id="fb-1")
    assert props(audio)["tier"] == "quality"


def test_a_failing_quality_voice_falls_back_to_its_fast_voice(
    services: Services, tmp_path: Path
) -> None:
    broken = _broken_piper(tmp_path)
    _, conn = services(
        voices={
            "bad": {"engine": "piper", "model": str(broken), "tier": "quality", "fast_voice": "ok"},
            "ok": {"engine": "piper", "tier": "fast"},
        },
        default_voice="bad",
        scheduler={"idle_enabled": False},
    )
    since = say_json(conn, {"text": "Quality first.", "id": "fb-2", "tier": "quality"})
    answer = wait_response(conn, since, request_id="fb-2")
    assert answer["status"] == "ok", answer
    assert (answer["data"]["voice"], answer["data"]["tier"]) == ("ok", "fast")


@pytest.mark.parametrize(
    "number",
    ["1" * 38, "9" * 45, "-" + "7" * 40, "1" * 40 + ".5", "1,234" + ",567" * 13, "1" * 80 + "th"],
)
def test_hibari_speaks_huge_integers(services: Services, number: str) -> None:
    _, conn = services()
    since = say_json(conn, {"text": f"The code is {number}.", "id": "big", "voice": "heart"})
    answer = wait_response(conn, since, request_id="big")
    assert answer["status"] == "ok", answer
    assert answer["data"]["voice"] == "heart"


# -- response topics -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    [
        CACHE_CLEAR,
        f"{BASE}/say/kitchen",
        f"{BASE}/bridge/state",
        "homeassistant/device/tts_bridge/config",
        "hermes/tts/say",
        "clients/+/reply",
    ],
)
def test_a_response_topic_the_bridge_must_not_publish_to_is_refused(
    services: Services, topic: str
) -> None:
    _, conn = services()
    since = say_json(
        conn, {"text": "Hello.", "id": "deputy"}, response_topic=topic, correlation_data=b"x"
    )
    error = wait_response(conn, since, request_id="deputy")
    assert_error(error, "invalid_response_topic")
    assert not conn.on(topic, since), f"published to {topic}"
    assert not conn.on(f"{BASE}/audio/kitchen", since), "a refused request is not spoken"
    assert len([m for m in conn.on(RESPONSE, since) if body(m)["id"] == "deputy"]) == 1


def test_a_refusal_aimed_at_cache_clear_does_not_clear_the_cache(services: Services) -> None:
    service, conn = services(scheduler={"idle_enabled": False})
    since = say_json(conn, {"text": "Keep me cached.", "id": "c-1"})
    assert wait_response(conn, since, request_id="c-1")["status"] == "ok"
    entries = service.pipeline.synthesizer.cache.stats()["entries"]
    assert entries >= 1
    since = say(conn, b"\xff not utf-8", response_topic=CACHE_CLEAR)  # refused before parsing
    assert_error(wait_response(conn, since), "invalid_utf8")
    assert not conn.on(CACHE_CLEAR, since)
    assert service.pipeline.synthesizer.cache.stats()["entries"] == entries


def test_the_api_never_answers_on_a_refused_response_topic(services: Services) -> None:
    service, conn = services(scheduler={"idle_enabled": False})
    since = say_json(conn, {"text": "Cached.", "id": "c-2"})
    assert wait_response(conn, since, request_id="c-2")["status"] == "ok"
    since = conn.mark()
    conn.deliver(f"{BASE}/bridge/request/cache/clear", b"", response_topic=f"{BASE}/say/x")
    answer = body(conn.wait_for(lambda m: m.topic == f"{BASE}/bridge/response/cache/clear"))
    assert answer["status"] == "error" and answer["code"] == "invalid_response_topic", answer
    assert not conn.on(f"{BASE}/say/x", since)
    assert service.pipeline.synthesizer.cache.stats()["entries"] >= 1, "not executed"


def test_an_allow_list_limits_response_topics(services: Services) -> None:
    _, conn = services(mqtt={"response_topics": ["clients/#"]})
    since = say_json(conn, {"text": "Hi.", "id": "al-1"}, response_topic="other/reply")
    refused = wait_response(conn, since, request_id="al-1")
    assert_error(refused, "invalid_response_topic")
    assert refused["error"].startswith("response topic 'other/reply' refused"), refused
    since = say_json(conn, {"text": "Hi.", "id": "al-2"}, response_topic="clients/me")
    assert wait_response(conn, since, request_id="al-2")["status"] == "ok"
    reply = conn.wait_for(lambda m: m.topic == "clients/me", since=since)
    assert reply.content_type == "audio/wav"


# -- the broker's refusals and retained requests -------------------------------------------------


def test_a_refused_audio_publish_answers_not_authorized(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tts_bridge.mqtt.say")
    service, conn = services()
    conn.refuse(f"{BASE}/audio/denied")
    for n in range(3):
        since = say_json(conn, {"text": "Hello there.", "id": f"d-{n}"}, "denied")
        error = wait_response(conn, since, request_id=f"d-{n}")
        assert_error(error, "not_authorized")
        assert f"{BASE}/audio/denied" in error["error"] and "Not authorized" in error["error"]
    since = say_json(conn, {"text": "Hello there.", "id": "allowed"}, "kitchen")
    assert wait_response(conn, since, request_id="allowed")["status"] == "ok"
    health = service.reports.health()
    assert health["publish_refusals"] == {"Not authorized": 3}
    assert health["answers_not_authorized"] == 3
    assert health["answers"]["error"] == 3
    assert any(f"{BASE}/audio/denied" in r.getMessage() for r in caplog.records)


def test_a_refused_stream_publish_answers_not_authorized(services: Services) -> None:
    _, conn = services()
    conn.refuse(f"{BASE}/audio/+/stream")
    since = say_json(conn, {"text": "One. Two.", "id": "s-1", "stream": True}, "porch")
    assert_error(wait_response(conn, since, request_id="s-1"), "not_authorized")


def test_retained_requests_are_acked_and_not_executed(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tts_bridge.mqtt.bridge")
    service, conn = services(scheduler={"idle_enabled": False})
    since = say_json(conn, {"text": "Cached.", "id": "r-0"})
    assert wait_response(conn, since, request_id="r-0")["status"] == "ok"
    since = conn.mark()
    stale = [
        conn.deliver(f"{SAY}/kitchen", json.dumps({"text": "Old.", "id": "r-1"}), retained=True),
        conn.deliver(f"{SAY}/kitchen", json.dumps({"text": "Old.", "id": "r-2"}), retained=True),
        conn.deliver(CACHE_CLEAR, b"", retained=True),
    ]
    for message in stale:
        assert (message.mid, 1) in conn.acks
    since_live = say_json(conn, {"text": "Live.", "id": "r-3"})
    assert wait_response(conn, since_live, request_id="r-3")["status"] == "ok"
    assert not [m for m in conn.on(RESPONSE, since) if body(m)["id"] in ("r-1", "r-2")]
    assert not conn.on(f"{BASE}/bridge/response/cache/clear", since)
    assert service.pipeline.synthesizer.cache.stats()["entries"] >= 1
    lines = [r.getMessage() for r in caplog.records if "retained request" in r.getMessage()]
    assert len(lines) == 2, lines  # once per topic
    # Home Assistant's birth message is retained by design and still handled.
    since = conn.mark()
    conn.deliver("homeassistant/status", b"online", retained=True)
    conn.wait_for(lambda m: m.topic.startswith("homeassistant/device/"), since=since)


def test_health_reports_the_fault_counters(services: Services) -> None:
    service, _ = services()
    health = service.reports.health()
    for key in (
        "cache_degraded",
        "cache_write_errors",
        "journal_degraded",
        "journal_write_errors",
        "journal_unrecorded_answers",
        "publish_refusals",
        "session_takeovers",
        "answers_not_authorized",
    ):
        assert key in health, key
    assert (health["cache_degraded"], health["journal_degraded"]) == (None, None)


def test_an_unwritable_cache_still_serves(services: Services, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "cachefs", "2m") as fs:
        service, conn = services(
            cache={"dir": str(fs.root / "cache")}, scheduler={"idle_enabled": False}
        )
        since = say_json(conn, {"text": "Cache me.", "id": "cf-1"})
        assert wait_response(conn, since, request_id="cf-1")["status"] == "ok"
        fs.fill()
        since = say_json(conn, {"text": "Cache me.", "id": "cf-2"})
        hit = wait_response(conn, since, request_id="cf-2")
        assert hit["status"] == "ok" and hit["data"]["cached"], hit
        since = say_json(conn, {"text": "Something new to say.", "id": "cf-3"})
        fresh = wait_response(conn, since, request_id="cf-3")
        assert fresh["status"] == "ok" and not fresh["data"]["cached"], fresh
        health = service.reports.health()
        assert health["cache_degraded"] == "disk full" and health["cache_write_errors"] >= 1
        service.stop()
