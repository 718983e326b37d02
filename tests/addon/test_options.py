"""The add-on's options.json as settings: what the options set, what the add-on fixes, and bad
options refused with the option named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tts_bridge.addon.options import (
    OptionsError,
    addon_tree,
    configures_broker,
    options_tree,
    read_options,
)
from tts_bridge.config import ConfigError, load_settings, merge_trees

ADDON_CONFIG = Path(__file__).parents[2] / "addon" / "tts_bridge" / "config.yaml"


def addon_defaults() -> dict[str, Any]:
    options: dict[str, Any] = yaml.safe_load(ADDON_CONFIG.read_text(encoding="utf-8"))["options"]
    return options


def settings_from(options: dict[str, Any], tmp_path: Path) -> Any:
    base = merge_trees(addon_tree(tmp_path / "data", tmp_path / "share"), options_tree(options))
    return load_settings(None, environ={}, base=base)


def test_the_default_options_give_the_bundled_voices_and_the_addon_folders(tmp_path: Path) -> None:
    settings = settings_from(addon_defaults(), tmp_path)
    assert settings.default_voice == "joe"
    assert {"joe", "heart"} <= set(settings.voices)
    assert settings.cache.dir == tmp_path / "data" / "cache"
    assert settings.journal.path == tmp_path / "data" / "state" / "journal.sqlite3"
    assert settings.models.dir == tmp_path / "share" / "models"
    assert settings.wyoming.zeroconf is False
    assert settings.homeassistant.targets == ["default"]
    assert settings.logging.level == "INFO"
    assert settings.http.base_url is None


def test_every_option_reaches_its_setting(tmp_path: Path) -> None:
    options = {
        "default_voice": "lessac",
        "voices": [
            {"name": "lessac", "engine": "piper", "model": "en_US-lessac.onnx", "speaker": ""}
        ],
        "targets": ["kitchen", "hall"],
        "phrases": ["Dinner is ready", "  "],
        "audio_url_base": "http://192.168.1.20:10201/",
        "log_level": "debug",
        "mqtt_host": "nas",
        "mqtt_port": 1884,
        "mqtt_username": "tts",
        "mqtt_password": "007",
    }
    tree = options_tree(options)
    assert tree["voices"]["lessac"] == {"engine": "piper", "model": "en_US-lessac.onnx"}
    assert "joe" in tree["voices"], "extra voices add to the bundled ones"
    settings = load_settings(None, environ={}, base=tree)
    assert settings.default_voice == "lessac"
    assert settings.homeassistant.targets == ["kitchen", "hall"]
    assert settings.phrases == ["Dinner is ready"]
    assert settings.http.base_url == "http://192.168.1.20:10201"
    assert settings.logging.level == "DEBUG"
    mqtt = settings.mqtt
    assert (mqtt.host, mqtt.port, mqtt.username, mqtt.password) == ("nas", 1884, "tts", "007")
    assert configures_broker(options)
    assert not configures_broker(addon_defaults())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"voices": "joe"}, "option voices: expected a list"),
        ({"voices": [{"name": "x"}]}, r"option voices\[0\]: needs at least a name and an engine"),
        ({"targets": "kitchen"}, "option targets: expected a list"),
        ({"log_level": "loud"}, "option log_level: 'loud' is not one of"),
        ({"default_voice": 7}, "option default_voice: expected text"),
    ],
)
def test_options_of_the_wrong_shape_are_refused_by_name(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(OptionsError, match=message):
        options_tree(options)


def test_options_the_settings_refuse_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="default_voice: 'nobody' is not one of the voices"):
        settings_from({**addon_defaults(), "default_voice": "nobody"}, tmp_path)
    with pytest.raises(ConfigError, match="engine"):
        settings_from({"voices": [{"name": "x", "engine": "espeak"}]}, tmp_path)


def test_read_options(tmp_path: Path) -> None:
    path = tmp_path / "options.json"
    with pytest.raises(OptionsError, match="cannot read the add-on options"):
        read_options(path)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(OptionsError, match="are not JSON"):
        read_options(path)
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(OptionsError, match="not a JSON object"):
        read_options(path)
    path.write_text(json.dumps(addon_defaults()), encoding="utf-8")
    assert read_options(path) == addon_defaults()


def test_a_share_config_file_refines_the_options(tmp_path: Path) -> None:
    """The file in /share wins over the options and the add-on's folders."""
    config = tmp_path / "config.yaml"
    config.write_text("default_voice: heart\nscheduler:\n  idle_delay_s: 9\n", encoding="utf-8")
    base = merge_trees(addon_tree(tmp_path / "data", tmp_path / "share"), options_tree({}))
    settings = load_settings(config, environ={}, base=base)
    assert settings.default_voice == "heart"
    assert settings.scheduler.idle_delay_s == 9
    assert settings.cache.dir == tmp_path / "data" / "cache"


@pytest.mark.parametrize("emptied", [{"targets": [], "phrases": []}, {}])
def test_targets_and_phrases_left_empty_or_out(tmp_path: Path, emptied: dict[str, Any]) -> None:
    """Both lists are optional in the form: empty (or absent) means the bridge's defaults."""
    options = {k: v for k, v in addon_defaults().items() if k not in ("targets", "phrases")}
    settings = settings_from({**options, **emptied}, tmp_path)
    assert settings.homeassistant.targets == ["default"]
    assert settings.phrases == []
