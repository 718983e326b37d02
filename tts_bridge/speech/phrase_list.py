"""The phrases the bridge renders ahead in idle time: the configured ones (``phrases``,
``phrases_file``, read-only here) and those added while it runs (the bridge API's
``phrases/set`` and ``phrases/remove``, the web UI), kept in ``phrases.json`` in the state folder
(written whole and atomically, see tts_bridge.system.durable) so they are rendered ahead after a
restart too.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from tts_bridge.system.durable import write_atomic

_LOGGER = logging.getLogger(__name__)

FILE_NAME = "phrases.json"
FORMAT_VERSION = 1
MAX_PHRASES = 1000
MAX_CHARS = 500
"""A phrase is an announcement, not a text: longer ones belong in a say request."""


class PhraseError(ValueError):
    """A phrase refused (empty, too long, too many, or not one added at run time)."""


def _clean(text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        raise PhraseError("a phrase is a non-empty string")
    phrase = " ".join(text.split())  # one line, as a phrases_file holds it
    if len(phrase) > MAX_CHARS:
        raise PhraseError(f"a phrase is at most {MAX_CHARS} characters")
    return phrase


class PhraseList:
    """Configured and run-time phrases (safe from any thread)."""

    def __init__(self, configured: list[str], path: Path | None) -> None:
        self.path = path
        """Where run-time phrases are kept; None: they last until the bridge stops."""
        self._configured = list(dict.fromkeys(configured))
        self._lock = threading.Lock()
        self._runtime = self._read()

    def _read(self) -> list[str]:
        if self.path is None or not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            phrases = [_clean(p) for p in data["phrases"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # The configured phrases still apply; the next edit rewrites the file.
            _LOGGER.error("Ignoring the saved phrases %s: %s", self.path, exc)
            return []
        return list(dict.fromkeys(phrases))[:MAX_PHRASES]

    def _save(self, runtime: list[str]) -> bool:
        """Keep `runtime` on disk; False (logged) when the state folder cannot be written."""
        if self.path is None:
            return True
        body = json.dumps({"version": FORMAT_VERSION, "phrases": runtime}, ensure_ascii=False)
        try:
            write_atomic(self.path, body + "\n")
        except OSError as exc:
            _LOGGER.error("The phrases are changed but not saved for the next start: %s", exc)
            return False
        return True

    def entries(self) -> list[tuple[str, str]]:
        """Every phrase once, with where it comes from: "configuration" or "runtime"."""
        with self._lock:
            runtime = [p for p in self._runtime if p not in self._configured]
            return [(p, "configuration") for p in self._configured] + [
                (p, "runtime") for p in runtime
            ]

    def all(self) -> list[str]:
        return [phrase for phrase, _ in self.entries()]

    def add(self, text: object) -> tuple[str, bool, bool]:
        """(the phrase, whether it is new, whether it was kept on disk). Raises PhraseError."""
        phrase = _clean(text)
        with self._lock:
            if phrase in self._configured or phrase in self._runtime:
                return phrase, False, True
            if len(self._runtime) >= MAX_PHRASES:
                raise PhraseError(f"at most {MAX_PHRASES} phrases can be added")
            runtime = [*self._runtime, phrase]
            saved = self._save(runtime)
            self._runtime = runtime
        return phrase, True, saved

    def remove(self, text: object) -> tuple[str, bool]:
        """(the phrase, whether the change was kept on disk). Raises PhraseError for a phrase
        not added at run time (a configured one is changed in the configuration)."""
        phrase = _clean(text)
        with self._lock:
            if phrase not in self._runtime:
                where = "configured" if phrase in self._configured else "not in the list"
                raise PhraseError(f"that phrase is {where}; phrases/remove takes phrases it added")
            runtime = [p for p in self._runtime if p != phrase]
            saved = self._save(runtime)
            self._runtime = runtime
        return phrase, saved
