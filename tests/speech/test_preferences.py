"""Saved run-time choices: round trip, file safety, damaged files, restoring the default voice."""

from __future__ import annotations

import json
import logging
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tts_bridge.config import Settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.preferences import (
    FILE_NAME,
    Preferences,
    PreferencesError,
    restore_default_voice,
)


def test_a_saved_voice_is_read_back_by_the_next_start(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    preferences = Preferences(path)
    assert preferences.default_voice is None
    preferences.save_default_voice("heart")
    assert preferences.default_voice == "heart"
    assert Preferences(path).default_voice == "heart"
    assert json.loads(path.read_text(encoding="utf-8")) == {"version": 1, "default_voice": "heart"}
    preferences.save_default_voice("joe")
    assert Preferences(path).default_voice == "joe"


def test_it_lives_beside_the_journal(tmp_path: Path) -> None:
    journal = tmp_path / "state" / "journal.sqlite3"
    assert Preferences.beside(journal).path == tmp_path / "state" / FILE_NAME


def test_the_file_is_private_and_no_temporary_file_is_left(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "state"
    preferences = Preferences(folder / FILE_NAME)
    preferences.save_default_voice("heart")
    preferences.save_default_voice("joe")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / FILE_NAME).stat().st_mode) == 0o600
    assert [p.name for p in folder.iterdir()] == [FILE_NAME]


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'["heart"]', b'{"default_voice": 42}', b'{"default_voice": ""}', b"\xff\xfe"],
)
def test_a_damaged_file_is_reported_and_replaced_by_the_next_choice(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        preferences = Preferences(path)
    assert preferences.default_voice is None
    if content.startswith(b'{"default_voice"'):
        assert not caplog.records  # valid JSON of the wrong type: just no choice
    else:
        assert str(path) in caplog.text
    preferences.save_default_voice("heart")
    assert Preferences(path).default_voice == "heart"


def test_keys_of_a_later_version_are_kept_when_saving(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    path.write_text('{"version": 1, "default_voice": "joe", "volume": 0.5}', encoding="utf-8")
    Preferences(path).save_default_voice("heart")
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "version": 1,
        "default_voice": "heart",
        "volume": 0.5,
    }


def test_a_failed_save_raises_and_changes_nothing(tmp_path: Path) -> None:
    # A folder where the file should be: reading warns, and the rename over it fails (this works
    # as root too, unlike a read-only folder).
    path = tmp_path / FILE_NAME
    path.mkdir()
    preferences = Preferences(path)
    with pytest.raises(PreferencesError, match="cannot save"):
        preferences.save_default_voice("heart")
    assert preferences.default_voice is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]  # the temporary file is gone


def test_a_writer_killed_at_any_moment_leaves_a_whole_file(tmp_path: Path) -> None:
    path = tmp_path / FILE_NAME
    Preferences(path).save_default_voice("joe")
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from tts_bridge.speech.preferences import Preferences
        p = Preferences(Path({str(path)!r}))
        print("ready", flush=True)
        while True:
            p.save_default_voice("heart")
            p.save_default_voice("joe" * 2000)
        """
    )
    for _ in range(3):
        writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        time.sleep(0.2)
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
        assert Preferences(path).default_voice in {"heart", "joe" * 2000, "joe"}


@pytest.fixture
def engines() -> EnginePool:
    # The default settings' voices (joe, heart); building the pool loads no model.
    return EnginePool(Settings())


def test_restore_makes_the_saved_voice_the_default(tmp_path: Path, engines: EnginePool) -> None:
    preferences = Preferences(tmp_path / FILE_NAME)
    preferences.save_default_voice("heart")
    restore_default_voice(preferences, engines)
    assert engines.default_voice == "heart"


def test_restore_without_a_saved_voice_keeps_the_configured_one(
    tmp_path: Path, engines: EnginePool
) -> None:
    restore_default_voice(Preferences(tmp_path / FILE_NAME), engines)
    assert engines.default_voice == "joe"


def test_a_saved_voice_no_longer_configured_warns_and_keeps_the_configured_one(
    tmp_path: Path, engines: EnginePool, caplog: pytest.LogCaptureFixture
) -> None:
    preferences = Preferences(tmp_path / FILE_NAME)
    preferences.save_default_voice("xiaoyu")
    with caplog.at_level(logging.WARNING):
        restore_default_voice(preferences, engines)
    assert engines.default_voice == "joe"
    assert "'xiaoyu'" in caplog.text and "no longer configured" in caplog.text
