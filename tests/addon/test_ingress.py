"""The add-on's web UI in Home Assistant's sidebar: ingress to the bridge's own HTTP server."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.support.harness import REPO_ROOT
from tts_bridge.web.settings import HttpSettings

CONFIG = REPO_ROOT / "addon" / "tts_bridge" / "config.yaml"


def _config() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    return data


def test_the_sidebar_panel_opens_the_bridges_own_http_server() -> None:
    config = _config()
    assert config["ingress"] is True
    # The Supervisor proxies to this port inside the container: the web UI's server.
    assert config["ingress_port"] == HttpSettings().port
    assert "10201/tcp" in config["ports"]  # the same server, published for speakers
    assert re.fullmatch(r"mdi:[a-z0-9-]+", config["panel_icon"])
    assert config["panel_title"] == "TTS Bridge"


def test_the_ui_is_read_only_on_the_lan_unless_the_owner_chooses() -> None:
    # Through ingress the Supervisor has signed the user in; on the LAN with no key set the
    # pages only look and speak.
    assert HttpSettings().ui == "read-only"
