"""Home Assistant's view of the service, in process: every say answer is one event on
<base>/bridge/event, and the default voice chosen in the select is saved and restored at start."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from tests.support.fake import BASE, FakeConnection, Services, body
from tts_bridge.mqtt import discovery
from tts_bridge.mqtt.client import OutgoingMessage
from tts_bridge.web.server import AudioServer

RESPONSE = f"{BASE}/bridge/response/say"
EVENT = f"{BASE}/bridge/event"
INFO = f"{BASE}/bridge/info"


def _answer(conn: FakeConnection, request_id: str, since: int) -> dict[str, Any]:
    found: dict[str, Any] = body(
        conn.wait_for(
            lambda m: m.topic == RESPONSE and body(m)["id"] == request_id,
            since=since,
            what=f"the answer to {request_id}",
        )
    )
    return found


def _event(conn: FakeConnection, request_id: str, since: int) -> OutgoingMessage:
    return conn.wait_for(
        lambda m: m.topic == EVENT and body(m)["id"] == request_id,
        since=since,
        what=f"the event of {request_id}",
    )


def test_every_say_answer_is_one_event(services: Services) -> None:
    _, conn = services(scheduler={"idle_enabled": False})
    since = conn.mark()
    conn.deliver(f"{BASE}/say/kitchen", json.dumps({"text": "Tea is ready.", "id": "tea"}))
    conn.deliver(f"{BASE}/say/hall", json.dumps({"text": "🎉🍲", "id": "party"}))
    conn.deliver(f"{BASE}/say/hall", json.dumps({"text": "x", "id": "v", "voice": "nobody"}))

    ok, ok_event = _answer(conn, "tea", since), _event(conn, "tea", since)
    assert ok["status"] == "ok", ok
    assert not ok_event.retain
    assert body(ok_event) == {
        "event_type": "ok",
        "id": "tea",
        "target": "kitchen",
        "code": None,
        "error": None,
        "voice": ok["data"]["voice"],
        "tier": ok["data"]["tier"],
        "duration_ms": ok["data"]["duration_ms"],
        # So an automation can play the answer on a media player (the HTTP server is on).
        "url": ok["data"]["url"],
    }
    assert ok["data"]["url"].startswith("http://127.0.0.1:")
    for request_id, code in (("party", "nothing_speakable"), ("v", "unknown_voice")):
        refused, event = _answer(conn, request_id, since), body(_event(conn, request_id, since))
        assert refused["code"] == code, refused
        assert event["url"] is None
        assert event["event_type"] == "error" and event["target"] == "hall"
        assert (event["code"], event["error"]) == (code, refused["error"])

    # An unparseable request has no target of its own in the answer; the event still names it.
    since = conn.mark()
    conn.deliver(f"{BASE}/say/garage", b"{oops")
    refused_message = conn.wait_for(lambda m: m.topic == RESPONSE, since=since)
    event = body(conn.wait_for(lambda m: m.topic == EVENT, since=since))
    assert (event["id"], event["target"]) == (body(refused_message)["id"], "garage")
    assert event["code"] == "invalid_json"
    answers, events = conn.on(RESPONSE), conn.on(EVENT)
    assert len(events) == len(answers) == 4, [body(m) for m in events]


def test_a_redelivered_duplicate_is_answered_again_but_is_not_a_second_event(
    services: Services,
) -> None:
    _, conn = services(scheduler={"idle_enabled": False})
    payload = json.dumps({"text": "Tea is ready.", "id": "dup"})
    since = conn.mark()
    conn.deliver(f"{BASE}/say/kitchen", payload)
    _answer(conn, "dup", since)
    _event(conn, "dup", since)
    since = conn.mark()
    conn.deliver(f"{BASE}/say/kitchen", payload, duplicate=True)
    _answer(conn, "dup", since)
    assert not conn.on(EVENT, since)


def _set_default_voice(conn: FakeConnection, name: str) -> dict[str, Any]:
    since = conn.mark()
    conn.deliver(f"{BASE}/bridge/request/default_voice", json.dumps({"voice": name}))
    found: dict[str, Any] = body(
        conn.wait_for(lambda m: m.topic == f"{BASE}/bridge/response/default_voice", since=since)
    )
    return found


def test_the_chosen_default_voice_is_restored_at_the_next_start(
    services: Services, tmp_path: Path
) -> None:
    service, conn = services(scheduler={"idle_enabled": False})
    answer = _set_default_voice(conn, "heart")
    assert answer["status"] == "ok", answer
    assert answer["data"] == {"default_voice": "heart", "saved": True}
    service.stop()
    # A new process starts from the configured default; the shared test pool must too.
    engines = service.pipeline.synthesizer.engines
    engines.set_default_voice("joe")

    _, conn = services(scheduler={"idle_enabled": False})
    info = body(conn.wait_for(lambda m: m.topic == INFO))
    assert info["default_voice"] == "heart"
    assert engines.default_voice == "heart"
    assert json.loads((tmp_path / "preferences.json").read_text())["default_voice"] == "heart"


def test_a_choice_that_cannot_be_saved_is_used_and_says_so(
    services: Services, tmp_path: Path
) -> None:
    (tmp_path / "preferences.json").mkdir()  # the file cannot be written (even as root)
    _, conn = services(scheduler={"idle_enabled": False})
    since = conn.mark()
    answer = _set_default_voice(conn, "heart")
    assert answer["status"] == "ok", answer
    assert answer["data"] == {"default_voice": "heart", "saved": False}
    info = conn.wait_for(lambda m: m.topic == INFO and body(m)["default_voice"] == "heart", since)
    assert info.retain


def _discovery(conn: FakeConnection) -> dict[str, Any]:
    topic = discovery.discovery_topic("homeassistant", "tts_bridge")
    found: dict[str, Any] = body(conn.wait_for(lambda m: m.topic == topic, what="discovery"))
    return found


def test_discovery_links_the_status_page_while_the_http_server_runs(services: Services) -> None:
    service, conn = services(scheduler={"idle_enabled": False})
    server = next(s for s in service.servers if isinstance(s, AudioServer))
    # http.port is 0 here: the link has the port the server got, known only once it listens.
    assert server.port != 0
    assert _discovery(conn)["dev"]["cu"] == f"http://127.0.0.1:{server.port}/"

    # Home Assistant's birth message brings the same link again.
    since = conn.mark()
    conn.deliver("homeassistant/status", b"online")
    topic = discovery.discovery_topic("homeassistant", "tts_bridge")
    again = body(conn.wait_for(lambda m: m.topic == topic, since=since, what="discovery again"))
    assert again["dev"]["cu"] == f"http://127.0.0.1:{server.port}/"


def test_discovery_has_no_link_without_the_http_server(services: Services) -> None:
    service, conn = services(http={"enabled": False}, scheduler={"idle_enabled": False})
    assert not any(isinstance(s, AudioServer) for s in service.servers)
    assert "cu" not in _discovery(conn)["dev"]


def test_discovery_has_no_link_when_the_http_server_cannot_listen(services: Services) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service, conn = services(http={"port": port}, scheduler={"idle_enabled": False})
        server = next(s for s in service.servers if isinstance(s, AudioServer))
        assert not server.bound
        assert "cu" not in _discovery(conn)["dev"]
