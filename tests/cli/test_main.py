"""The command line as a user meets it: help texts, one-line errors, say -o -, progress output."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from tests.support.harness import REPO_ROOT
from tts_bridge.cli.main import _settings, build_parser


def _subcommands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.append((*prefix, name))
                found += _subcommands(child, (*prefix, name))
    return found


def _clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTS_BRIDGE_")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def _run(tmp_path: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "tts_bridge", *args],
        input=stdin,
        capture_output=True,
        env=_clean_env(tmp_path),
        timeout=120,
        check=False,
    )


COMMANDS = _subcommands(build_parser())


def test_every_command_is_listed() -> None:
    assert {("cache", "stats"), ("cache", "clear"), ("models", "add"), ("voices", "new")} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_subcommand_help_has_its_own_description(
    command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    with pytest.raises(SystemExit) as done:
        parser.parse_args([*command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: tts-bridge {' '.join(command)} ")
    description = text.split("\n\n")[1]
    assert not description.startswith(("positional arguments", "options")), text
    assert "MQTT text-to-speech bridge for the home" not in text, "the parent's help"
    assert "(default: None)" not in text


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["play", "--help"])
    assert "(default: default)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    assert "(default: 200)" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["run", "play", "doctor"])
def test_broker_commands_take_host_and_port(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("TTS_BRIDGE_")]:
        monkeypatch.delenv(name)
    args = build_parser().parse_args([command, "--host", "broker.lan", "--port", "1884"])
    mqtt = _settings(args).mqtt
    assert (mqtt.host, mqtt.port) == ("broker.lan", 1884)


def test_cache_stats_and_clear(tmp_path: Path) -> None:
    done = _run(tmp_path, "cache", "stats", "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert (stats["dir"], stats["entries"]) == (str(tmp_path / "c"), 0)
    done = _run(tmp_path, "cache")
    assert done.returncode == 2
    assert b"stats,clear" in done.stderr


def test_say_checks_the_output_folder_before_synthesis(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "folder"
    # An unknown voice would fail the synthesis with exit 1: exit 2 shows the folder came first.
    done = _run(tmp_path, "say", "Hello.", "-o", str(missing / "x.wav"), "--voice", "nobody")
    assert done.returncode == 2
    lines = done.stderr.decode().strip().splitlines()
    assert lines == [
        f"tts-bridge: say -o: folder {missing} does not exist; create it first (mkdir -p {missing})"
    ]
    done = _run(tmp_path, "say", "Hello.", "-o", str(tmp_path))
    assert done.returncode == 2
    assert b"is a folder" in done.stderr


def test_prerender_missing_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "phrases.txt"
    done = _run(tmp_path, "prerender", "--file", str(missing))
    assert done.returncode == 2
    assert done.stderr.decode().strip().splitlines() == [
        f"tts-bridge: prerender --file: cannot read {missing}: No such file or directory"
    ]


@pytest.mark.slow
def test_say_to_stdout_and_prerender_off_a_terminal(tmp_path: Path) -> None:
    """Real Piper: `say -o -` is a WAV on stdout; prerender writes no \\r when piped."""
    done = _run(tmp_path, "say", "-", "-o", "-", stdin=b"Dinner is ready.")
    assert done.returncode == 0, done.stderr
    with wave.open(io.BytesIO(done.stdout)) as wav:
        assert wav.getframerate() == 22050
        assert wav.getnframes() > 0
    assert not (tmp_path / "-").exists()
    assert done.stderr.startswith(b"(stdout): ") or b"\n(stdout): " in done.stderr
    assert b"voice joe (piper)" in done.stderr

    phrases = tmp_path / "phrases.txt"
    phrases.write_text("# a comment\nDinner is ready.\nGood night.\n", encoding="utf-8")
    done = _run(tmp_path, "prerender", "--file", str(phrases))
    assert done.returncode == 0, done.stderr
    assert b"\r" not in done.stderr
    assert done.stdout.decode().strip() == "2 sentences for voice joe: 1 rendered, 1 cached"


def test_voices_table_has_a_header_languages_and_fast_voices(tmp_path: Path) -> None:
    done = _run(tmp_path, "voices")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    header = lines[0].split()
    assert header[:5] == ["VOICE", "ENGINE", "BACKEND", "TIER", "LANGUAGES"]
    assert "FAST" in header
    joe = next(line.split() for line in lines if " joe " in line)
    assert joe[:3] == ["*", "joe", "piper"]
    assert "en" in joe
    assert joe[joe.index("Hz") + 1] == "heart", "joe's fast voice"


@pytest.mark.parametrize("debug", [False, True])
def test_numba_compiler_passes_stay_out_of_the_log(debug: bool) -> None:
    from tts_bridge.cli.main import _setup_logging

    root = logging.getLogger()
    saved = root.level, list(root.handlers), logging.getLogger("numba").level
    try:
        _setup_logging(None, debug)
        assert logging.getLogger("numba.core.ssa").getEffectiveLevel() == logging.WARNING
        wanted = logging.DEBUG if debug else logging.INFO
        assert logging.getLogger("tts_bridge.mqtt").getEffectiveLevel() == wanted
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        logging.getLogger("numba").setLevel(saved[2])
