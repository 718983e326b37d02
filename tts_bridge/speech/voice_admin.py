"""Voices added, changed and removed while the bridge runs, kept in the voices file.

The bridge API's ``voices/add``, ``voices/update``, ``voices/remove`` and ``reload`` (and SIGHUP,
which reloads) come here. Each change is all or nothing: the whole new set of voices is built and
checked first (`EnginePool.prepare_voices`), then written to the voices file, then put in use at
once; a bad voice is refused with the reason and nothing changes. Requests already validated
finish on the voice they started with; every description (the bridge API's voice list, Wyoming's
``describe``, the HTTP voice list) reads the pool, and `on_change` republishes the retained ones
(bridge/info, Home Assistant discovery with the select's options).

Voices of the main configuration file are not the voices file's to change: updating or removing
one is refused (``configured_voice``); `reload` re-reads the voices file, not the configuration.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tts_bridge.config import Settings
from tts_bridge.engines.base import EngineError
from tts_bridge.engines.registry import EnginePool, VoiceSetError
from tts_bridge.engines.settings import VoiceSettings
from tts_bridge.engines.voices_file import (
    VoicesFileError,
    chattts_voice_from_seed,
    read_voices,
    remove_voice,
    write_voice,
)
from tts_bridge.settings_base import NAME_PATTERN

_LOGGER = logging.getLogger(__name__)

_NAME_RE = re.compile(NAME_PATTERN)
_ADD_ONLY = frozenset({"name", "seed", "like", "model", "fast_voice"})
"""Keys of voices/add beyond a voice's own settings."""


