"""`doctor`: each check against real things (a private mosquitto, the bundled voices, tmp dirs).

The broker tests use mosquitto's own password file (made with ``mosquitto_passwd``), so the
CONNACK reason the checklist shows is the one a user's broker would send.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.harness import BridgeFactory, MqttProbe
from tts_bridge.bench.localbroker import LocalBroker, free_port
from tts_bridge.cli.doctor import (
    Status,
    check_broker,
    check_cache,
    check_disk,
    check_plan,
    check_voice,
    container_health,
    format_result,
    run_doctor,
)
from tts_bridge.config import Settings, load_settings
from tts_bridge.speech.cache import CacheKey, SentenceCache
from tts_bridge.system.hardware import Hardware, detect_hardware
from tts_bridge.system.threads import plan_threads

STATUSES = ("PASS", "WARN", "FAIL")
USER = "speaker"
PASSWORD = "correct horse"


def make_settings(tmp_path: Path, port: int, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "mqtt": {"host": "127.0.0.1", "port": port},
        "cache": {"dir": str(tmp_path / "cache"), "max_mb": 64},
        "models": {"dir": str(tmp_path / "models")},
    }
    for section, values in overrides.items():
        if isinstance(values, dict) and isinstance(base.get(section), dict):
            base[section] = {**base[section], **values}
        else:
            base[section] = values
    # environ={}: a developer's TTS_BRIDGE_* variables must not change what is tested.
    return load_settings(None, base, environ={})


def checklist(output: str) -> dict[str, tuple[str, str]]:
    """The checklist's lines as {check name: (status, detail)}."""
    found = {}
    for line in output.splitlines():
        status = line[:4]
        if status in STATUSES:
            name, _, detail = line[6:].partition("  ")
            found[name.strip()] = (status, detail.strip())
    return found


def two_core_hardware() -> Hardware:
    return Hardware(
        architecture="x86_64",
        logical_cpus=2,
        usable_cpus=2,
        cpu_quota=None,
        memory_total_bytes=4 << 30,
        memory_limit_bytes=None,
        memory_available_bytes=3 << 30,
        board_model=None,
        cpu_model="test CPU",
    )


@pytest.fixture
def password_broker(tmp_path: Path) -> Any:
    """A mosquitto that refuses anonymous clients and knows one user, ``speaker``."""
    passwd = shutil.which("mosquitto_passwd")
    if passwd is None:
        pytest.skip("mosquitto_passwd is not installed (Debian package mosquitto)")
    password_file = tmp_path / "passwords"
    subprocess.run([passwd, "-c", "-b", str(password_file), USER, PASSWORD], check=True)
    os.chmod(password_file, 0o600)
    broker = LocalBroker(
        tmp_path / "broker",
        extra_config=["allow_anonymous false", f"password_file {password_file}"],
    )
    with broker:
        yield broker


# -- the whole checklist ---------------------------------------------------------------------


@pytest.mark.slow
def test_fresh_install_passes_every_check(tmp_path: Path, broker: LocalBroker) -> None:
    settings = make_settings(tmp_path, broker.port)
    hardware = detect_hardware()
    plan = plan_threads(hardware)
    out = io.StringIO()

    code = run_doctor(settings, plan, out, hardware=hardware)

    text = out.getvalue()
    lines = checklist(text)
    assert code == 0, text
    assert list(lines) == [
        "hardware",
        "thread plan",
        "broker",
        "cache",
        "disk",
        "voice joe",
        "timing joe",
        "voice heart",
        "timing heart",
        "voice xiaobei",
        "timing xiaobei",
    ], text
    # The Chinese voice is slower than real time on a busy 2-core machine (a warning, not a
    # failure); its speed is the bench's to show.
    statuses = {status for name, (status, _) in lines.items() if name != "timing xiaobei"}
    assert statuses == {"PASS"}, text
    assert lines["timing xiaobei"][0] in ("PASS", "WARN"), text
    assert "'前门开着。'" in lines["timing xiaobei"][1]
    assert plan.describe()[0] in text
    assert all(line in text for line in plan.describe()[1:])
    assert "connected (MQTT 5)" in lines["broker"][1]
    assert "writable; 0 sentences" in lines["cache"][1]
    assert "piper:en_US-joe-medium:" in lines["voice joe"][1]
    assert "(default)" in lines["voice joe"][1]
    for voice in ("joe", "heart"):
        assert "'The front door is open.'" in lines[f"timing {voice}"][1]
        assert "RTF 0." in lines[f"timing {voice}"][1]
    assert "all 11 checks passed" in text.rstrip().splitlines()[-1]
    assert (tmp_path / "cache").is_dir(), "doctor creates the cache folder as the bridge would"


