"""`tts-bridge service install|uninstall`: run a script install as a systemd service.

The unit runs this venv's own `tts-bridge run` with the configuration file given as an absolute
path, restarts it when it fails, raises its open-file limit for the doors' connections, and
starts it at boot (a system unit, as the installing user) or at login (a `--user` unit).
"""

from __future__ import annotations

import argparse
import getpass
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from tts_bridge.cli.parsing import add_command
from tts_bridge.config import Settings
from tts_bridge.system.durable import write_atomic

UNIT_NAME = "tts-bridge.service"
UNIT_DIR_ENV = "TTS_BRIDGE_UNIT_DIR"
"""Where the unit file goes instead of systemd's folder (tests, packaging)."""
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
OPEN_FILES = 65536
"""The bridge fits its connection caps under this limit (it raises the soft limit to it)."""


def user_unit_dir() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user"


def unit_dir(user: bool, override: Path | None = None) -> Path:
    if override is not None:
        return override
    if os.environ.get(UNIT_DIR_ENV):
        return Path(os.environ[UNIT_DIR_ENV])
    return user_unit_dir() if user else SYSTEM_UNIT_DIR


def bridge_command() -> list[str]:
    """This venv's `tts-bridge` (not whichever is first on PATH), or its Python running the
    package when the command is not installed next to it."""
    bin_dir = Path(sys.executable).parent  # the venv's bin/, not the interpreter it links to
    script = bin_dir / "tts-bridge"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script.absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "tts_bridge"]


def _run_as() -> str | None:
    """The user a system unit runs as: whoever installs it (through sudo: who called sudo)."""
    if os.geteuid() != 0:
        return getpass.getuser()
    return os.environ.get("SUDO_USER") or None


def _quote(word: str) -> str:
    """One ExecStart word; systemd reads C-style double quotes and expands % specifiers."""
    word = word.replace("%", "%%")
    if word and all(c.isalnum() or c in "/._-+=:," for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_unit(
    config: Path | None,
    user: bool,
    command: list[str] | None = None,
    cache_dir: Path | None = None,
) -> str:
    """The unit file's text. Paths are made absolute: the service does not start where the
    command was typed."""
    argv = [*(command or bridge_command()), "run"]
    if config is not None:
        argv += ["--config", str(config.expanduser().absolute())]
    if cache_dir is not None:
        argv += ["--cache-dir", str(cache_dir.expanduser().absolute())]
    lines = [
        "[Unit]",
        "Description=tts_bridge text-to-speech bridge (MQTT, Wyoming, audio URLs)",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=exec",
        f"ExecStart={' '.join(_quote(word) for word in argv)}",
        # SIGHUP reads the voices file again, as `kill -HUP` does for a bridge run by hand.
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "RestartSec=5",
        f"LimitNOFILE={OPEN_FILES}",
        # Log lines reach the journal as they are written.
        "Environment=PYTHONUNBUFFERED=1",
    ]
    run_as = None if user else _run_as()
    if run_as:
        lines.append(f"User={run_as}")
    if config is not None:
        # The rest of the line is the path (no quotes); only % is special.
        folder = str(config.expanduser().absolute().parent).replace("%", "%%")
        lines.append(f"WorkingDirectory={folder}")
    lines += ["", "[Install]", f"WantedBy={'default.target' if user else 'multi-user.target'}"]
    return "\n".join(lines) + "\n"


def _systemctl(user: bool, *words: str) -> str:
    if user:
        return f"systemctl --user {' '.join(words)}"
    prefix = "systemctl" if os.geteuid() == 0 else "sudo systemctl"
    return f"{prefix} {' '.join(words)}"


def _config_path(args: argparse.Namespace) -> Path | None:
    if args.config is not None:
        return Path(args.config)
    from_env = os.environ.get("TTS_BRIDGE_CONFIG")
    return Path(from_env) if from_env else None


def cmd_service_install(args: argparse.Namespace, settings: Settings) -> int:
    """Write the unit (or print it with --print) and say how to start it."""
    config = _config_path(args)
    if config is not None and not config.expanduser().is_file():
        print(f"tts-bridge: no configuration file {config}", file=sys.stderr)
        return 2
    unit = render_unit(config, args.user, cache_dir=args.cache_dir)
    if args.print:
        sys.stdout.write(unit)
        return 0
    folder = unit_dir(args.user, args.unit_dir)
    path = folder / UNIT_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(path, unit, mode=0o644)
    except OSError as exc:
        hint = "" if args.user else " (run it with sudo, or install a --user unit)"
        print(f"tts-bridge: cannot write {path}: {exc.strerror or exc}{hint}", file=sys.stderr)
        return 1
    name = UNIT_NAME.removesuffix(".service")
    print(f"wrote {path}")
    if config is None:
        print("  (no --config: the service runs with the default settings)")
    print("start it now and at every boot with:")
    print(f"  {_systemctl(args.user, 'daemon-reload')}")
    print(f"  {_systemctl(args.user, 'enable', '--now', name)}")
    if args.user:
        user = shlex.quote(getpass.getuser())
        print(f"  loginctl enable-linger {user}   # keep it running when you are logged out")
    print(f"its log: journalctl {'--user ' if args.user else ''}-u {name} -f")
    return 0


def cmd_service_uninstall(args: argparse.Namespace, settings: Settings) -> int:
    """Remove the unit and the links `systemctl enable` made beside it."""
    folder = unit_dir(args.user, args.unit_dir)
    path = folder / UNIT_NAME
    links = [link for link in folder.glob(f"*.wants/{UNIT_NAME}") if link.is_symlink()]
    if not path.exists() and not links:
        print(f"tts-bridge: no {UNIT_NAME} in {folder}", file=sys.stderr)
        return 1
    name = UNIT_NAME.removesuffix(".service")
    try:
        for link in links:
            link.unlink()
        path.unlink(missing_ok=True)
    except OSError as exc:
        hint = "" if args.user else " (run it with sudo)"
        print(f"tts-bridge: cannot remove {path}: {exc.strerror or exc}{hint}", file=sys.stderr)
        return 1
    print(f"removed {path}")
    print("stop a running bridge and forget the unit with:")
    print(f"  {_systemctl(args.user, 'stop', name)}")
    print(f"  {_systemctl(args.user, 'daemon-reload')}")
    return 0


def add_service_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    place = argparse.ArgumentParser(add_help=False)
    place.add_argument(
        "--user",
        action="store_true",
        help="a user unit (~/.config/systemd/user, started at login) instead of a system one",
    )
    place.add_argument(
        "--unit-dir",
        type=Path,
        help=f"folder for the unit file (default: systemd's; or ${UNIT_DIR_ENV})",
    )
    parser = add_command(
        sub,
        "service",
        "run the bridge as a systemd service",
        "Install or remove a systemd unit that runs this installation's `tts-bridge run`.",
        [],
    )
    service_sub = parser.add_subparsers(dest="service_command", required=True)
    install = add_command(
        service_sub,
        "install",
        "write the systemd unit",
        "Write tts-bridge.service: this venv's tts-bridge run with --config (absolute), "
        "Restart=on-failure, a raised open-file limit; then print how to enable it. A system "
        "unit runs as the user who installs it (the one who called sudo).",
        [common, place],
    )
    install.add_argument(
        "--print", action="store_true", help="write the unit to standard output instead"
    )
    install.set_defaults(func=cmd_service_install)
    uninstall = add_command(
        service_sub,
        "uninstall",
        "remove the systemd unit",
        "Remove tts-bridge.service and its enable links; print how to stop the bridge.",
        [common, place],
    )
    uninstall.set_defaults(func=cmd_service_uninstall)
