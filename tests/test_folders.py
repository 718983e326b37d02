"""Folders the bridge cannot write: one line naming the folder, its owner and the fix; the
cache and state move to temporary folders, and health says degraded instead of a crash."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tts_bridge import app
from tts_bridge.config import Settings, load_settings
from tts_bridge.system import folders
from tts_bridge.system.degraded import Degraded


def blocked(tmp_path: Path, name: str) -> Path:
    """A folder that cannot be created, whoever runs the test (root included): its parent is a
    regular file. The permission case (a root-owned mount) runs in script/docker-check."""
    parent = tmp_path / f"{name}-is-a-file"
    parent.write_text("", encoding="utf-8")
    return parent / name


def settings_with(tmp_path: Path, **dirs: Path) -> Settings:
    env = {
        "TTS_BRIDGE_CACHE__DIR": str(dirs.get("cache", tmp_path / "cache")),
        "TTS_BRIDGE_MODELS__DIR": str(dirs.get("models", tmp_path / "models")),
        "TTS_BRIDGE_JOURNAL__PATH": str(dirs.get("state", tmp_path / "state") / "journal.sqlite3"),
        "TTS_BRIDGE_VOICES_FILE": str(tmp_path / "state" / "voices.yaml"),
    }
    return load_settings(None, environ=env)


def test_writable_folders_change_nothing(tmp_path: Path) -> None:
    settings = settings_with(tmp_path)
    degraded = Degraded()
    assert folders.prepare(settings, degraded) is settings
    assert degraded.report() == {"status": "ok", "degraded": {}}
    assert (tmp_path / "cache").is_dir() and (tmp_path / "state").is_dir()
    assert not list((tmp_path / "cache").iterdir()), "the write check leaves nothing behind"


def test_an_unwritable_cache_moves_to_a_temporary_folder_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = blocked(tmp_path, "cache")
    settings = settings_with(tmp_path, cache=cache)
    degraded = Degraded()
    with caplog.at_level(logging.WARNING):
        prepared = folders.prepare(settings, degraded)
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"Cannot write the cache folder {cache}" in line
    assert f"{cache.parent} belongs to {os.getuid()}:{os.getgid()}, mode" in line
    assert f"chown -R {os.geteuid()}:{os.getegid()}" in line
    assert prepared.cache.dir != cache and prepared.cache.dir.is_dir()
    assert str(prepared.cache.dir) in line
    report = degraded.report()
    assert report["status"] == "degraded"
    assert set(report["degraded"]) == {"cache"}
    assert settings.cache.dir == cache, "the settings given are not changed"


def test_the_temporary_folders_go_when_the_process_ends(tmp_path: Path) -> None:
    """Each start on an unwritable mount makes new ones: none may outlive its process."""
    script = (
        "import sys\n"
        "from tts_bridge.system import folders\n"
        "from tts_bridge.system.degraded import Degraded\n"
        "from tests.test_folders import blocked, settings_with\n"
        "from pathlib import Path\n"
        "tmp = Path(sys.argv[1])\n"
        "s = folders.prepare(settings_with(tmp, cache=blocked(tmp, 'cache'), "
        "state=blocked(tmp, 'state')), Degraded())\n"
        "print(s.cache.dir, s.journal.path.parent)\n"
        "(s.cache.dir / 'entry').write_text('x')\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True, text=True, check=True, cwd=root, timeout=120,
    )  # fmt: skip
    made = [Path(p) for p in done.stdout.split()]
    assert len(made) == 2 and all(p.name.startswith("tts_bridge-") for p in made), done.stdout
    assert not any(p.exists() for p in made), made


def test_an_unwritable_state_folder_keeps_the_client_id(tmp_path: Path) -> None:
    state = blocked(tmp_path, "state")
    settings = settings_with(tmp_path, state=state)
    degraded = Degraded()
    prepared = folders.prepare(settings, degraded)
    assert prepared.journal.path.parent != state and prepared.journal.path.parent.is_dir()
    # The broker session is the bridge's across restarts: the id stays the configured folder's.
    assert prepared.mqtt.client_id == settings.mqtt.client_id
    assert set(degraded.parts()) == {"state"}


def test_an_unwritable_models_folder_is_reported_and_kept(tmp_path: Path) -> None:
    models = blocked(tmp_path, "models")
    settings = settings_with(tmp_path, models=models)
    degraded = Degraded()
    prepared = folders.prepare(settings, degraded)
    assert prepared.models.dir == models
    assert "models add cannot record files" in degraded.parts()["models"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_a_read_only_folder_names_its_owner_and_mode(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o555)
    problem = folders.write_problem(cache)
    assert isinstance(problem, PermissionError)
    assert f"{cache} belongs to {os.getuid()}:{os.getgid()}, mode 0555" in folders.owner_text(cache)


def test_without_a_temporary_folder_memory_is_the_last_resort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only container without a tmpfs on /tmp still starts (on /dev/shm there)."""
    monkeypatch.setattr(tempfile, "tempdir", str(blocked(tmp_path, "tmp")))
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(folders, "LAST_RESORT", shm)
    settings = settings_with(tmp_path, cache=blocked(tmp_path, "cache"))
    prepared = folders.prepare(settings, Degraded())
    assert prepared.cache.dir.parent == shm


def test_without_a_temporary_folder_libraries_get_memory_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A read-only container without a tmpfs on /tmp: Python finds no temporary folder at all,
    and jieba (Mandarin) could not start; after prepare it keeps its dictionary cache in
    memory like everything else."""
    import jieba

    monkeypatch.setattr(tempfile, "tempdir", None)
    unwritable = str(blocked(tmp_path, "tmp"))
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [unwritable])
    with pytest.raises(FileNotFoundError):
        jieba.Tokenizer().initialize()
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(folders, "LAST_RESORT", shm)
    with caplog.at_level(logging.WARNING):
        folders.prepare(settings_with(tmp_path), Degraded())
    (line,) = [r.getMessage() for r in caplog.records if r.name == folders.__name__]
    assert f"temporary files go to {shm}" in line
    assert tempfile.gettempdir() == str(shm)
    segmenter = jieba.Tokenizer()
    assert segmenter.lcut("晚饭准备好了") == ["晚饭", "准备", "好", "了"]
    assert (shm / "jieba.cache").is_file()


def test_no_temporary_folder_at_all_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(blocked(tmp_path, "tmp")))
    monkeypatch.setattr(folders, "LAST_RESORT", blocked(tmp_path, "shm"))
    settings = settings_with(tmp_path, cache=blocked(tmp_path, "cache"))
    with pytest.raises(folders.FolderError, match="no writable folder for the cache"):
        folders.prepare(settings, Degraded())


def test_the_service_reports_the_degraded_parts_in_health(tmp_path: Path) -> None:
    """Built for real (the broker is never reached): health names the folder and the broker."""
    settings = settings_with(tmp_path, cache=blocked(tmp_path, "cache"))
    service = app.build(settings)
    try:
        health = service.reports.health()
    finally:
        service.pipeline.synthesizer.cache.close()
    assert health["status"] == "degraded"
    assert set(health["degraded"]) == {"cache", "mqtt"}
    assert health["degraded"]["mqtt"] == "not connected to the broker"
