"""One durable file write: a reader sees the old file or the new one, never half of either.

The data goes to a temporary file in the same folder, is flushed and fsynced, renamed over the
target, and the folder is fsynced so the rename itself survives a power cut (a Raspberry Pi's SD
card loses more than a server's disk). Every writer of state the bridge reads back uses this.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in `folder` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems (and Windows) refuse fsync on a folder; the data is synced
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str, *, mode: int | None = None) -> None:
    """Replace `path` with `data` durably (text is UTF-8); `mode` sets the file's permissions.

    Raises OSError (a full disk, a read-only folder) with the target untouched and no temporary
    file left behind.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
