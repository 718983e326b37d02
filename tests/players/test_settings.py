"""The settings of media-player targets and of the Home Assistant connection: checks, the
token from the environment or a file (never in a repr), the add-on's Supervisor proxy and the
add-on's target_players option; the lead-in on the delivered audio only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tts_bridge.addon.options import OptionsError, addon_tree, options_tree
from tts_bridge.audio import codec
from tts_bridge.config import ConfigError, Settings, load_settings, merge_trees
from tts_bridge.players.connection import connection
from tts_bridge.players.lead import padded
from tts_bridge.speech.synthesis import Rendering

ADDON_CONFIG = Path(__file__).parents[2] / "addon" / "tts_bridge" / "config.yaml"
TOKEN = "secret-token-0123456789"


def test_a_target_takes_media_players_volume_and_lead() -> None:
    settings = Settings.model_validate(
        {
            "targets": {
                "kitchen": {
                    "media_players": ["media_player.kitchen", "media_player.hall"],
                    "volume": 0.5,
                    "lead_in_ms": 400,
                    "lead_out_ms": 200,
                    "volume_restore": "player",
                }
            }
        }
    )
    kitchen = settings.targets["kitchen"]
    assert kitchen.media_players == ["media_player.kitchen", "media_player.hall"]
    assert (kitchen.volume, kitchen.lead_in_ms, kitchen.lead_out_ms) == (0.5, 400, 200)
    assert kitchen.volume_restore == "player"
    plain = Settings.model_validate({"targets": {"hall": {}}}).targets["hall"]
    assert (plain.media_players, plain.volume, plain.lead_in_ms) == ([], None, 0)
    assert plain.volume_restore == "bridge"


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ({"media_players": ["light.kitchen"]}, "targets.kitchen.media_players: .*media player"),
        ({"media_players": ["media_player.a", "media_player.a"]}, "distinct"),
        ({"volume": 1.5}, "targets.kitchen.volume"),
        ({"lead_in_ms": -1}, "targets.kitchen.lead_in_ms"),
        ({"lead_out_ms": 60_000}, "targets.kitchen.lead_out_ms"),
        ({"volume_restore": "never"}, "targets.kitchen.volume_restore"),
    ],
)
def test_bad_player_settings_name_the_key(
    tmp_path: Path, target: dict[str, Any], match: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"targets": {"kitchen": target}}), encoding="utf-8")
    with pytest.raises(ConfigError, match=match):
        load_settings(path, environ={})


def test_the_token_from_the_environment_or_a_file_never_in_a_repr(tmp_path: Path) -> None:
    environ = {
        "TTS_BRIDGE_HOMEASSISTANT__URL": "http://ha.local:8123/",
        "TTS_BRIDGE_HOMEASSISTANT__TOKEN": TOKEN,
    }
    settings = load_settings(None, environ=environ)
    assert settings.homeassistant.url == "http://ha.local:8123"
    assert TOKEN not in repr(settings) and TOKEN not in repr(settings.homeassistant)
    found = connection(settings, {})
    assert found is not None and (found.url, found.token) == ("http://ha.local:8123", TOKEN)
    assert TOKEN not in repr(found)

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    from_file = Settings.model_validate(
        {"homeassistant": {"url": "https://ha.example", "token_file": str(token_file)}}
    )
    found = connection(from_file, {})
    assert found is not None and found.token == TOKEN

    missing = Settings.model_validate(
        {"homeassistant": {"url": "https://ha.example", "token_file": str(tmp_path / "none")}}
    )
    assert connection(missing, {"SUPERVISOR_TOKEN": "x"}) is None  # logged; not the add-on's
    with pytest.raises(ConfigError, match=r"\(homeassistant.url\): must be"):
        load_settings(None, environ={"TTS_BRIDGE_HOMEASSISTANT__URL": "ha.local"})


def test_no_token_no_connection_and_the_addon_uses_the_supervisor() -> None:
    no_token = Settings.model_validate({"homeassistant": {"url": "http://ha.local:8123"}})
    assert connection(no_token, {"SUPERVISOR_TOKEN": "x"}) is None
    assert connection(Settings(), {}) is None
    found = connection(Settings(), {"SUPERVISOR_TOKEN": TOKEN})
    assert found is not None
    assert (found.url, found.token) == ("http://supervisor/core", TOKEN)


def test_the_addon_option_target_players_sets_the_targets(tmp_path: Path) -> None:
    config = yaml.safe_load(ADDON_CONFIG.read_text(encoding="utf-8"))
    assert config["homeassistant_api"] is True
    assert set(config["schema"]["target_players"][0]) == {"target", "media_players", "volume",
                                                          "lead_in_ms"}  # fmt: skip
    options = {
        **config["options"],
        "target_players": [
            {"target": "kitchen", "media_players": ["media_player.kitchen"], "volume": 0.5,
             "lead_in_ms": 400},
            {"target": "hall", "media_players": ["media_player.hall", "media_player.stairs"]},
        ],
    }  # fmt: skip
    base = merge_trees(addon_tree(tmp_path / "data", tmp_path / "share"), options_tree(options))
    settings = load_settings(None, environ={}, base=base)
    kitchen, hall = settings.targets["kitchen"], settings.targets["hall"]
    assert (kitchen.media_players, kitchen.volume, kitchen.lead_in_ms) == (
        ["media_player.kitchen"],
        0.5,
        400,
    )
    assert (hall.media_players, hall.volume) == (["media_player.hall", "media_player.stairs"], None)
    with pytest.raises(OptionsError, match=r"target_players\[1\]: kitchen is listed twice"):
        options_tree({"target_players": [{"target": "kitchen"}, {"target": "kitchen"}]})


def test_the_lead_is_silence_around_a_copy() -> None:
    rate = 22050
    pcm = np.full(rate // 10, 1000, dtype="<i2")
    original = Rendering(codec.encode_wav(pcm, rate), rate, 100, "joe", "piper", "quality", 1, 1,
                         pcm=pcm)  # fmt: skip
    longer = padded(original, 400, 200)
    assert longer.duration_ms == 700
    assert longer.pcm.size == pcm.size + rate * 6 // 10
    assert not longer.pcm[: rate * 4 // 10].any() and not longer.pcm[-rate // 5 :].any()
    np.testing.assert_array_equal(longer.pcm[rate * 4 // 10 : -rate // 5], pcm)
    assert longer.wav == codec.encode_wav(longer.pcm, rate)
    assert original.pcm is pcm and original.duration_ms == 100, "the given one is unchanged"
    assert padded(original, 0, 0) is original
