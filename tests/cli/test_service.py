"""`tts-bridge service`: the unit it writes is one systemd accepts, install and uninstall work
on a folder of their own, and a bad configuration is refused before anything is written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tts_bridge.cli.main import main
from tts_bridge.cli.service import UNIT_DIR_ENV, UNIT_NAME, bridge_command, render_unit

CONFIG = "mqtt:\n  host: 127.0.0.1\n"


def unit_lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def verify(unit: Path, *extra: str) -> None:
    """systemd's own check of the unit: a bad value is a warning on stderr (exit 0), a missing
    binary an error, so both count."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    done = subprocess.run(
        [analyze, *extra, "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    problems = [line for line in done.stderr.splitlines() if unit.name in line]
    assert done.returncode == 0 and not problems, done.stdout + done.stderr


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "my config" / "config.yaml"  # a space: ExecStart must quote it
    path.parent.mkdir()
    path.write_text(CONFIG, encoding="utf-8")
    return path


def test_print_writes_a_unit_systemd_accepts(
    config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(config.parent)
    assert main(["service", "install", "--config", "config.yaml", "--print"]) == 0
    text = capsys.readouterr().out
    unit = unit_lines(text)
    binary = bridge_command()[0]
    assert binary == str(Path(sys.executable).parent / "tts-bridge"), "this venv's own command"
    assert unit["ExecStart"] == f'{binary} run --config "{config}"', "the config, absolute"
    assert unit["Restart"] == "on-failure"
    assert int(unit["LimitNOFILE"]) >= 4096
    assert unit["WantedBy"] == "multi-user.target"
    assert unit["WorkingDirectory"] == str(config.parent)
    path = tmp_path / UNIT_NAME
    path.write_text(text, encoding="utf-8")
    verify(path)
    assert not list(tmp_path.glob("*/" + UNIT_NAME)), "--print writes no file"


def test_a_system_unit_runs_as_the_installing_user(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() == 0:
        monkeypatch.setenv("SUDO_USER", "speaker")
        assert unit_lines(render_unit(None, user=False))["User"] == "speaker"
        monkeypatch.delenv("SUDO_USER")
        assert "User" not in unit_lines(render_unit(None, user=False)), "root's own unit"
    else:
        import getpass

        assert unit_lines(render_unit(None, user=False))["User"] == getpass.getuser()
    assert "User" not in unit_lines(render_unit(None, user=True)), "a user unit is the user's"


def test_a_user_unit_starts_at_login(tmp_path: Path) -> None:
    text = render_unit(Path("/etc/tts_bridge/config.yaml"), user=True)
    unit = unit_lines(text)
    assert unit["WantedBy"] == "default.target"
    assert unit["ExecStart"].endswith(" run --config /etc/tts_bridge/config.yaml")
    path = tmp_path / UNIT_NAME
    path.write_text(text, encoding="utf-8")
    verify(path)


def test_a_cache_folder_given_is_passed_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    unit = unit_lines(render_unit(None, user=True, cache_dir=Path("cache")))
    assert unit["ExecStart"].endswith(f" run --cache-dir {tmp_path / 'cache'}")


def test_a_percent_sign_is_not_a_systemd_specifier(tmp_path: Path) -> None:
    text = render_unit(Path("/srv/100%/config.yaml"), user=False)
    unit = unit_lines(text)
    assert unit["ExecStart"].endswith(' --config "/srv/100%%/config.yaml"')
    assert unit["WorkingDirectory"] == "/srv/100%%"
    path = tmp_path / UNIT_NAME
    path.write_text(text, encoding="utf-8")
    verify(path)


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a wrong restart value and a missing binary are reported."""
    text = render_unit(None, user=False, command=["/nonexistent/tts-bridge"])
    path = tmp_path / UNIT_NAME
    path.write_text(text, encoding="utf-8")
    with pytest.raises(AssertionError, match="not executable"):
        verify(path)
    path.write_text(render_unit(None, False).replace("on-failure", "sometimes"), encoding="utf-8")
    with pytest.raises(AssertionError, match="restart"):
        verify(path)


def test_install_then_uninstall_in_a_folder_of_their_own(
    config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    units = tmp_path / "units"
    monkeypatch.setenv(UNIT_DIR_ENV, str(units))
    assert main(["service", "install", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    path = units / UNIT_NAME
    assert f"wrote {path}" in out and "enable --now tts-bridge" in out and "daemon-reload" in out
    assert unit_lines(path.read_text("utf-8"))["Restart"] == "on-failure"
    assert path.stat().st_mode & 0o777 == 0o644
    # What `systemctl enable` adds beside the unit goes with it.
    (units / "multi-user.target.wants").mkdir()
    (units / "multi-user.target.wants" / UNIT_NAME).symlink_to(path)
    assert main(["service", "uninstall"]) == 0
    assert f"removed {path}" in capsys.readouterr().out
    assert not path.exists() and not list(units.rglob(UNIT_NAME))
    assert main(["service", "uninstall"]) == 1
    assert f"no {UNIT_NAME} in {units}" in capsys.readouterr().err


def test_a_user_install_says_how_to_keep_it_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(UNIT_DIR_ENV, raising=False)
    monkeypatch.delenv("TTS_BRIDGE_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert main(["service", "install", "--user"]) == 0
    out = capsys.readouterr().out
    path = tmp_path / "xdg" / "systemd" / "user" / UNIT_NAME
    assert path.is_file() and "systemctl --user enable --now tts-bridge" in out
    assert "loginctl enable-linger" in out and "default settings" in out
    assert main(["service", "uninstall", "--user"]) == 0 and not path.exists()


def test_a_bad_configuration_or_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    units = tmp_path / "units"
    bad = tmp_path / "bad.yaml"
    bad.write_text("mqtt:\n  port: many\n", encoding="utf-8")
    assert main(["service", "install", "--config", str(bad), "--unit-dir", str(units)]) == 2
    assert "port" in capsys.readouterr().err and not units.exists()
    blocked = tmp_path / "a file"
    blocked.write_text("", encoding="utf-8")
    good = tmp_path / "good.yaml"
    good.write_text(CONFIG, encoding="utf-8")
    code = main(["service", "install", "--config", str(good), "--unit-dir", str(blocked)])
    assert code == 1 and f"cannot write {blocked / UNIT_NAME}" in capsys.readouterr().err
