"""Health that tells degraded from broken: the bridge's /health report, and the container's
health check (exit 0 while any door serves, naming what is off; 1 only when nothing serves)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.harness import REPO_ROOT, MqttProbe
from tests.support.web import raw_request
from tts_bridge.bench.localbroker import LocalBroker, free_port
from tts_bridge.cli.doctor import container_health
from tts_bridge.system.degraded import Degraded
from tts_bridge.web.audio_store import AudioStore
from tts_bridge.web.server import AudioServer
from tts_bridge.web.settings import HttpSettings


def test_degraded_report_merges_start_up_parts_and_live_conditions() -> None:
    degraded = Degraded()
    assert degraded.report({"mqtt": None}) == {"status": "ok", "degraded": {}}
    degraded.set("cache", "not writable")
    report = degraded.report({"mqtt": "not connected", "journal": None})
    assert report == {
        "status": "degraded",
        "degraded": {"cache": "not writable", "mqtt": "not connected"},
    }
    degraded.clear("cache")
    assert degraded.report()["status"] == "ok"


@pytest.fixture
def audio_server(tmp_path: Path) -> Iterator[AudioServer]:
    store = AudioStore(tmp_path / "audio", tmp_path / "http.key", 10**7)
    server = AudioServer(HttpSettings(host="127.0.0.1", port=0), store)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_health_route_serves_the_report(audio_server: AudioServer) -> None:
    status, _, _ = raw_request(audio_server.port, "GET", "/health")
    assert status == 404, "no report without a service"
    audio_server.health_report = lambda: {"status": "degraded", "degraded": {"cache": "x"}}
    status, headers, body = raw_request(audio_server.port, "GET", "/health")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == {"status": "degraded", "degraded": {"cache": "x"}}


def health_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTS_BRIDGE_")}
    return {**env, **{f"TTS_BRIDGE_{k.upper()}": v for k, v in settings.items()}}


def test_the_bridge_report_decides_when_http_answers(
    audio_server: AudioServer, capsys: pytest.CaptureFixture[str]
) -> None:
    env = health_env(http__port=str(audio_server.port), mqtt__port=str(free_port()))
    audio_server.health_report = lambda: {"status": "ok", "degraded": {}}
    assert container_health(env, timeout_s=2) == 0
    assert capsys.readouterr().out.strip() == "healthy: serving"
    audio_server.health_report = lambda: {
        "status": "degraded",
        "degraded": {"cache": "/data/cache not writable; using a temporary folder"},
    }
    assert container_health(env, timeout_s=2) == 0
    assert capsys.readouterr().out.strip() == (
        "degraded: cache: /data/cache not writable; using a temporary folder"
    )


def wyoming_stand_in() -> tuple[int, threading.Event]:
    """A server that answers describe with an info event, as the bridge's Wyoming server does."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        with listener:
            listener.settimeout(30)
            while not done.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    return
                with conn:
                    conn.makefile("rb").readline()
                    conn.sendall(b'{"type": "info", "data": {"tts": []}}\n')

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1]), done


def test_without_http_the_other_doors_decide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    http_port, wyoming_down = free_port(), free_port()
    with LocalBroker(tmp_path / "broker") as broker:
        env = health_env(
            http__port=str(http_port), wyoming__port=str(wyoming_down), mqtt__port=str(broker.port)
        )
        assert container_health(env, timeout_s=2) == 1
        out = capsys.readouterr().out
        assert out.startswith("unhealthy: http: ") and "mqtt: bridge state is not published" in out

        wyoming_port, done = wyoming_stand_in()
        env["TTS_BRIDGE_WYOMING__PORT"] = str(wyoming_port)
        try:
            assert container_health(env, timeout_s=2) == 0
        finally:
            done.set()
        out = capsys.readouterr().out
        assert out.startswith("degraded: http: ") and "mqtt: bridge state is not published" in out

        with MqttProbe(broker.host, broker.port) as probe:
            probe.publish("tts_bridge/bridge/state", b'{"state": "online"}', retain=True)
        only_mqtt = health_env(
            http__enabled="false", wyoming__enabled="false", mqtt__port=str(broker.port)
        )
        assert container_health(only_mqtt, timeout_s=2) == 0
        assert capsys.readouterr().out.strip() == "healthy: serving"


def test_a_bad_configuration_is_unhealthy_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tts_bridge.cli.doctor import container_health as c; raise SystemExit(c())",
        ],
        env={**health_env(mqtt__port="0"), "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout.startswith("unhealthy: invalid configuration: TTS_BRIDGE_MQTT__PORT")
