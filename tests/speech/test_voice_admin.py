"""Voices added, changed and removed without a restart: the bridge API on the real service in
process (real voices and pipeline, a fake MQTT connection, the HTTP and Wyoming servers on free
loopback ports), seen by say requests, bridge/info, Home Assistant discovery, Wyoming's describe
and the HTTP voice list; and, end to end, SIGHUP reloading the voices file of a real bridge."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

from tests.support.chattts_tiny import NEEDS_CHATTTS, TinyModels
from tests.support.fake import BASE, FakeConnection, Services, body, hold_worker
from tests.support.harness import BASE_TOPIC, BridgeFactory, ProbeFactory, bridge_api
from tests.support.web import raw_request
from tts_bridge import app
from tts_bridge.bench.localbroker import free_port
from tts_bridge.mqtt.client import OutgoingMessage
from tts_bridge.web.server import AudioServer

DISCOVERY = "homeassistant/device/tts_bridge/config"
DEFAULT_VOICES = {
    "joe": {"engine": "piper", "fast_voice": "heart"},
    "heart": {"engine": "hibari"},
}


def own_service(services: Services, **overrides: Any) -> tuple[app.Service, FakeConnection]:
    """A service with a pool of its own (the changes must not reach other tests' voices), its
    Wyoming server on a free loopback port."""
    wyoming = {"enabled": True, "host": "127.0.0.1", "port": free_port(), "zeroconf": False}
    return services(voices=DEFAULT_VOICES, wyoming=wyoming, **overrides)


def request(conn: FakeConnection, name: str, payload: dict[str, Any]) -> dict[str, Any]:
    since = conn.mark()
    conn.deliver(f"{BASE}/bridge/request/{name}", json.dumps(payload))
    answer = conn.wait_for(
        lambda m: m.topic == f"{BASE}/bridge/response/{name}", since=since, what=f"{name} answer"
    )
    result: dict[str, Any] = body(answer)
    return result


def say(conn: FakeConnection, text: str, voice: str, request_id: str) -> dict[str, Any]:
    since = conn.mark()
    conn.deliver(
        f"{BASE}/say/kitchen", json.dumps({"text": text, "voice": voice, "id": request_id})
    )
    answer = conn.wait_for(
        lambda m: m.topic == f"{BASE}/bridge/response/say" and body(m)["id"] == request_id,
        since=since,
        what=f"the answer to {request_id}",
    )
    result: dict[str, Any] = body(answer)
    return result


def latest(conn: FakeConnection, topic: str, since: int) -> OutgoingMessage:
    return conn.wait_for(lambda m: m.topic == topic, since=since, what=topic)


def select_options(message: OutgoingMessage) -> list[str]:
    components = body(message)["cmps"]
    (select,) = [c for c in components.values() if c["p"] == "select"]
    options: list[str] = select["ops"]
    return options


def wyoming_voices(service: app.Service) -> list[str]:
    port = service.settings.wyoming.port

    async def describe() -> list[str]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            while True:
                event = await client.read_event()
                assert event is not None
                if Info.is_type(event.type):
                    info = Info.from_event(event)
                    return [v.name for v in info.tts[0].voices]

    return asyncio.run(describe())


def http_voices(service: app.Service) -> list[str]:
    port = next(s for s in service.servers if isinstance(s, AudioServer)).port
    status, _, data = raw_request(port, "GET", "/v1/audio/voices")
    assert status == 200
    names: list[str] = json.loads(data)["voices"]
    return names


def file_voices(service: app.Service) -> dict[str, Any]:
    path = service.settings.voices_file
    if not path.exists():
        return {}
    loaded: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))["voices"]
    return loaded


def test_a_voice_added_is_spoken_listed_everywhere_and_kept(services: Services) -> None:
    service, conn = own_service(services)
    since = conn.mark()
    added = request(conn, "voices/add", {"name": "quick_joe", "like": "joe", "speed": 1.4})
    assert added["status"] == "ok", added
    assert added["data"]["voice"]["speed"] == 1.4
    answer = say(conn, "The quick voice speaks.", "quick_joe", "q1")
    assert answer["status"] == "ok", answer
    assert answer["data"]["voice"] == "quick_joe"
    info = latest(conn, f"{BASE}/bridge/info", since)
    assert "quick_joe" in body(info)["voices"]
    assert "quick_joe" in select_options(latest(conn, DISCOVERY, since))
    assert "quick_joe" in wyoming_voices(service)
    assert "quick_joe" in http_voices(service)
    assert file_voices(service)["quick_joe"]["speed"] == 1.4

    updated = request(conn, "voices/update", {"name": "quick_joe", "speed": 0.8})
    assert updated["status"] == "ok", updated
    assert file_voices(service)["quick_joe"]["speed"] == 0.8

    since = conn.mark()
    removed = request(conn, "voices/remove", {"name": "quick_joe"})
    assert removed["status"] == "ok", removed
    assert "quick_joe" not in select_options(latest(conn, DISCOVERY, since))
    assert "quick_joe" not in wyoming_voices(service)
    assert "quick_joe" not in http_voices(service)
    assert "quick_joe" not in file_voices(service)
    gone = say(conn, "Are you there?", "quick_joe", "q2")
    assert gone["status"] == "error" and gone["code"] == "unknown_voice"


@pytest.mark.parametrize(
    ("name", "payload", "code"),
    [
        ("voices/add", {"name": "joe", "like": "heart"}, "voice_exists"),
        ("voices/add", {"name": "x", "like": "nobody"}, "unknown_voice"),
        ("voices/add", {"name": "x", "like": "joe", "speed": 9}, "invalid_voice"),
        ("voices/add", {"name": "x", "like": "joe", "fast_voice": "nobody"}, "invalid_voice"),
        ("voices/add", {"name": "x", "engine": "piper", "model": "missing.onnx"}, "invalid_voice"),
        ("voices/add", {"name": "x"}, "invalid_request"),
        ("voices/add", {"name": "no spaces", "like": "joe"}, "invalid_request"),
        ("voices/add", {"name": "x", "seed": "42"}, "invalid_request"),
        ("voices/remove", {"name": "joe"}, "configured_voice"),
        ("voices/update", {"name": "heart", "speed": 1.1}, "configured_voice"),
        ("voices/remove", {"name": "nobody"}, "unknown_voice"),
        ("voices/update", {"name": "joe"}, "invalid_request"),
    ],
)
def test_bad_changes_are_refused_and_nothing_changes(
    services: Services, name: str, payload: dict[str, Any], code: str
) -> None:
    service, conn = own_service(services)
    before = http_voices(service)
    answer = request(conn, name, payload)
    assert (answer["status"], answer["code"]) == ("error", code), answer
    assert answer["error"]
    assert http_voices(service) == before
    assert file_voices(service) == {}
    assert say(conn, "Still speaking.", "joe", "ok")["status"] == "ok"


def test_the_default_voice_cannot_be_removed(services: Services) -> None:
    service, conn = own_service(services)
    assert request(conn, "voices/add", {"name": "calm", "like": "joe"})["status"] == "ok"
    assert request(conn, "default_voice", {"voice": "calm"})["status"] == "ok"
    answer = request(conn, "voices/remove", {"name": "calm"})
    assert (answer["status"], answer["code"]) == ("error", "invalid_voice")
    assert "default voice" in answer["error"]
    assert "calm" in http_voices(service)
    service.pipeline.synthesizer.engines.set_default_voice("joe")


def test_a_request_in_flight_finishes_on_its_voice(services: Services) -> None:
    service, conn = own_service(
        services, scheduler={"idle_enabled": False, "latency_budget_ms": 600_000}
    )
    assert request(conn, "voices/add", {"name": "brief", "like": "joe"})["status"] == "ok"
    scheduler = service.pipeline.scheduler
    gate = hold_worker(service)
    _wait(lambda: scheduler.depth == 0 and scheduler.active >= 1)
    answers: dict[str, dict[str, Any]] = {}

    def ask() -> None:
        answers["brief"] = say(conn, "Spoken by the voice it started with.", "brief", "f1")

    asker = threading.Thread(target=ask)
    try:
        asker.start()
        # Validated and queued behind the held worker before the voice goes.
        _wait(lambda: scheduler.depth >= 1)
        assert request(conn, "voices/remove", {"name": "brief"})["status"] == "ok"
    finally:
        gate.set()
    asker.join(60)
    assert answers["brief"]["status"] == "ok", answers
    assert answers["brief"]["data"]["voice"] == "brief"


def test_reload_reads_the_voices_file_again(services: Services) -> None:
    service, conn = own_service(services)
    path = service.settings.voices_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump({"voices": {"slow_joe": {"engine": "piper", "speed": 0.7}}}), "utf-8"
    )
    answer = request(conn, "reload", {})
    assert answer["status"] == "ok", answer
    assert "slow_joe" in http_voices(service)
    assert say(conn, "Slowly now.", "slow_joe", "r1")["status"] == "ok"

    path.write_text("voices: [not, a, mapping", "utf-8")
    broken = request(conn, "reload", {})
    assert (broken["status"], broken["code"]) == ("error", "voices_file_error")
    assert "slow_joe" in http_voices(service)  # nothing half-applied


def _wait(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.mark.slow
def test_sighup_reloads_the_voices_of_a_running_bridge(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory, tmp_path: Path
) -> None:
    voices_file = tmp_path / "voices.yaml"
    bridge = bridge_factory(voices_file=str(voices_file))
    probe = probe_factory(f"{BASE_TOPIC}/bridge/#")
    probe.diagnostics = bridge.log_tail
    added = bridge_api(probe, "voices/add", {"name": "bright", "like": "heart"}, timeout=60)
    assert added["status"] == "ok", added
    assert "bright" in yaml.safe_load(voices_file.read_text("utf-8"))["voices"]

    voices_file.write_text(
        yaml.safe_dump({"voices": {"evening": {"engine": "piper", "speed": 0.9}}}), "utf-8"
    )
    since = probe.mark()
    bridge.proc.send_signal(signal.SIGHUP)
    info = probe.wait_for(
        lambda m: m.topic == f"{BASE_TOPIC}/bridge/info" and "evening" in m.json()["voices"],
        60,
        since=since,
        what="bridge/info with the reloaded voice",
    )
    assert "bright" not in info.json()["voices"]
    assert bridge.running


@pytest.mark.slow
@NEEDS_CHATTTS
def test_a_chattts_speaker_from_a_seed(
    services: Services, tiny_models: TinyModels, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(tiny_models.checkpoint(1), models / "chattts")
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump({"models": {"dir": str(models)}}), encoding="utf-8")
    added = subprocess.run(
        [sys.executable, "-m", "tts_bridge", "models", "add", "chattts", str(models / "chattts"),
         "--config", str(config)],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert added.returncode == 0, added.stdout + added.stderr
    service, conn = own_service(services, models={"dir": str(models)})
    answer = request(conn, "voices/add", {"name": "xiaoyu", "seed": 42, "model": "chattts"})
    assert answer["status"] == "ok", answer
    assert "spk_emb" not in answer["data"]["voice"]  # long: named by its SHA-256
    stored = file_voices(service)["xiaoyu"]
    assert stored["engine"] == "chattts"
    assert len(stored["spk_emb_sha256"]) == 64
    spoken = say(conn, "你好，客厅的灯开着。", "xiaoyu", "c1")
    assert spoken["status"] == "ok", spoken
    assert spoken["data"]["voice"] == "xiaoyu"
    assert "xiaoyu" in wyoming_voices(service)
