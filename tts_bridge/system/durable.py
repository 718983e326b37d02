"""One durable file write: a reader sees the old file or the new one, never half of either.

The data goes to a temporary file in the same folder, is flushed and fsynced, renamed over the
target, and the folder is fsynced so the rename itself survives a power cut (a Raspberry Pi's SD
card loses more than a server's disk). Every writer of state the bridge reads back uses this.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

_LOGGER = logging.getLogger(__name__)

_TEMP_SUFFIX = ".tmp"


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable.

    Best effort: some file systems refuse to open or fsync a folder (EINVAL on some network and
    FUSE mounts, and Windows); the file's own data is synced by then, so that is only logged.
    """
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        _LOGGER.debug("Cannot open %s to fsync it: %s", folder, exc)
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        _LOGGER.debug("Cannot fsync %s: %s", folder, exc)
    finally:
        os.close(fd)


def is_partial(name: str) -> bool:
    """Whether a file name is one of write_atomic's temporary files (left by a crash when it
    is still there), so folder sweeps can tell them from real content."""
    return name.startswith(".") and name.endswith(_TEMP_SUFFIX)


def write_atomic(
    path: Path,
    data: bytes | str,
    *,
    mode: int | None = None,
    times: tuple[float, float] | None = None,
) -> None:
    """Replace `path` with `data` durably (text is UTF-8).

    `mode` sets the file's permissions (the temporary file is 0600 until then); `times` sets
    its (atime, mtime) before it appears under its name, for stores that keep an expiry there.
    Raises OSError (a full disk, a read-only folder) with the target untouched and no temporary
    file left behind.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TEMP_SUFFIX)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        if times is not None:
            os.utime(tmp, times)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