def test_broker_not_listening_fails_with_exit_code_1(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    settings = make_settings(
        tmp_path, port, voices={"heart": {"engine": "hibari"}}, default_voice="heart"
    )
    out = io.StringIO()

    code = run_doctor(settings, plan_threads(two_core_hardware()), out)

    text = out.getvalue()
    assert code == 1, text
    status, detail = checklist(text)["broker"]
    assert status == "FAIL"
    assert f"mqtt://127.0.0.1:{port}" in detail
    assert "connection refused" in detail
    assert "1 of 7 checks FAILED" in text
    # The rest of the checklist still runs: a dead broker must not hide a broken voice.
    assert checklist(text)["timing heart"][0] == "PASS"


# -- the broker ------------------------------------------------------------------------------


def test_wrong_password_names_the_connack_reason(
    tmp_path: Path, password_broker: LocalBroker
) -> None:
    settings = make_settings(
        tmp_path, password_broker.port, mqtt={"username": USER, "password": "wrong"}
    )

    result = check_broker(settings.mqtt)

    assert result.status is Status.FAIL
    line = format_result(result)
    assert line.startswith("FAIL  broker")
    assert "not authorized" in line.lower()
    assert "check mqtt.username and mqtt.password" in line
    assert "wrong" not in line, "the password must never be shown"


def test_anonymous_client_refused_by_a_password_broker(
    tmp_path: Path, password_broker: LocalBroker
) -> None:
    result = check_broker(make_settings(tmp_path, password_broker.port).mqtt)

    assert result.status is Status.FAIL
    assert "anonymously" in result.detail
    assert "not authorized" in result.detail.lower()


def test_right_password_passes(tmp_path: Path, password_broker: LocalBroker) -> None:
    settings = make_settings(
        tmp_path, password_broker.port, mqtt={"username": USER, "password": PASSWORD}
    )

    result = check_broker(settings.mqtt)

    assert result.status is Status.PASS, result
    assert f"as {USER!r}: connected (MQTT 5)" in result.detail
    assert PASSWORD not in format_result(result)


def test_broker_check_reports_the_bridge_state(tmp_path: Path, broker: LocalBroker) -> None:
    settings = make_settings(tmp_path, broker.port)
    assert "no bridge has connected yet" in check_broker(settings.mqtt).detail
    with MqttProbe(broker.host, broker.port) as probe:
        probe.publish("tts_bridge/bridge/state", b'{"state": "offline"}', retain=True)

    result = check_broker(settings.mqtt)

    assert result.status is Status.PASS
    assert result.detail.endswith("bridge offline")


# -- the container health check --------------------------------------------------------------


@pytest.mark.slow
def _no_servers_to_ask() -> dict[str, str]:
    """HTTP and Wyoming ports nobody listens on, so the health check goes to the broker (and a
    bridge running on this machine's default ports is not asked instead)."""
    return {"TTS_BRIDGE_HTTP__PORT": str(free_port()), "TTS_BRIDGE_WYOMING__PORT": str(free_port())}


def test_container_health_follows_the_real_bridge(
    tmp_path: Path, broker: LocalBroker, bridge_factory: BridgeFactory
) -> None:
    # Settings come as the container passes them: a config file named by TTS_BRIDGE_CONFIG.
    config = tmp_path / "health.yaml"
    config.write_text(f"mqtt:\n  port: {broker.port}\n", encoding="utf-8")
    environ = {"TTS_BRIDGE_CONFIG": str(config), **_no_servers_to_ask()}
    assert container_health(environ) == 1, "no bridge yet: unhealthy"

    bridge = bridge_factory()
    assert container_health(environ) == 0
    assert bridge.running, "the health check must not take over the bridge's MQTT session"

    bridge.stop()
    assert container_health(environ) == 1, "a stopped bridge publishes offline"


def test_container_health_defaults_and_environment(tmp_path: Path, broker: LocalBroker) -> None:
    missing_default = tmp_path / "no-config.yaml"
    with MqttProbe(broker.host, broker.port) as probe:
        probe.publish("house/bridge/state", b'{"state": "online"}', retain=True)
    environ = {
        "TTS_BRIDGE_MQTT__PORT": str(broker.port),
        "TTS_BRIDGE_MQTT__BASE_TOPIC": "house",
        **_no_servers_to_ask(),
    }

    assert container_health(environ, default_config=missing_default) == 0

    # The default config path is read when it exists, as docker/entrypoint.sh does.
    default = tmp_path / "config.yaml"
    default.write_text("mqtt:\n  base_topic: elsewhere\n", encoding="utf-8")
    environ = {"TTS_BRIDGE_MQTT__PORT": str(broker.port), **_no_servers_to_ask()}
    assert container_health(environ, default_config=default) == 1

    environ["TTS_BRIDGE_MQTT__PORT"] = str(free_port())
    assert container_health(environ, default_config=missing_default) == 1


# -- the cache, the disk, the plan and the voices ---------------------------------------------


def test_cache_under_a_regular_file_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache's parent folder should be")
    settings = make_settings(tmp_path, 1883, cache={"dir": str(blocker / "cache")})

    result, used = check_cache(settings.cache)

    assert result.status is Status.FAIL
    assert used == 0
    line = format_result(result)
    assert line.startswith("FAIL  cache")
    assert str(blocker / "cache") in line
    assert "Not a directory" in line
    assert "cache.dir" in line


def test_unwritable_cache_fails_the_whole_checklist(tmp_path: Path, broker: LocalBroker) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    settings = make_settings(
        tmp_path,
        broker.port,
        cache={"dir": str(blocker / "cache")},
        voices={"heart": {"engine": "hibari"}},
        default_voice="heart",
    )
    out = io.StringIO()

    assert run_doctor(settings, plan_threads(two_core_hardware()), out) == 1
    assert checklist(out.getvalue())["cache"][0] == "FAIL"


def test_cache_stats_are_shown(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, 1883)
    cache = SentenceCache(settings.cache)
    key = CacheKey("Dinner is ready.", "test:engine", "joe", None, (), 22050)
    cache.put(key, np.zeros(22050, dtype=np.int16), "fast", "test:engine")
    cache.close()

    result, used = check_cache(settings.cache)

    assert result.status is Status.PASS
    assert "1 sentences" in result.detail
    assert used >= 2 * 22050


def test_disabled_cache_is_a_warning(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, 1883, cache={"enabled": False})
    result, _ = check_cache(settings.cache)
    assert result.status is Status.WARN
    assert "cache.enabled" in result.detail


def test_disk_warns_when_the_cache_may_outgrow_it(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    roomy = make_settings(tmp_path, 1883, cache={"max_mb": 1})
    greedy = make_settings(tmp_path, 1883, cache={"max_mb": 2 * free // (1024 * 1024)})

    assert check_disk(roomy.cache).status is Status.PASS
    result = check_disk(greedy.cache)
    assert result.status is Status.WARN
    assert "lower cache.max_mb" in result.detail


def test_oversubscribed_plan_is_a_warning() -> None:
    plan = plan_threads(
        two_core_hardware(), {"synthesis_concurrency": 2, "onnx_intra_op_threads": 2}
    )
    result = check_plan(plan)
    assert result.status is Status.WARN
    assert any(note.startswith("- warning:") for note in result.notes)


def test_missing_model_file_fails_that_voice_only(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        1883,
        voices={
            "heart": {"engine": "hibari"},
            "amy": {"engine": "piper", "model": "en_US-amy-medium.onnx"},
        },
        default_voice="heart",
    )

    missing, voice = check_voice(settings, "amy", threads=1)
    fine, heart = check_voice(settings, "heart", threads=1)

    assert missing.status is Status.FAIL
    assert voice is None
    assert str(tmp_path / "models" / "en_US-amy-medium.onnx") in missing.detail
    assert fine.status is Status.PASS
    assert heart is not None
    assert not heart.engine.loaded, "checking a voice must not load its model"


def test_a_voice_slower_than_real_time_is_not_called_0x() -> None:
    from tts_bridge.cli.doctor import _times_real_time

    assert _times_real_time(2.231) == "0.45x"
    assert _times_real_time(0.77) == "1.3x"
    assert _times_real_time(0.025) == "40x"
