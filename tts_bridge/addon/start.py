"""The add-on's entry point: options and Supervisor services in, the bridge running, Wyoming
announced.

Inside Home Assistant OS (``SUPERVISOR_TOKEN`` set) the settings are built from the add-on's
options on top of the add-on's folders, with ``/share/tts_bridge/config.yaml`` (if present) for
everything the options do not cover; the broker comes from the Supervisor's MQTT service when the
user named none; and once the Wyoming server listens it is announced through the Supervisor's
discovery API, so Home Assistant shows "Discovered" and one click adds it. Each thing that fails
(options, the Supervisor, no MQTT service) is one log line, and the bridge serves what it can.
Without a token the image behaves as the plain container does (``tts-bridge run``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from tts_bridge import __version__
from tts_bridge.addon import options as addon_options
from tts_bridge.addon.supervisor import MqttService, SupervisorClient, SupervisorError
from tts_bridge.config import ConfigError, Settings, load_settings, merge_trees
from tts_bridge.system.folders import FolderError
from tts_bridge.wyoming.server import WyomingServer

_LOGGER = logging.getLogger(__name__)

WYOMING_SERVICE = "wyoming"
AUDIO_PORT = "10201/tcp"
"""The container port of the audio URLs in the add-on's config.yaml."""
EXIT_CONFIG = 2


def broker_tree(service: MqttService) -> dict[str, Any]:
    mqtt: dict[str, Any] = {"host": service.host, "port": service.port}
    if service.username:
        mqtt["username"] = service.username
    if service.password:
        mqtt["password"] = service.password
    if service.ssl:
        mqtt["tls"] = {"enabled": True}
    return {"mqtt": mqtt}


def discovery_config(settings: Settings, hostname: str) -> dict[str, Any]:
    """What Home Assistant's Wyoming integration reads from the discovery message: the uri of
    the server, by the add-on's host name on the Supervisor's network."""
    return {"uri": f"tcp://{hostname}:{settings.wyoming.port}"}


def addon_settings(
    client: SupervisorClient,
    options_file: Path = addon_options.OPTIONS_FILE,
    data_dir: Path = addon_options.DATA_DIR,
    share_dir: Path = addon_options.SHARE_DIR,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """The settings of the add-on. Bad options are logged and left out (the add-on's defaults
    serve meanwhile); a broken /share config file is an error (ConfigError): it is the user's
    own full configuration, and guessing around it would hide their mistake."""
    base = addon_options.addon_tree(data_dir, share_dir)
    try:
        options = addon_options.read_options(options_file)
        chosen = addon_options.options_tree(options)
    except addon_options.OptionsError as exc:
        _LOGGER.error("%s; starting with the add-on's defaults", exc)
        options, chosen = {}, {}
    if not addon_options.configures_broker(options):
        base = merge_trees(base, _supervisor_broker(client))
    if not options.get("audio_url_base"):
        base = merge_trees(base, _audio_url_base(client))
    config_file = share_dir / addon_options.CONFIG_FILE_NAME
    path = config_file if config_file.is_file() else None
    environ = {} if environ is None else environ
    try:
        return load_settings(path, environ=environ, base=merge_trees(base, chosen))
    except ConfigError as exc:
        if not chosen:
            raise
        _LOGGER.error("The add-on options cannot be used (%s); starting without them", exc)
        return load_settings(path, environ=environ, base=base)


def _supervisor_broker(client: SupervisorClient) -> dict[str, Any]:
    try:
        service = client.mqtt_service()
    except SupervisorError as exc:
        _LOGGER.error(
            "Cannot ask the Supervisor for the MQTT broker (%s); Wyoming and HTTP serve without "
            "it, or set mqtt_host in the add-on options",
            exc,
        )
        return {}
    if service is None:
        _LOGGER.warning(
            "No MQTT broker: install the Mosquitto broker add-on (or set mqtt_host in the options) "
            "for the MQTT side; Wyoming and HTTP serve without it"
        )
        return {}
    _LOGGER.info("MQTT broker from the Supervisor: %s:%d", service.host, service.port)
    return broker_tree(service)


def _audio_url_base(client: SupervisorClient) -> dict[str, Any]:
    """http.base_url from the host's address and the port the user published, so speakers on
    the LAN can fetch the audio (the add-on's own address is on the Supervisor's network)."""
    try:
        port = client.published_port(AUDIO_PORT)
        address = client.host_address() if port is not None else None
    except SupervisorError as exc:
        _LOGGER.warning("Cannot learn the host's address for audio URLs (%s)", exc)
        return {}
    if port is None or address is None:
        _LOGGER.info(
            "Audio URLs name the add-on's own address: publish %s or set audio_url_base",
            AUDIO_PORT,
        )
        return {}
    return {"http": {"base_url": f"http://{address}:{port}"}}


def announce(client: SupervisorClient, settings: Settings, hostname: str) -> bool:
    """Announce the Wyoming server; False (logged) when the Supervisor refuses or is away."""
    try:
        uuid = client.announce(WYOMING_SERVICE, discovery_config(settings, hostname))
    except SupervisorError as exc:
        _LOGGER.error(
            "Home Assistant was not told about the Wyoming server (%s); add it by hand: "
            "Wyoming Protocol, host %s, port %d",
            exc,
            hostname,
            settings.wyoming.port,
        )
        return False
    _LOGGER.info("Announced the Wyoming server to Home Assistant (discovery %s)", uuid)
    return True


def run(settings: Settings, client: SupervisorClient, stop: threading.Event) -> int:
    from tts_bridge import app

    service = app.build(settings)
    service.start()
    if any(isinstance(s, WyomingServer) and s.serving for s in service.servers):
        announce(client, settings, socket.gethostname())
    while not stop.wait(1.0):
        pass
    service.stop()
    return 0


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    for noisy in ("piper", "hibari", "numba"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    client = SupervisorClient.from_environ(environ)
    if client is None:
        # A plain container: the same start as docker/entrypoint.sh, as PID 1 in its place.
        config = Path(environ.get("TTS_BRIDGE_CONFIG") or "/config/config.yaml")
        extra = ["--config", str(config)] if config.is_file() else []
        os.execvp("tts-bridge", ["tts-bridge", "run", *extra, *(argv or [])])
    _setup_logging("INFO")
    _LOGGER.info("tts_bridge %s as a Home Assistant add-on", __version__)
    try:
        settings = addon_settings(client)
    except ConfigError as exc:
        _LOGGER.error("%s", exc)
        return EXIT_CONFIG
    _setup_logging(settings.logging.level)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        _LOGGER.info("Received %s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        return run(settings, client, stop)
    except FolderError as exc:
        _LOGGER.error("%s", exc)
        return EXIT_CONFIG


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
