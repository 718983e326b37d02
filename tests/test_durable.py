"""The one durable write, on real files: what lands, what a failure leaves behind.

The full disk is a real tmpfs (root only), so the failure is the kernel's ENOSPC in the middle of
the write, not a mocked call.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

import pytest

from tests.support.fullfs import small_tmpfs
from tts_bridge.system.durable import fsync_dir, is_partial, write_atomic


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if is_partial(p.name))


def test_bytes_and_text_land_whole_and_replace_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "state" / "prefs.json"  # the folder is made when missing
    write_atomic(target, b"\x00old\xff")
    assert target.read_bytes() == b"\x00old\xff"
    write_atomic(target, "néw ✓\n")
    assert target.read_bytes() == "néw ✓\n".encode()
    assert _leftovers(target.parent) == []


def test_mode_and_times_are_set_before_the_file_appears(tmp_path: Path) -> None:
    target = tmp_path / "audio.mp3"
    write_atomic(target, b"data", mode=0o640, times=(1_000_000.0, 2_000_000_000.0))
    info = target.stat()
    assert stat.S_IMODE(info.st_mode) == 0o640
    assert info.st_mtime == 2_000_000_000.0


def test_without_a_mode_only_the_owner_may_read(tmp_path: Path) -> None:
    target = tmp_path / "secret.key"
    write_atomic(target, b"k" * 32)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_failed_rename_keeps_what_was_there_and_leaves_no_temporary_file(
    tmp_path: Path,
) -> None:
    # A folder in the target's place: the data is written and synced, the rename fails.
    target = tmp_path / "taken"
    target.mkdir()
    (target / "inside").write_text("kept", encoding="utf-8")
    with pytest.raises(OSError):
        write_atomic(target, b"new")
    assert (target / "inside").read_text(encoding="utf-8") == "kept"
    assert _leftovers(tmp_path) == []


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small", size="256k") as fs:
        target = fs.root / "manifest.json"
        write_atomic(target, "old\n")
        with pytest.raises(OSError) as raised:
            write_atomic(target, b"x" * (1 << 20))  # four times the disk
        assert raised.value.errno == errno.ENOSPC
        assert target.read_text(encoding="utf-8") == "old\n"
        assert _leftovers(fs.root) == []
        write_atomic(target, "new\n")  # the space came back with the temporary file
        assert target.read_text(encoding="utf-8") == "new\n"


def test_a_folder_that_cannot_be_synced_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tts_bridge.system.durable")
    fsync_dir(tmp_path / "gone")
    assert "gone" in caplog.text


def test_the_temporary_file_is_known_as_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sweeps of a shared folder must recognise what a crash before the rename would leave.
    renamed: list[str] = []
    real_replace = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        renamed.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_atomic(tmp_path / "0123456789abcdef0123456789abcdef.mp3", b"x")
    assert len(renamed) == 1 and is_partial(renamed[0])
    assert not is_partial("0123456789abcdef0123456789abcdef.mp3")
    assert not is_partial(".hidden")
