"""What every room's settings share: the section base, path and name rules, default folders.

Each room (the doors, the speech core, text, the engines) declares its settings next to its
code on top of :class:`Section`; ``tts_bridge.config`` composes them into one ``Settings``.
This module imports no room, so any room's settings may use it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""What names given in the settings match (voices, presets, targets)."""
NAME_RE = re.compile(NAME_PATTERN)


def _xdg(kind: str, fallback: str) -> Path:
    base = os.environ.get(kind)
    return Path(base) if base else Path.home() / fallback


def default_cache_dir() -> Path:
    return _xdg("XDG_CACHE_HOME", ".cache") / "tts_bridge"


def default_data_dir() -> Path:
    return _xdg("XDG_DATA_HOME", ".local/share") / "tts_bridge"


ExpandedPath = Annotated[Path, AfterValidator(Path.expanduser)]
"""A path setting: ``~`` is the user's home folder wherever a path is read (YAML, environment,
flags, the voices file)."""


class Section(BaseModel):
    """One section of the settings: unknown keys are errors, defaults are validated too."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


def not_utf8(exc: UnicodeDecodeError) -> str:
    """A file that is not UTF-8, in words that say how to fix it."""
    return f"not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); save it as UTF-8"
