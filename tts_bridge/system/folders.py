"""Make sure the folders the bridge writes can be written, before anything opens them.

The usual mistake in a container is a bind mount owned by root (``-v $PWD/cache:/data/cache``)
while the bridge runs as uid 10001: opening the cache there used to end in a PermissionError
traceback, and a restart policy turned that into a loop. Here each such folder gives one log
line naming the folder, its owner and the fix, and the bridge runs without that part: the
cache and the state folder move to a temporary folder (removed when the process ends, so the
bridge still caches and still serves audio URLs, just not across a restart); a models folder
that cannot be written only stops ``models add`` from recording files there.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path

from tts_bridge.config import Settings
from tts_bridge.system.degraded import Degraded

_LOGGER = logging.getLogger(__name__)


class FolderError(Exception):
    """No folder at all can be written (not even a temporary one): the bridge cannot start."""


def write_problem(folder: Path) -> OSError | None:
    """Why ``folder`` cannot be created or written (None when it can), found by trying."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        return exc
    return None


def owner_text(folder: Path) -> str:
    """Who owns ``folder`` (or its nearest existing parent) and who the bridge runs as."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        info = existing.stat()
        mode = info.st_mode & 0o7777
        owned = f"{existing} belongs to {info.st_uid}:{info.st_gid}, mode {mode:04o}"
    except OSError as exc:
        owned = f"{existing} cannot be examined ({exc.strerror})"
    return f"{owned}; the bridge runs as {os.geteuid()}:{os.getegid()}"


def _fix(folder: Path) -> str:
    return (
        f"fix: give the folder to the bridge's user, e.g. on the host `sudo chown -R "
        f"{os.geteuid()}:{os.getegid()} <the folder mounted at {folder}>`"
    )


LAST_RESORT = Path("/dev/shm")
"""Memory every container has writable, even with a read-only root and no tmpfs on /tmp; the
cache treats it filling up like a full disk."""


def _temporary(part: str) -> Path:
    """A fresh folder for `part`, removed when the process ends: a bridge restarted again and
    again with the same unwritable mount would otherwise leave one behind per start (on
    /dev/shm, in memory)."""
    try:
        folder = Path(tempfile.mkdtemp(prefix=f"tts_bridge-{part}-"))
    except OSError as exc:
        problem = exc
        try:
            folder = Path(tempfile.mkdtemp(prefix=f"tts_bridge-{part}-", dir=LAST_RESORT))
        except OSError:
            raise FolderError(
                f"no writable folder for the {part}: {problem.strerror} (mount a writable "
                "volume, or a tmpfs on /tmp for a read-only container)"
            ) from None
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _temporary_files_somewhere() -> None:
    """Point Python's temporary folder at memory when none of the usual ones can be written (a
    read-only container without a tmpfs on /tmp), so the libraries that keep files there work
    as elsewhere: jieba, which segments Mandarin, cannot even start without one."""
    try:
        usual: Path | None = Path(tempfile.gettempdir())
    except FileNotFoundError:  # no candidate folder is writable
        usual = None
    if usual is not None and write_problem(usual) is None:
        return
    if write_problem(LAST_RESORT) is not None:
        return  # nothing better: the folders below then say so
    tempfile.tempdir = str(LAST_RESORT)
    _LOGGER.warning(
        "No writable temporary folder (%s): temporary files go to %s, in memory; mount a "
        "tmpfs on /tmp for a read-only container",
        usual or "/tmp, /var/tmp and $TMPDIR are not writable",
        LAST_RESORT,
    )


def prepare(settings: Settings, degraded: Degraded) -> Settings:
    """``settings`` with each unwritable cache or state folder replaced by a temporary one;
    each problem is logged once and recorded in ``degraded``. Raises FolderError when not even
    a temporary folder can be made."""
    _temporary_files_somewhere()
    cache_dir = settings.cache.dir
    state_dir = settings.journal.path.parent
    problem = write_problem(cache_dir)
    if problem is not None:
        temporary = _temporary("cache")
        _LOGGER.warning(
            "Cannot write the cache folder %s (%s; %s): keeping the sentence cache%s in %s "
            "until the bridge stops; %s",
            cache_dir,
            problem.strerror,
            owner_text(cache_dir),
            " and the audio behind URLs" if settings.http.dir is None else "",
            temporary,
            _fix(cache_dir),
        )
        degraded.set("cache", f"{cache_dir} not writable; using a temporary folder")
        settings = settings.model_copy(
            update={"cache": settings.cache.model_copy(update={"dir": temporary})}
        )
    problem = write_problem(state_dir)
    if problem is not None:
        temporary = _temporary("state")
        _LOGGER.warning(
            "Cannot write the state folder %s (%s; %s): the request journal and the audio URL "
            "key live in %s until the bridge stops (accepted requests and URLs do not survive "
            "a restart); %s",
            state_dir,
            problem.strerror,
            owner_text(state_dir),
            temporary,
            _fix(state_dir),
        )
        degraded.set("state", f"{state_dir} not writable; journal and URL key are temporary")
        journal = settings.journal.model_copy(
            update={"path": temporary / settings.journal.path.name}
        )
        settings = settings.model_copy(update={"journal": journal})
    models_dir = settings.models.dir
    problem = write_problem(models_dir)
    if problem is not None:
        _LOGGER.warning(
            "Cannot write the models folder %s (%s; %s): bundled voices and the models already "
            "there work, `tts-bridge models add` cannot record files; %s",
            models_dir,
            problem.strerror,
            owner_text(models_dir),
            _fix(models_dir),
        )
        degraded.set("models", f"{models_dir} not writable; models add cannot record files")
    return settings
