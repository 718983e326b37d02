"""Choices made while the bridge runs (Home Assistant's voice select) that outlive a restart.

They live in ``preferences.json`` in the state folder, next to the request journal. The file is
small and rewritten whole: written to a temporary file in the same folder, fsynced, then renamed
over the old one, so a crash or power cut leaves either the old choice or the new one, never half
a file. A file that cannot be read or parsed is reported and ignored (the configured defaults
apply); the next choice replaces it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from tts_bridge.engines.registry import EnginePool, UnknownVoiceError
from tts_bridge.system.durable import write_atomic

_LOGGER = logging.getLogger(__name__)

FILE_NAME = "preferences.json"
FORMAT_VERSION = 1


class PreferencesError(Exception):
    """The preferences could not be saved."""


class Preferences:
    """The saved run-time choices in one JSON file; safe to use from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._values = self._read()

    @classmethod
    def beside(cls, journal_path: Path) -> Preferences:
        """The preferences of the state folder that holds the journal at ``journal_path``."""
        return cls(journal_path.parent / FILE_NAME)

    @property
    def default_voice(self) -> str | None:
        """The default voice last chosen while running; None if none was chosen."""
        with self._lock:
            value = self._values.get("default_voice")
        return value if isinstance(value, str) and value else None

    def save_default_voice(self, name: str) -> None:
        """Remember ``name`` as the default voice; raises PreferencesError if it cannot be saved
        (the choice is then not remembered, and the file keeps what it had)."""
        with self._lock:
            values = {**self._values, "default_voice": name}
            self._write(values)
            self._values = values

    # -- file ------------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            _LOGGER.warning("Cannot read %s (%s); using the configured defaults", self.path, exc)
            return {}
        try:
            values = json.loads(raw)
        except ValueError as exc:
            _LOGGER.warning(
                "%s is not valid JSON (%s); using the configured defaults", self.path, exc
            )
            return {}
        if not isinstance(values, dict):
            _LOGGER.warning("%s is not a JSON object; using the configured defaults", self.path)
            return {}
        values.pop("version", None)
        return values

    def _write(self, values: dict[str, Any]) -> None:
        directory = self.path.parent
        body = json.dumps({"version": FORMAT_VERSION, **values}, ensure_ascii=False, indent=2)
        try:
            if not directory.exists():
                # The state folder also holds the journal of what was announced in the home:
                # only the bridge's user may read it (the same rule as the journal's).
                directory.mkdir(parents=True, mode=0o700)
                os.chmod(directory, 0o700)  # mkdir applies the umask; 0700 exactly
            write_atomic(self.path, body + "\n")
        except OSError as exc:
            raise PreferencesError(f"cannot save {self.path}: {exc}") from exc


def restore_default_voice(preferences: Preferences, engines: EnginePool) -> None:
    """Make the saved default voice the pool's default again; a saved voice that is no longer
    configured is reported and the configured default stays."""
    saved = preferences.default_voice
    configured = engines.default_voice
    if saved is None or saved == configured:
        return
    try:
        engines.set_default_voice(saved)
    except UnknownVoiceError:
        _LOGGER.warning(
            "The default voice %r saved in %s is no longer configured; using %r",
            saved,
            preferences.path,
            configured,
        )
        return
    # Said at start, so a later edit of default_voice in the configuration that seems to have
    # no effect is explained.
    _LOGGER.info(
        "Default voice %s, as chosen while running (saved in %s; the configured one is %s)",
        saved,
        preferences.path,
        configured,
    )