class VoiceAdminError(Exception):
    """A voice change refused; `code` is the bridge API's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _entry(voice: VoiceSettings) -> dict[str, Any]:
    """A voice as the voices file holds it."""
    return voice.model_dump(mode="json", exclude_none=True, exclude_defaults=True) | {
        "engine": voice.engine
    }


def _described(name: str, voice: VoiceSettings) -> dict[str, Any]:
    shown = _entry(voice)
    shown.pop("spk_emb", None)  # long, and its SHA-256 names it
    return {"name": name, **shown}


def _validated(name: str, fields: Mapping[str, Any]) -> VoiceSettings:
    try:
        return VoiceSettings.model_validate(dict(fields))
    except ValidationError as exc:
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or name}: "
            f"{str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise VoiceAdminError("invalid_voice", f"voice {name!r}: {reasons}") from None


class VoiceAdmin:
    """Changes the pool's voices and the voices file together; any thread, one at a time."""

    def __init__(
        self,
        settings: Settings,
        pool: EnginePool,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._path: Path = settings.voices_file
        self._pool = pool
        self.on_change = on_change
        self._lock = threading.Lock()
        self._configured = self._main_config_voices(settings)

    def _main_config_voices(self, settings: Settings) -> dict[str, VoiceSettings]:
        """The voices that come from the configuration, not from the voices file (a name in
        both is the configuration's: it wins when the settings are loaded)."""
        try:
            in_file = read_voices(self._path)
        except VoicesFileError:
            in_file = {}
        configured = {}
        for name, voice in settings.voices.items():
            entry = in_file.get(name)
            try:
                from_file = entry is not None and VoiceSettings.model_validate(entry) == voice
            except ValidationError:
                from_file = False
            if not from_file:
                configured[name] = voice
        return configured

    def requests(self) -> dict[str, Callable[[dict[str, Any]], Any]]:
        """The bridge API's requests this serves."""
        return {
            "voices/add": self.add,
            "voices/update": self.update,
            "voices/remove": self.remove,
            "reload": lambda _: self.reload(),
        }

    # the requests

    def add(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """A new voice: a ChatTTS speaker from a ``seed`` (or a ``spk_emb`` with its
        ``spk_emb_sha256``), a variant ``like`` a configured voice (speed, speaker, fast voice,
        description, options), or any voice's settings in full (``engine``, ``model``, ...)."""
        name = self._name(args)
        with self._lock:
            voices = dict(self._pool.settings.voices)
            if name in voices:
                raise VoiceAdminError(
                    "voice_exists", f"voice {name!r} exists; use voices/update to change it"
                )
            voice = self._new_voice(name, args, voices)
            voices[name] = voice
            self._apply(voices, write=(name, voice))
        _LOGGER.info("Voice %s added (%s)", name, voice.engine)
        return {"voice": _described(name, voice), "voices": list(self._pool.settings.voices)}

    def update(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Change settings of a voice added at run time (or by `voices new`)."""
        name = self._name(args)
        changes = {k: v for k, v in args.items() if k != "name"}
        if not changes:
            raise VoiceAdminError("invalid_request", "give the settings to change")
        with self._lock:
            voices = dict(self._pool.settings.voices)
            current = self._own_voice(name, voices)
            voice = _validated(name, {**_entry(current), **changes})
            voices[name] = voice
            self._apply(voices, write=(name, voice))
        _LOGGER.info("Voice %s updated: %s", name, ", ".join(sorted(changes)))
        return {"voice": _described(name, voice), "voices": list(self._pool.settings.voices)}

    def remove(self, args: Mapping[str, Any]) -> dict[str, Any]:
        name = self._name(args)
        with self._lock:
            voices = dict(self._pool.settings.voices)
            self._own_voice(name, voices)
            del voices[name]
            self._apply(voices, remove=name)
        _LOGGER.info("Voice %s removed", name)
        return {"removed": name, "voices": list(self._pool.settings.voices)}

    def reload(self) -> dict[str, Any]:
        """Read the voices file again: its voices with the configuration's."""
        with self._lock:
            try:
                in_file = read_voices(self._path)
            except VoicesFileError as exc:
                raise VoiceAdminError("voices_file_error", str(exc)) from None
            voices = {name: _validated(name, entry) for name, entry in in_file.items()}
            voices.update(self._configured)
            self._apply(voices)
        _LOGGER.info("Voices reloaded from %s", self._path)
        return {"voices": list(self._pool.settings.voices)}

    # helpers

    @staticmethod
    def _name(args: Mapping[str, Any]) -> str:
        name = args.get("name", args.get("value"))
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise VoiceAdminError(
                "invalid_request", f"'name' must be a voice name matching {NAME_PATTERN}"
            )
        return name

    def _own_voice(self, name: str, voices: Mapping[str, VoiceSettings]) -> VoiceSettings:
        """A voice this may change: one that exists and is not the configuration's."""
        if name not in voices:
            raise VoiceAdminError(
                "unknown_voice", f"unknown voice {name!r}; available: {', '.join(sorted(voices))}"
            )
        if name in self._configured:
            raise VoiceAdminError(
                "configured_voice",
                f"voice {name!r} is in the configuration file; change it there (only voices "
                f"added at run time live in {self._path})",
            )
        return voices[name]

    def _new_voice(
        self, name: str, args: Mapping[str, Any], voices: Mapping[str, VoiceSettings]
    ) -> VoiceSettings:
        fields = {k: v for k, v in args.items() if k not in _ADD_ONLY}
        fast_voice = args.get("fast_voice")
        if "seed" in args:
            seed = args["seed"]
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise VoiceAdminError("invalid_request", "'seed' must be a whole number")
            model = args.get("model")
            if model is not None and not isinstance(model, str):
                raise VoiceAdminError("invalid_request", "'model' must be a checkpoint folder")
            try:
                voice = chattts_voice_from_seed(
                    self._pool.settings,
                    seed,
                    Path(model) if model else None,
                    fast_voice if isinstance(fast_voice, str) else None,
                )
            except (VoicesFileError, EngineError) as exc:
                raise VoiceAdminError("invalid_voice", str(exc)) from None
            return _validated(name, {**_entry(voice), **fields})
        if "like" in args:
            like = args["like"]
            if not isinstance(like, str) or like not in voices:
                raise VoiceAdminError(
                    "unknown_voice", f"'like' must name a voice; available: {', '.join(voices)}"
                )
            base = _entry(voices[like]) | {"description": f"variant of {like}"}
            extra = {"fast_voice": fast_voice} if fast_voice is not None else {}
            return _validated(name, {**base, **fields, **extra})
        extra = {"model": args["model"]} if "model" in args else {}
        if fast_voice is not None:
            extra["fast_voice"] = fast_voice
        if "engine" not in fields:
            raise VoiceAdminError(
                "invalid_request", "give 'seed' (ChatTTS), 'like' (a variant) or 'engine'"
            )
        return _validated(name, {**fields, **extra})

    def _apply(
        self,
        voices: Mapping[str, VoiceSettings],
        *,
        write: tuple[str, VoiceSettings] | None = None,
        remove: str | None = None,
    ) -> None:
        """Build, then persist, then use: a failure at any step leaves everything as it was."""
        try:
            prepared = self._pool.prepare_voices(voices)
        except (VoiceSetError, EngineError, ValueError) as exc:
            raise VoiceAdminError("invalid_voice", str(exc)) from None
        try:
            if write is not None:
                write_voice(self._path, write[0], _entry(write[1]))
            if remove is not None:
                remove_voice(self._path, remove)
        except (VoicesFileError, OSError) as exc:
            raise VoiceAdminError(
                "voices_file_error", f"cannot write {self._path}: {exc}"
            ) from None
        self._pool.use_voices(prepared)
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # the voices are in use; telling others is best effort
                _LOGGER.exception("Announcing the new voices failed")
