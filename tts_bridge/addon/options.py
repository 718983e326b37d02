"""The add-on's options (``/data/options.json``, written by the Supervisor) as a settings tree.

The Supervisor checks the options against the schema in the add-on's config.yaml before the
add-on starts; what it cannot check (a default voice that names no voice, an engine kind this
version does not know) is refused by the bridge's own settings, with the option named.
The add-on keeps everything it writes under /data (backed up with the add-on) and reads user
files (models, an optional full config.yaml) from /share/tts_bridge.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tts_bridge.config import Settings

_LOGGER = logging.getLogger(__name__)

OPTIONS_FILE = Path("/data/options.json")
DATA_DIR = Path("/data")
SHARE_DIR = Path("/share/tts_bridge")
CONFIG_FILE_NAME = "config.yaml"
"""An optional full configuration in SHARE_DIR, for settings the options do not cover."""
VOICE_KEYS = ("engine", "model", "speaker", "description", "fast_voice")
LOG_LEVELS = ("debug", "info", "warning", "error")
TARGET_PLAYER_KEYS = ("media_players", "volume", "lead_in_ms")
"""What an entry of the target_players option sets for its target (targets.<target>.<key>)."""


class OptionsError(Exception):
    """The options file cannot be used; the message names the file or the option."""


def read_options(path: Path = OPTIONS_FILE) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise OptionsError(f"cannot read the add-on options {path}: {exc.strerror}") from None
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise OptionsError(f"the add-on options {path} are not JSON: {exc}") from None
    if not isinstance(options, dict):
        raise OptionsError(f"the add-on options {path} are not a JSON object")
    return options


def addon_tree(data_dir: Path = DATA_DIR, share_dir: Path = SHARE_DIR) -> dict[str, Any]:
    """Where an add-on keeps its files, and what differs inside Home Assistant OS."""
    state = data_dir / "state"
    return {
        "cache": {"dir": str(data_dir / "cache")},
        "models": {"dir": str(share_dir / "models")},
        "journal": {"path": str(state / "journal.sqlite3")},
        "voices_file": str(state / "voices.yaml"),
        # The Supervisor's discovery announces the server; mDNS from inside the add-on's
        # network would name an address the LAN cannot reach.
        "wyoming": {"zeroconf": False},
    }


def options_tree(options: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the options set. Raises OptionsError naming an option of the wrong shape."""
    tree: dict[str, Any] = {}
    if options.get("default_voice"):
        tree["default_voice"] = _text(options, "default_voice")
    voices = _list(options, "voices")
    if voices:
        tree["voices"] = {
            **{n: v.model_dump(exclude_defaults=True) for n, v in Settings().voices.items()},
            **_voices(voices),
        }
    targets = _list(options, "targets")
    if targets:
        tree["homeassistant"] = {"targets": [str(t) for t in targets]}
    players = _target_players(_list(options, "target_players"))
    if players:
        tree["targets"] = players
    phrases = [str(p) for p in _list(options, "phrases") if str(p).strip()]
    if phrases:
        tree["phrases"] = phrases
    if options.get("audio_url_base"):
        tree["http"] = {"base_url": _text(options, "audio_url_base")}
    level = str(options.get("log_level") or "info").lower()
    if level not in LOG_LEVELS:
        raise OptionsError(f"option log_level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
    tree["logging"] = {"level": level.upper()}
    mqtt = {
        key: options[f"mqtt_{key}"]
        for key in ("host", "port", "username", "password")
        if options.get(f"mqtt_{key}") not in (None, "")
    }
    if mqtt:
        tree["mqtt"] = mqtt
    known = {
        "default_voice",
        "voices",
        "targets",
        "target_players",
        "phrases",
        "audio_url_base",
        "log_level",
    }
    unknown = set(options) - known - {f"mqtt_{k}" for k in ("host", "port", "username", "password")}
    if unknown:
        _LOGGER.warning("Ignoring unknown add-on options: %s", ", ".join(sorted(unknown)))
    return tree


def configures_broker(options: Mapping[str, Any]) -> bool:
    """Whether the user named a broker (then the Supervisor's MQTT service is not asked)."""
    return bool(options.get("mqtt_host"))


def _voices(entries: list[Any]) -> dict[str, dict[str, Any]]:
    voices: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("engine"):
            raise OptionsError(f"option voices[{index}]: needs at least a name and an engine")
        voices[str(entry["name"])] = {
            key: entry[key] for key in VOICE_KEYS if entry.get(key) not in (None, "")
        }
    return voices


def _target_players(entries: list[Any]) -> dict[str, dict[str, Any]]:
    """targets.<target> from the entries of target_players (Home Assistant media players that
    play a target's announcements; the add-on reaches Home Assistant through the Supervisor)."""
    targets: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("target"):
            raise OptionsError(f"option target_players[{index}]: needs a target")
        target = str(entry["target"])
        if target in targets:
            raise OptionsError(f"option target_players[{index}]: {target} is listed twice")
        targets[target] = {
            key: entry[key] for key in TARGET_PLAYER_KEYS if entry.get(key) not in (None, "")
        }
    return targets


def _text(options: Mapping[str, Any], key: str) -> str:
    value = options[key]
    if not isinstance(value, str):
        raise OptionsError(f"option {key}: expected text, not {value!r}")
    return value.strip()


def _list(options: Mapping[str, Any], key: str) -> list[Any]:
    value = options.get(key) or []
    if not isinstance(value, list):
        raise OptionsError(f"option {key}: expected a list, not {value!r}")
    return value
