"""The add-on's start: settings from the options and the Supervisor, one line for each thing that
fails, and the Wyoming server announced once it listens (a real broker and a stand-in
Supervisor on loopback)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import MqttProbe
from tests.support.supervisor import TOKEN, FakeSupervisor
from tts_bridge.addon import start
from tts_bridge.addon.supervisor import SupervisorClient
from tts_bridge.bench.localbroker import LocalBroker, free_port
from tts_bridge.config import Settings

DEFAULTS = {"default_voice": "joe", "voices": [], "targets": ["default"], "phrases": []}


def write_options(tmp_path: Path, **options: Any) -> Path:
    path = tmp_path / "data" / "options.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**DEFAULTS, "log_level": "info", **options}), encoding="utf-8")
    return path


def settings_for(supervisor: FakeSupervisor, tmp_path: Path, options: Path) -> Settings:
    client = SupervisorClient(TOKEN, supervisor.url, timeout_s=2)
    return start.addon_settings(
        client, options, data_dir=tmp_path / "data", share_dir=tmp_path / "share"
    )


def test_the_broker_and_audio_url_come_from_the_supervisor(tmp_path: Path) -> None:
    mqtt = {"host": "core-mosquitto", "port": 1883, "username": "addons", "password": "pw"}
    with FakeSupervisor(mqtt=mqtt, network={"10201/tcp": 8201}) as supervisor:
        settings = settings_for(supervisor, tmp_path, write_options(tmp_path))
    assert (settings.mqtt.host, settings.mqtt.port) == ("core-mosquitto", 1883)
    assert (settings.mqtt.username, settings.mqtt.password) == ("addons", "pw")
    assert settings.http.base_url == "http://192.0.2.10:8201"
    assert settings.cache.dir == tmp_path / "data" / "cache"


def test_a_broker_in_the_options_is_not_asked_for(tmp_path: Path) -> None:
    options = write_options(tmp_path, mqtt_host="nas", audio_url_base="http://h:1")
    with FakeSupervisor(mqtt={"host": "core-mosquitto", "port": 1883}) as supervisor:
        settings = settings_for(supervisor, tmp_path, options)
        paths = [r.path for r in supervisor.state.requests]
    assert settings.mqtt.host == "nas"
    assert paths == [], "nothing to ask"


def test_no_mqtt_service_is_one_line_and_the_rest_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeSupervisor(mqtt=None) as supervisor:
        settings = settings_for(supervisor, tmp_path, write_options(tmp_path))
    assert settings.mqtt.host == "127.0.0.1"
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "install the Mosquitto broker add-on" in lines[0].getMessage()


def test_a_supervisor_that_does_not_answer_is_one_line_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = SupervisorClient(TOKEN, f"http://127.0.0.1:{free_port()}", timeout_s=2)
    settings = start.addon_settings(
        client, write_options(tmp_path), tmp_path / "data", tmp_path / "share"
    )
    assert settings.default_voice == "joe"
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(messages) == 2
    assert "Cannot ask the Supervisor for the MQTT broker" in messages[0]
    assert "Cannot learn the host's address" in messages[1]
    assert not start.announce(client, settings, "abc-tts-bridge")
    assert "add it by hand: Wyoming Protocol, host abc-tts-bridge, port 10200" in (
        caplog.records[-1].getMessage()
    )


def test_bad_options_are_one_line_and_the_defaults_serve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeSupervisor(mqtt=None) as supervisor:
        options = write_options(tmp_path, default_voice="nobody")
        settings = settings_for(supervisor, tmp_path, options)
        assert settings.default_voice == "joe"
        assert any(
            "options cannot be used" in r.getMessage() and "nobody" in r.getMessage()
            for r in caplog.records
        )
        options.write_text("{", encoding="utf-8")
        assert settings_for(supervisor, tmp_path, options).default_voice == "joe"
        assert any("are not JSON" in r.getMessage() for r in caplog.records)


def test_the_addon_runs_and_announces_its_wyoming_server(tmp_path: Path) -> None:
    with (
        LocalBroker(tmp_path / "broker") as broker,
        FakeSupervisor(mqtt={"host": broker.host, "port": broker.port}) as supervisor,
    ):
        settings = settings_for(supervisor, tmp_path, write_options(tmp_path))
        settings.wyoming.port = free_port()
        settings.http.port = 0
        stop = threading.Event()
        done: list[int] = []
        runner = threading.Thread(
            target=lambda: done.append(
                start.run(settings, SupervisorClient(TOKEN, supervisor.url), stop)
            )
        )
        with MqttProbe(broker.host, broker.port) as probe:
            probe.subscribe("tts_bridge/bridge/state")
            runner.start()
            try:
                probe.wait_for(lambda m: b"online" in m.payload, 60)
                deadline = time.monotonic() + 30
                while not supervisor.state.discovery() and time.monotonic() < deadline:
                    time.sleep(0.1)
            finally:
                stop.set()
                runner.join(60)
        (message,) = supervisor.state.discovery()
        assert message["service"] == "wyoming"
        assert message["config"]["uri"].endswith(f":{settings.wyoming.port}")
        assert message["config"]["uri"].startswith("tcp://")
        assert done == [0]
