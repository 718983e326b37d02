"""The pronunciation lexicon every voice shares, editable while the bridge runs.

Entries come from the configuration (`lexicon` and `lexicon_file`) and from the bridge API
(`lexicon/set`, `lexicon/remove`), which are kept in ``lexicon.json`` in the state folder
(written whole and atomically, see tts_bridge.system.durable) and win over configured ones of
the same word. The lexicon is applied to each sentence before the text front end, and what it
gives is what the cache key holds: an edited entry makes the sentences it touches new audio,
never stale audio.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tts_bridge.config import Settings
from tts_bridge.system.durable import write_atomic
from tts_bridge.text.lexicon import Entry, Lexicon, LexiconError, key_of, make_entry
from tts_bridge.text.settings import LexiconWord

_LOGGER = logging.getLogger(__name__)

FILE_NAME = "lexicon.json"
FORMAT_VERSION = 1
MAX_ENTRIES = 10_000


def read_lexicon_file(path: Path | None) -> dict[str, LexiconWord]:
    """The entries of `lexicon_file` (YAML or JSON: word -> say, or word -> {say, phonemes});
    a file that cannot be read, or an entry that is not one, is logged and left out (the
    configuration's own entries still apply)."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        _LOGGER.error("Cannot read lexicon_file %s: %s", path, exc)
        return {}
    if not isinstance(data, dict):
        _LOGGER.error("lexicon_file %s must map words to what to say", path)
        return {}
    entries: dict[str, LexiconWord] = {}
    for word, spec in data.items():
        try:
            entries[str(word)] = LexiconWord.model_validate(
                {"say": spec} if isinstance(spec, str) else spec
            )
        except ValidationError as exc:
            _LOGGER.error("lexicon_file %s: entry %r is not used: %s", path, word, exc)
    return entries


class Pronunciations:
    """Configured and run-time entries, one compiled Lexicon in use (safe from any thread)."""

    def __init__(self, configured: list[Entry], path: Path | None) -> None:
        self.path = path
        """Where run-time entries are kept; None: they last until the bridge stops."""
        self._configured = {e.key: e for e in configured}
        self._lock = threading.Lock()
        self._runtime: dict[str, Entry] = self._read()
        self._lexicon = self._compiled()

    @classmethod
    def from_settings(cls, settings: Settings, state_dir: Path | None) -> Pronunciations:
        """The configured entries, and the run-time ones of `state_dir` (None: not kept)."""
        specs = {**read_lexicon_file(settings.lexicon_file), **settings.lexicon}
        configured = []
        for word, spec in specs.items():
            try:
                configured.append(make_entry(word, spec.say, spec.phonemes))
            except LexiconError as exc:
                _LOGGER.error("Lexicon entry %r is not used: %s", word[:64], exc)
        return cls(configured, state_dir / FILE_NAME if state_dir is not None else None)

    def _compiled(self) -> Lexicon:
        return Lexicon([*self._configured.values(), *self._runtime.values()])

    def _read(self) -> dict[str, Entry]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            entries = [make_entry(e["word"], e["say"], e.get("phonemes")) for e in data["entries"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # The configured entries still apply; the next edit rewrites the file.
            _LOGGER.error("Ignoring the saved lexicon %s: %s", self.path, exc)
            return {}
        return {e.key: e for e in entries}

    def _save(self, runtime: dict[str, Entry]) -> None:
        if self.path is None:
            return
        entries = [
            {"word": e.word, "say": e.say, **({"phonemes": e.phonemes} if e.phonemes else {})}
            for e in runtime.values()
        ]
        body = json.dumps({"version": FORMAT_VERSION, "entries": entries}, ensure_ascii=False)
        write_atomic(self.path, body + "\n")

    def apply(self, text: str, *, phonemes: bool = False) -> str:
        return self._lexicon.apply(text, phonemes=phonemes)

    def set(self, word: str, say: str, phonemes: str | None = None) -> tuple[Entry, bool]:
        """Add or replace an entry; (the entry, whether it was kept on disk). Raises
        LexiconError for a bad entry or a full lexicon."""
        entry = make_entry(word, say, phonemes)
        with self._lock:
            runtime = {**self._runtime, entry.key: entry}
            if len(runtime) > MAX_ENTRIES:
                raise LexiconError(f"the lexicon holds {MAX_ENTRIES} entries at most")
            saved = self._commit(runtime)
        return entry, saved

    def remove(self, word: str) -> bool:
        """Remove a run-time entry; whether it was kept on disk. Raises LexiconError when the
        word has none (a configured entry is changed in the configuration)."""
        key = key_of(word)
        with self._lock:
            if key not in self._runtime:
                where = "set in the configuration" if key in self._configured else "not in it"
                raise LexiconError(f"{word[:64]!r} is {where}; lexicon/remove takes words it set")
            runtime = {k: e for k, e in self._runtime.items() if k != key}
            return self._commit(runtime)

    def _commit(self, runtime: dict[str, Entry]) -> bool:
        """Use `runtime` now and keep it on disk (False: in use, but not kept)."""
        saved = True
        try:
            self._save(runtime)
        except OSError as exc:
            _LOGGER.error("The lexicon is changed but not saved for the next start: %s", exc)
            saved = False
        self._runtime = runtime
        self._lexicon = self._compiled()
        return saved

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            configured, runtime = dict(self._configured), dict(self._runtime)
        merged = {k: (e, "configuration") for k, e in configured.items()}
        merged.update({k: (e, "runtime") for k, e in runtime.items()})
        return [
            {
                "word": e.word,
                "say": e.say,
                **({"phonemes": e.phonemes} if e.phonemes else {}),
                "source": source,
            }
            for e, source in sorted(merged.values(), key=lambda item: item[0].key)
        ]
