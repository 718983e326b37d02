"""User chimes added and removed while the bridge runs: files in ``chimes.dir``, checked as the
chime library reads them (name, extension, size, and that libsndfile decodes them)."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

import soundfile

from tts_bridge.audio.codec import encode_wav
from tts_bridge.control.errors import ControlError
from tts_bridge.speech.chimes import BUILT_IN, EXTENSIONS, ChimeError, ChimeLibrary
from tts_bridge.system.durable import write_atomic

_LOGGER = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_CHIME_BYTES = 4 * 2**20
"""A chime is a few seconds: a file larger than this is not one."""
PREVIEW_RATE = 24000


def _checked_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ControlError(
            "invalid_request", "a chime's name is 1 to 64 letters, digits, '-' or '_'"
        )
    return name


def save_chime(
    library: ChimeLibrary, folder: Path, name: object, filename: str, data: bytes
) -> dict[str, Any]:
    """Keep `data` as chime `name` (its format from `filename`'s extension), replacing a file
    of the same name; refused (invalid_chime) unless it decodes."""
    chime = _checked_name(name)
    extension = Path(filename).suffix.lower()
    if extension not in EXTENSIONS:
        raise ControlError(
            "invalid_chime", f"a chime is a {', '.join(e[1:] for e in EXTENSIONS)} file"
        )
    if len(data) > MAX_CHIME_BYTES:
        raise ControlError(
            "invalid_chime", f"a chime file is at most {MAX_CHIME_BYTES // 2**20} MB"
        )
    try:
        info = soundfile.info(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError) as exc:
        raise ControlError("invalid_chime", f"not audio libsndfile reads: {exc}") from None
    if info.frames <= 0:
        raise ControlError("invalid_chime", "the file has no audio")
    path = folder / f"{chime}{extension}"
    try:
        for other in _files_of(folder, chime):
            if other != path:
                other.unlink()
        write_atomic(path, data)
    except OSError as exc:
        raise ControlError("chime_not_saved", f"cannot write {path}: {exc.strerror}") from None
    try:
        library.pcm(chime, PREVIEW_RATE)
    except ChimeError as exc:
        path.unlink(missing_ok=True)
        raise ControlError(exc.code, str(exc)) from None
    _LOGGER.info("Chime %s saved (%s)", chime, path.name)
    return {"name": chime, "source": path.name, "seconds": round(info.duration, 2)}


def remove_chime(folder: Path, name: object) -> dict[str, Any]:
    chime = _checked_name(name)
    files = _files_of(folder, chime)
    if not files:
        built_in = " (built-in chimes cannot be removed)" if chime in BUILT_IN else ""
        raise ControlError("unknown_chime", f"no chime file named {chime!r}{built_in}")
    try:
        for path in files:
            path.unlink()
    except OSError as exc:
        raise ControlError("chime_not_saved", f"cannot remove {chime}: {exc.strerror}") from None
    _LOGGER.info("Chime %s removed", chime)
    return {"removed": chime}


def chime_wav(library: ChimeLibrary, name: str) -> bytes:
    """A chime as it plays before speech (a WAV at the preview rate)."""
    try:
        return encode_wav(library.pcm(name, PREVIEW_RATE), PREVIEW_RATE)
    except ChimeError as exc:
        raise ControlError(exc.code, str(exc)) from None


def _files_of(folder: Path, name: str) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.stem == name and p.suffix.lower() in EXTENSIONS]
    except OSError:
        return []
