"""Where the ChatTTS bench gets its random checkpoint writer.

The writer (``tests/support/random_checkpoint.py``) is test support: the tests drive the real
ChatTTS code on a tiny checkpoint it writes, and the bench measures a full-size one. It is no part
of the installed bridge, so ``tts-bridge bench --chattts`` runs from a clone of the repository
(the editable install ``script/setup`` makes); an installed wheel says so instead of failing on an
import.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

WRITER = Path("tests") / "support" / "random_checkpoint.py"
"""The writer's place in a clone."""


class NoCloneError(RuntimeError):
    """The bridge runs from an installed wheel, without the repository's tests folder."""


def clone_root() -> Path:
    """The clone this package runs from (the folder holding ``tts_bridge`` and ``tests``)."""
    return Path(__file__).resolve().parents[2]


def random_checkpoint() -> ModuleType:
    """The writer module (``write_random_checkpoint``, ``OFFICIAL``, ``official_sections``)."""
    root = clone_root()
    if not (root / WRITER).is_file():
        raise NoCloneError(
            f"the ChatTTS bench writes its random checkpoint with {WRITER} of a clone of the "
            f"repository, which {root} is not; run the bench from a clone (script/setup)"
        )
    if str(root) not in sys.path:
        # The console script does not put the clone on the path (the editable install maps
        # only the package), and the writer imports as tests.support.random_checkpoint.
        sys.path.append(str(root))
    return importlib.import_module("tests.support.random_checkpoint")
