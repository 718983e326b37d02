"""Volumes to put back, kept on disk until they are: a restart of Home Assistant or of the
bridge between the announcement and the restore must not leave a player at the announcement
volume.

One small JSON file beside the journal, replaced whole with `durable.write_atomic` at every
change (a handful of players, a change per announcement): {entity: {"volume", "due"}}, `due`
in wall-clock seconds so that it means the same after a restart.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from tts_bridge.system.durable import write_atomic

_LOGGER = logging.getLogger(__name__)

FILE_NAME = "player_volumes.json"


@dataclass(frozen=True)
class Restore:
    volume: float
    """The player's own volume, noted before the first announcement set another."""
    due: float
    """When to put it back (time.time())."""


class PendingRestores:
    """The file and its contents; safe from any thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._pending = _read(path)

    def items(self) -> dict[str, Restore]:
        with self._lock:
            return dict(self._pending)

    def get(self, entity: str) -> Restore | None:
        with self._lock:
            return self._pending.get(entity)

    def note(self, entity: str, volume: float, due: float) -> Restore:
        """Remember `volume` for `entity` unless a restore is pending (then that one's volume
        is the player's own, and only its time moves). Written before the volume is set."""
        with self._lock:
            current = self._pending.get(entity)
            restore = Restore(current.volume if current else volume, due)
            self._pending[entity] = restore
            self._write()
            return restore

    def done(self, entity: str, restore: Restore) -> None:
        """Forget `entity`'s restore, unless a later announcement replaced it meanwhile."""
        with self._lock:
            if self._pending.get(entity) == restore:
                del self._pending[entity]
                self._write()

    def _write(self) -> None:
        data = {e: {"volume": r.volume, "due": r.due} for e, r in sorted(self._pending.items())}
        try:
            write_atomic(self.path, json.dumps(data, indent=1), mode=0o600)
        except OSError as exc:
            # Kept in memory: restored all the same unless the bridge stops first.
            _LOGGER.error("Cannot write the pending volume restores to %s: %s", self.path, exc)


def _read(path: Path) -> dict[str, Restore]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        _LOGGER.error("Cannot read the pending volume restores in %s: %s", path, exc)
        return {}
    pending: dict[str, Restore] = {}
    if isinstance(raw, dict):
        for entity, entry in raw.items():
            try:
                pending[str(entity)] = Restore(float(entry["volume"]), float(entry["due"]))
            except (TypeError, KeyError, ValueError):
                _LOGGER.error("Ignoring a damaged volume restore for %s in %s", entity, path)
    if pending:
        _LOGGER.info("%d media player volume(s) to put back from before the restart", len(pending))
    return pending
