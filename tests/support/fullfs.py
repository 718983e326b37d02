"""A real small filesystem that can be filled up or made read-only (a tmpfs; needs root).

Storage faults are tested on a real filesystem, not a mocked write: SQLite, diskcache and the
kernel decide together which call fails, and that is what the bridge must survive.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


class SmallFs:
    """A mounted tmpfs of a few hundred KiB with helpers to fill it and free it again."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._filler = root / "filler"

    def fill(self) -> None:
        """Write a filler file until the filesystem is full (the last write gets ENOSPC)."""
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1 << 16, 4096, 512, 1):  # big blocks first, then what is left over
                while True:
                    try:
                        os.write(fd, b"\0" * size)
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
                        break
        finally:
            os.close(fd)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)

    def remount(self, mode: str) -> None:
        """'ro' or 'rw'."""
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.root)], check=True)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "1m") -> Iterator[SmallFs]:
    """Mount a tmpfs of ``size`` at ``where`` (created); skips the test unless we can."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full filesystem needs root (mount -t tmpfs)")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield SmallFs(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
