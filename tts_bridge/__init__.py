"""tts_bridge: an MQTT text-to-speech bridge for the home."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tts-bridge")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
