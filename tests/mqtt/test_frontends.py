"""Hermes, the bridge API, reports (info, health, discovery), streaming and the broker's size
limit, in process: the real service on a fake connection (see tests/support/fake.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.fake import BASE, FakeConnection, Services, body, props
from tts_bridge.mqtt.client import OutgoingMessage

RESPONSE = f"{BASE}/bridge/response/say"
INFO = f"{BASE}/bridge/info"
STATE = f"{BASE}/bridge/state"
HEALTH = f"{BASE}/bridge/health"
DISCOVERY = "homeassistant/device/tts_bridge/config"


def api(conn: FakeConnection, name: str, payload: bytes | str = b"", **kw: Any) -> dict[str, Any]:
    since = conn.mark()
    conn.deliver(f"{BASE}/bridge/request/{name}", payload, **kw)
    answer = conn.wait_for(
        lambda m: (
            m.topic.startswith(f"{BASE}/bridge/response/")
            and m.topic not in {RESPONSE, f"{BASE}/bridge/response/health"}
        ),
        since=since,
        what=f"the answer to {name}",
    )
    found: dict[str, Any] = body(answer)
    found["_topic"] = answer.topic
    return found


def answer_for(conn: FakeConnection, request_id: str, since: int = 0) -> dict[str, Any]:
    found: dict[str, Any] = body(
        conn.wait_for(
            lambda m: m.topic == RESPONSE and body(m)["id"] == request_id,
            since=since,
            what=f"the answer to {request_id}",
        )
    )
    return found


# -- lifecycle and reports ---------------------------------------------------------------------


def test_start_subscribes_for_every_front_end_and_publishes_state_info_discovery_health(
    services: Services,
) -> None:
    _, conn = services(
        hermes={"enabled": True},
        limits={"max_text_chars": 321, "max_payload_bytes": 4096},
    )
    assert conn.subscriptions == [
        f"{BASE}/say",
        f"{BASE}/say/+",
        f"{BASE}/bridge/request/#",
        "homeassistant/status",
        "hermes/tts/say",
        "hermes/audioServer/+/playFinished",
    ]
    topics = [m.topic for m in conn.published]
    assert topics[:4] == [STATE, INFO, DISCOVERY, HEALTH], topics
    state, info_message = conn.published[0], conn.published[1]
    assert state.retain and body(state) == {"state": "online"}
    assert info_message.retain, "bridge/info must be retained"
    info = body(info_message)
    assert isinstance(info["version"], str) and info["version"], info
    voices = info["voices"]
    assert {"joe", "heart"} <= set(voices), voices
    assert voices["joe"]["sample_rate"] == 22050 and voices["heart"]["sample_rate"] == 24000
    assert all(isinstance(v["languages"], list) and v["languages"] for v in voices.values())
    assert info["default_voice"] == "joe", info
    engines = info["engines"]
    assert any("piper" in str(e) for e in engines), engines
    assert any("hibari" in str(e) for e in engines), engines
    assert info["limits"]["max_text_chars"] == 321, info
    assert info["limits"]["max_payload_bytes"] == 4096, info
    assert info["topics"]["say"] == f"{BASE}/say/+", info
    assert conn.published[3].retain and "tier_in_use" in body(conn.published[3])


def test_shared_subscriptions_with_a_share_group(services: Services) -> None:
    _, conn = services(mqtt={"share_group": "tts"})
    assert conn.subscriptions[:3] == [
        f"$share/tts/{BASE}/say",
        f"$share/tts/{BASE}/say/+",
        f"$share/tts/{BASE}/bridge/request/#",
    ]


def test_stop_says_offline_and_a_reconnect_says_online_again(services: Services) -> None:
    service, conn = services()
    since = conn.mark()
    conn.connect()  # the broker came back
    assert [m.topic for m in conn.published[since:]][:2] == [STATE, INFO]
    service.stop()
    assert conn.stopped and conn.final is not None
    assert conn.final.retain and body(conn.final) == {"state": "offline"}


def test_messages_on_unknown_topics_are_acked_and_ignored(services: Services) -> None:
    _, conn = services()
    since = conn.mark()
    message = conn.deliver("somewhere/else", b"hello")
    assert (message.mid, 1) in conn.acks
    time.sleep(0.1)
    assert conn.published[since:] == []


def test_home_assistant_discovery(services: Services) -> None:
    _, conn = services(homeassistant={"targets": ["kitchen", "hall"]})
    config_message = conn.wait_for(lambda m: m.topic == DISCOVERY, what="discovery")
    assert config_message.retain
    config = body(config_message)
    assert config["dev"]["name"] == "TTS Bridge" and config["o"]["name"] == "tts_bridge"
    components = config["cmps"]
    notify = {k: v for k, v in components.items() if v["p"] == "notify"}
    assert {v["cmd_t"] for v in notify.values()} == {f"{BASE}/say/kitchen", f"{BASE}/say/hall"}
    ids = [v["uniq_id"] for v in components.values()]
    assert len(ids) == len(set(ids))
    platforms = sorted(v["p"] for v in components.values())
    assert platforms.count("sensor") >= 4 and "select" in platforms
    # The notify command template's output is what the bridge receives: it must be spoken.
    since = conn.mark()
    conn.deliver(f"{BASE}/say/kitchen", json.dumps({"text": 'He said "hi" \\ bye', "id": "n"}))
    assert answer_for(conn, "n", since)["status"] == "ok"
    # Home Assistant restarts: its birth message makes the bridge publish discovery again.
    since = conn.mark()
    birth = conn.deliver("homeassistant/status", "online")
    assert (birth.mid, 1) in conn.acks
    again = conn.wait_for(lambda m: m.topic == DISCOVERY, since=since, what="discovery again")
    assert body(again) == config and again.retain
    since = conn.mark()
    conn.deliver("homeassistant/status", "offline")
    time.sleep(0.1)
    assert not conn.on(DISCOVERY, since), "only the birth message re-sends discovery"
    # The select changes the default voice; info follows.
    since = conn.mark()
    conn.deliver(f"{BASE}/bridge/request/default_voice", json.dumps({"voice": "heart"}))
    info = conn.wait_for(
        lambda m: m.topic == INFO and body(m)["default_voice"] == "heart", since=since
    )
    assert info.retain


def test_discovery_turned_off_removes_the_retained_config(services: Services) -> None:
    _, conn = services(homeassistant={"discovery": False})
    removal = conn.wait_for(lambda m: m.topic == DISCOVERY, what="the removal")
    assert removal.retain and removal.payload == b""
    assert "homeassistant/status" not in conn.subscriptions


def test_periodic_health(services: Services) -> None:
    _, conn = services(scheduler={"health_interval_s": 1})
    since = conn.mark()
    health = conn.wait_for(lambda m: m.topic == HEALTH, 5, since=since, what="periodic health")
    data = body(health)
    assert health.retain
    for key in ("uptime_s", "queue_depth", "answers", "cache_hit_rate", "tier_in_use", "rss_mb"):
        assert key in data, data


# -- the bridge API ----------------------------------------------------------------------------


def test_bridge_api(services: Services) -> None:
    _, conn = services(scheduler={"idle_enabled": False})
    health = api(conn, "health_check", json.dumps({"transaction": 17}))
    assert health["status"] == "ok" and health["transaction"] == 17
    assert health["data"]["healthy"] is True and "queue_depth" in health["data"]
    assert health["_topic"] == f"{BASE}/bridge/response/health_check"
    voices = api(conn, "voices")
    assert set(voices["data"]) == {"joe", "heart", "xiaobei"}
    since = conn.mark()
    conn.deliver(f"{BASE}/say/api", json.dumps({"text": "Fill the cache.", "id": "fill"}))
    answer_for(conn, "fill", since)
    stats = api(conn, "cache/stats", json.dumps({"transaction": "a"}))
    assert stats["data"]["entries"] == 1 and stats["transaction"] == "a"
    cleared = api(conn, "cache/clear")
    assert cleared["status"] == "ok" and cleared["_topic"] == f"{BASE}/bridge/response/cache/clear"
    assert cleared["data"]["removed"] == 1, "the one sentence, not the cache's own counters"
    assert api(conn, "cache/stats")["data"]["entries"] == 0
    queued = api(conn, "prerender", json.dumps({"phrases": ["One. Two."], "transaction": 1}))
    assert queued["data"]["queued_sentences"] == 2 and queued["transaction"] == 1
    plain = api(conn, "prerender", "Three.")
    assert plain["status"] == "ok" and plain["data"]["queued_sentences"] == 1, plain
    unknown = api(conn, "reboot_the_house", json.dumps({"transaction": "x"}))
    assert unknown["status"] == "error" and unknown["transaction"] == "x"
    assert unknown["code"] == "unknown_request" and "health_check" in unknown["error"]
    # Answered where the README says a client waits for it: on response/<name>.
    assert unknown["_topic"] == f"{BASE}/bridge/response/reboot_the_house"
    # A name that cannot be echoed safely (or whose topic has say answers) gets response/error.
    for odd in ("say", "a" * 200, "x//y", "$SYS", "a/b/c/d/e"):
        refused = api(conn, odd)
        assert refused["code"] == "unknown_request", refused
        assert refused["_topic"] == f"{BASE}/bridge/response/error", (odd, refused)
    bad = api(conn, "cache/stats", b"{oops")
    assert bad["status"] == "error" and bad["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("name", "payload", "code"),
    [
        ("prerender", {"phrases": 5}, "invalid_request"),
        ("prerender", {"phrases": []}, "invalid_request"),
        ("prerender", {"phrases": ["Hi."], "voice": 3}, "invalid_request"),
        ("prerender", {"phrases": ["Hi."], "voice": "nobody"}, "unknown_voice"),
        ("default_voice", {"voice": 3}, "invalid_request"),
        ("default_voice", {"voice": "nobody"}, "unknown_voice"),
        ("health_check", {"transaction": [1]}, "invalid_request"),
        ("health_check", {"transaction": True}, "invalid_request"),
    ],
)
def test_bridge_api_bad_arguments(
    services: Services, name: str, payload: dict[str, Any], code: str
) -> None:
    _, conn = services(scheduler={"idle_enabled": False})
    answer = api(conn, name, json.dumps(payload))
    assert (answer["status"], answer["code"]) == ("error", code), answer
    assert answer["error"], answer
    assert answer["_topic"] == f"{BASE}/bridge/response/{name}"
    assert "transaction" not in answer or answer["transaction"] is None, answer
    # Still serving.
    assert api(conn, "health_check")["status"] == "ok"


def test_bridge_api_answers_on_the_response_topic_too(services: Services) -> None:
    _, conn = services()
    since = conn.mark()
    conn.deliver(
        f"{BASE}/bridge/request/voices", b"", response_topic="me/reply", correlation_data=b"c1"
    )
    reply = conn.wait_for(lambda m: m.topic == "me/reply", since=since)
    assert reply.content_type == "application/json" and reply.correlation_data == b"c1"
    assert set(body(reply)["data"]) == {"joe", "heart", "xiaobei"}
    assert conn.on(f"{BASE}/bridge/response/voices", since), "the shared answer is sent too"


# -- Rhasspy Hermes ----------------------------------------------------------------------------


def test_hermes_round_trip(services: Services) -> None:
    service, conn = services(hermes={"enabled": True, "finish_margin_s": 0.5})
    say = {"text": "Turning on the lights.", "siteId": "livingroom", "id": "h1", "sessionId": "s1"}
    message = conn.deliver("hermes/tts/say", json.dumps(say))
    assert (message.mid, 1) in conn.acks, "Hermes messages are acked at once"
    played = conn.wait_for(lambda m: m.topic == "hermes/audioServer/livingroom/playBytes/h1")
    assert played.payload[:4] == b"RIFF"
    time.sleep(0.3)
    assert not conn.on("hermes/tts/sayFinished")
    conn.deliver("hermes/audioServer/livingroom/playFinished", json.dumps({"id": "h1"}))
    finished = body(conn.wait_for(lambda m: m.topic == "hermes/tts/sayFinished"))
    assert (finished["id"], finished["siteId"], finished["sessionId"]) == ("h1", "livingroom", "s1")
    # No playFinished: sayFinished after the audio's duration plus the margin.
    since = conn.mark()
    started = time.monotonic()
    conn.deliver("hermes/tts/say", json.dumps({"text": "Good night.", "siteId": "bed", "id": "h2"}))
    conn.wait_for(lambda m: m.topic == "hermes/audioServer/bed/playBytes/h2", since=since)
    done = conn.wait_for(
        lambda m: m.topic == "hermes/tts/sayFinished" and body(m)["id"] == "h2", since=since
    )
    assert time.monotonic() - started > 0.5 and body(done)["siteId"] == "bed"
    # Bad input: an error on hermes/error/tts, and the bridge keeps serving.
    since = conn.mark()
    conn.deliver("hermes/tts/say", b"{not json")
    error = body(conn.wait_for(lambda m: m.topic == "hermes/error/tts", since=since))
    assert error["error"]
    conn.deliver("hermes/tts/say", json.dumps({"text": "🎉", "siteId": "bed", "id": "h3"}))
    error = body(
        conn.wait_for(
            lambda m: m.topic == "hermes/error/tts" and body(m).get("context") == "h3",
            since=since,
        )
    )
    assert error["siteId"] == "bed"
    conn.deliver("hermes/tts/say", json.dumps({"text": "Still here.", "siteId": "bed", "id": "h4"}))
    conn.wait_for(lambda m: m.topic == "hermes/audioServer/bed/playBytes/h4", since=since)
    answers = service.reports.health()["answers"]  # counted before the audio goes out
    assert answers["error"] == 2 and answers["quality"] + answers["fast"] == 3, answers
    # Hermes answers never go to the say response topic.
    assert not conn.on(RESPONSE)


def test_hermes_unknown_language_and_volume(services: Services) -> None:
    _, conn = services(hermes={"enabled": True, "finish_margin_s": 0.1})
    conn.deliver(
        "hermes/tts/say", json.dumps({"text": "Hello.", "siteId": "a", "id": "l1", "lang": "xx"})
    )
    error = body(conn.wait_for(lambda m: m.topic == "hermes/error/tts"))
    assert error["context"] == "l1" and error["siteId"] == "a" and error["error"], error
    since = conn.mark()
    conn.deliver("hermes/tts/say", json.dumps({"text": "Quiet.", "siteId": "a", "id": "v1"}))
    loud = conn.wait_for(lambda m: m.topic.endswith("/playBytes/v1"), since=since)
    conn.deliver(
        "hermes/tts/say",
        json.dumps({"text": "Quiet.", "siteId": "a", "id": "v2", "volume": 0.25}),
    )
    quiet = conn.wait_for(lambda m: m.topic.endswith("/playBytes/v2"), since=since)
    assert len(quiet.payload) == len(loud.payload) and quiet.payload != loud.payload


def test_hermes_is_off_unless_enabled(services: Services) -> None:
    _, conn = services()
    assert not [t for t in conn.subscriptions if t.startswith("hermes/")]
    since = conn.mark()
    message = conn.deliver("hermes/tts/say", json.dumps({"text": "Hi.", "id": "x"}))
    assert (message.mid, 1) in conn.acks
    time.sleep(0.2)
    assert not conn.published[since:]


# -- streaming and the broker's size limit ---------------------------------------------------------


def test_streaming_sends_each_sentence_in_order(services: Services) -> None:
    _, conn = services(scheduler={"idle_enabled": False})
    text = " ".join(f"This is sentence number {n} of the announcement." for n in range(1, 7))
    since = conn.mark()
    conn.deliver(
        f"{BASE}/say/hall", json.dumps({"text": text, "id": "s1", "stream": True, "cache": False})
    )
    answer = answer_for(conn, "s1", since)
    assert answer["status"] == "ok" and answer["data"]["stream"] is True
    chunks = conn.on(f"{BASE}/audio/hall/stream", since)
    count = len(chunks)
    assert [props(c)["seq"] for c in chunks] == [str(i) for i in range(count)]
    assert [props(c)["last"] for c in chunks] == ["false"] * (count - 1) + ["true"]
    # Each sentence in order, in one or more parts (Piper sends a sentence in windows).
    sentences = [int(props(c)["sentence"]) for c in chunks]
    assert sentences == sorted(sentences) and set(sentences) == set(range(6))
    assert all(props(c)["id"] == "s1" and c.payload[:4] == b"RIFF" for c in chunks)
    assert all(c.content_type == "audio/wav" and c.expiry_s for c in chunks)
    assert not conn.on(f"{BASE}/audio/hall", since)
    # Each sentence went out when it was ready, not all at the end: the first chunk was
    # published well before the last one (six Piper sentences take about a second here).
    spread = conn.time_of(chunks[-1]) - conn.time_of(chunks[0])
    assert spread > 0.2, f"chunks published within {spread:.3f} s: not streamed"
    # And all of them before the JSON answer.
    answer_index = next(
        i for i, m in enumerate(conn.published) if m.topic == RESPONSE and body(m)["id"] == "s1"
    )
    assert conn.published.index(chunks[-1]) < answer_index


def _stream(conn: FakeConnection, since: int, target: str) -> list[OutgoingMessage]:
    return conn.on(f"{BASE}/audio/{target}/stream", since)


def test_audio_larger_than_the_broker_allows(services: Services) -> None:
    _, conn = services(packet_limit=150_000)
    since = conn.mark()
    # About 1.5 s (66 kB) per sentence, 200 kB for the whole message.
    text = "The first sentence is here. The second one follows. The third one ends it."
    conn.deliver(f"{BASE}/say/rel", json.dumps({"text": text, "id": "big"}))
    answer = answer_for(conn, "big", since)
    assert answer["status"] == "ok" and answer["data"]["stream"] is True, answer
    assert answer["data"]["bytes"] > 150_000, answer
    chunks = _stream(conn, since, "rel")
    assert [props(c)["seq"] for c in chunks] == ["0", "1", "2"]
    assert [props(c)["last"] for c in chunks] == ["false", "false", "true"]
    assert not conn.on(f"{BASE}/audio/rel", since)
    huge = " ".join(["and then it went on"] * 40) + "."
    conn.deliver(f"{BASE}/say/rel", json.dumps({"text": huge, "id": "too-big", "cache": False}))
    refused = answer_for(conn, "too-big", since)
    assert refused["status"] == "error" and refused["code"] == "audio_too_large", refused
    assert not [m for m in conn.published[since:] if props(m).get("id") == "too-big"]
    conn.deliver(f"{BASE}/say/after", json.dumps({"text": "Still here.", "id": "after"}))
    assert answer_for(conn, "after", since)["status"] == "ok"
    assert conn.oversized == [], "nothing over the broker's limit was published"


def test_audio_too_big_for_the_response_topic_is_not_sent_there(services: Services) -> None:
    _, conn = services(packet_limit=150_000)
    since = conn.mark()
    text = "The first sentence is here. The second one follows. The third one ends it."
    conn.deliver(
        f"{BASE}/say/rel",
        json.dumps({"text": text, "id": "big-reply"}),
        response_topic="me/reply",
        correlation_data=b"c",
    )
    assert answer_for(conn, "big-reply", since)["status"] == "ok"
    assert not conn.on("me/reply", since)
    assert conn.oversized == []
