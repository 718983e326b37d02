"""The add-on folder as the Supervisor reads it: config.yaml against the Supervisor's rules for
add-on configs (required keys, slug, arch, ports, services, discovery, map, schema elements),
the options against their own schema, build.yaml, translations, images, the repository file,
and the version kept equal to the package's."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.harness import REPO_ROOT

ADDON = REPO_ROOT / "addon" / "tts_bridge"
ARCHES = {"amd64", "aarch64", "armv7", "armhf", "i386"}
MAP_TYPES = {"data", "config", "ssl", "share", "media", "backup", "homeassistant_config",
             "addon_config", "all_addon_configs", "addons"}  # fmt: skip
# The schema element grammar of the Supervisor's options (apps/options.py), as documented.
ELEMENT = re.compile(
    r"^(?:bool|email|url|port|device(?:\(subsystem=[a-z]+\))?"
    r"|str(?:\(\d*,\d*\))?|password(?:\(\d*,\d*\))?"
    r"|int(?:\(-?\d*,-?\d*\))?|float(?:\(-?[\d.]*,-?[\d.]*\))?"
    r"|match\(.*\)|list\(.+\))\??$"
)


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ADDON / name).read_text(encoding="utf-8"))
    return data


def package_version() -> str:
    with (REPO_ROOT / "pyproject.toml").open("rb") as file:
        version: str = tomllib.load(file)["project"]["version"]
    return version


def test_version_is_the_package_version() -> None:
    assert str(load("config.yaml")["version"]) == package_version()


def test_required_keys_slug_and_arch() -> None:
    config = load("config.yaml")
    for key in ("name", "version", "slug", "description", "arch"):
        assert config.get(key), f"config.yaml needs {key}"
    assert re.fullmatch(r"[-_.A-Za-z0-9]+", config["slug"]) and config["slug"] == "tts_bridge"
    assert set(config["arch"]) == {"amd64", "aarch64"} and set(config["arch"]) <= ARCHES
    # The address is written in by script/addon-repo (tests/test_release.py checks the result).
    assert "url" not in config
    assert config.get("init", True) is True, "the Python entry needs the Supervisor's init"


def test_ports_services_discovery_and_map() -> None:
    config = load("config.yaml")
    ports = config["ports"]
    assert set(ports) == {"10200/tcp", "10201/tcp"}
    for key, host_port in ports.items():
        assert re.fullmatch(r"\d+/(tcp|udp)", key)
        assert host_port is None or 1 <= int(host_port) <= 65535
    assert set(config["ports_description"]) == set(ports)
    assert all(isinstance(v, str) and v for v in config["ports_description"].values())
    for service in config["services"]:
        assert re.fullmatch(r"(mqtt|mysql):(provide|want|need)", service)
    assert "mqtt:want" in config["services"], "the bridge serves without a broker"
    assert config["discovery"] == ["wyoming"]
    for entry in config["map"]:
        kind = entry["type"] if isinstance(entry, dict) else entry.split(":")[0]
        assert kind in MAP_TYPES
    assert all(isinstance(p, str) for p in config["backup_exclude"])
    assert "*.onnx" in config["backup_exclude"]


def test_cold_backups_and_a_minimum_home_assistant() -> None:
    """The journal (SQLite) is copied only with the add-on stopped; the Supervisor refuses
    backup_pre/backup_post beside a cold backup, and reads `homeassistant` as a version."""
    config = load("config.yaml")
    assert config["backup"] == "cold"
    assert "backup_pre" not in config and "backup_post" not in config
    assert re.fullmatch(r"20\d\d\.\d{1,2}\.\d+", config["homeassistant"])
    assert isinstance(config["homeassistant"], str), "quoted, or YAML reads a float"
    # The journal lives in /data, which the backup holds; only the cache and models are left out.
    from tts_bridge.addon.options import addon_tree

    tree = addon_tree(Path("/data"), Path("/share/tts_bridge"))
    journal = Path(tree["journal"]["path"])
    assert journal.is_relative_to("/data")
    rel = str(journal.relative_to("/data"))
    assert not any(Path(rel).match(p) for p in config["backup_exclude"]), rel


def test_targets_and_phrases_may_be_empty() -> None:
    """A list whose element is optional may be empty in the Supervisor's form and validator."""
    schema = load("config.yaml")["schema"]
    for key in ("targets", "phrases"):
        assert str(schema[key][0]).endswith("?"), key


def _check_schema(element: Any, where: str) -> None:
    if isinstance(element, dict):
        for key, value in element.items():
            _check_schema(value, f"{where}.{key}")
    elif isinstance(element, list):
        assert len(element) == 1 and not isinstance(element[0], list), where
        _check_schema(element[0], f"{where}[]")
    else:
        assert ELEMENT.match(str(element)), f"{where}: {element!r} is not a schema element"


def _value_fits(value: Any, element: Any, where: str) -> None:
    """The Supervisor's check of an option value against its element (the types used here)."""
    if isinstance(element, list):
        assert isinstance(value, list), where
        for item in value:
            _value_fits(item, element[0], where + "[]")
        return
    if isinstance(element, dict):
        assert isinstance(value, dict), where
        for key, sub in element.items():
            if key in value:
                _value_fits(value[key], sub, f"{where}.{key}")
            else:
                assert str(sub).endswith("?"), f"{where}.{key} is required"
        return
    kind = str(element).rstrip("?")
    if kind.startswith("match("):
        assert re.fullmatch(kind[6:-1], str(value)), f"{where}: {value!r}"
    elif kind.startswith("list("):
        assert str(value) in kind[5:-1].split("|"), f"{where}: {value!r}"
    elif kind in ("str", "password", "url"):
        assert isinstance(value, str), where
    elif kind == "port":
        assert isinstance(value, int) and 1 <= value <= 65535, where
    elif kind == "bool":
        assert isinstance(value, bool), where
    else:
        pytest.fail(f"{where}: no check for {kind}")


def test_schema_is_valid_and_covers_the_options() -> None:
    config = load("config.yaml")
    schema, options = config["schema"], config["options"]
    _check_schema(schema, "schema")
    assert set(options) <= set(schema), "every option has a schema entry"
    for key, element in schema.items():
        if key in options:
            _value_fits(options[key], element, key)
        else:
            assert str(element).endswith("?"), f"{key} has no default, so it must be optional"
    # What the Python side reads is exactly what the schema offers.
    from tts_bridge.addon.options import LOG_LEVELS, VOICE_KEYS

    assert set(schema["voices"][0]) == {"name", *VOICE_KEYS}
    assert schema["log_level"] == f"list({'|'.join(LOG_LEVELS)})"


def test_build_yaml_uses_debian_bases_for_each_arch() -> None:
    build = load("build.yaml")
    assert set(build["build_from"]) == set(load("config.yaml")["arch"])
    for arch, image in build["build_from"].items():
        assert re.fullmatch(r"([a-zA-Z\-.:\d{}]+/)*?([\-\w{}]+)/([\-\w{}]+)(:[.\-\w{}]+)?", image)
        assert arch in image and "debian" in image, "onnxruntime has no musl (Alpine) wheels"
    dockerfile = (ADDON / "Dockerfile").read_text(encoding="utf-8")
    assert "ARG BUILD_FROM" in dockerfile and "FROM ${BUILD_FROM}" in dockerfile
    assert "--chmod" not in dockerfile and "# syntax=" not in dockerfile
    # The released package from the index, with the tested pins (tests/addon/test_dockerfile.py).
    assert "pip install -c /tmp/build/constraints.txt" in dockerfile
    assert '"tts-bridge==${BUILD_VERSION}"' in dockerfile and "/tmp/wheels" not in dockerfile


def test_translations_name_real_options_and_ports() -> None:
    config = load("config.yaml")
    translations = yaml.safe_load((ADDON / "translations" / "en.yaml").read_text("utf-8"))
    assert set(translations["configuration"]) == set(config["schema"])
    for key, text in translations["configuration"].items():
        assert text["name"] and text["description"], key
        assert set(text) <= {"name", "description", "fields"}, key
    # A list of voices: each field of a voice has its own name and description in the form.
    fields = translations["configuration"]["voices"]["fields"]
    assert set(fields) == set(config["schema"]["voices"][0])
    for key, text in fields.items():
        assert set(text) == {"name", "description"} and all(text.values()), key
    assert all("fields" not in t for k, t in translations["configuration"].items() if k != "voices")
    assert set(translations["network"]) == set(config["ports"])


def test_docs_images_and_repository_file() -> None:
    for name in ("DOCS.md", "README.md", "CHANGELOG.md"):
        assert (ADDON / name).read_text(encoding="utf-8").strip(), name
    assert f"## {package_version()}" in (ADDON / "CHANGELOG.md").read_text(encoding="utf-8")
    for name in ("icon.png", "logo.png"):
        assert (ADDON / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name
    repository = yaml.safe_load((ADDON.parent / "repository.yaml").read_text(encoding="utf-8"))
    assert repository["name"] and repository["maintainer"]


def test_no_wheel_is_committed() -> None:
    """The add-on installs the released package from the index: a clean clone needs no wheel."""
    tracked = subprocess.run(
        ["git", "ls-files", "addon/tts_bridge"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert tracked and not [p for p in tracked if Path(p).suffix == ".whl"]


def test_the_health_check_reads_the_config_file_the_addon_reads() -> None:
    from tts_bridge.addon.options import CONFIG_FILE_NAME, SHARE_DIR

    dockerfile = (ADDON / "Dockerfile").read_text(encoding="utf-8")
    assert f"container_health(default_config=Path('{SHARE_DIR / CONFIG_FILE_NAME}'))" in dockerfile
    assert 'ENTRYPOINT ["python", "-m", "tts_bridge.addon.start"]' in dockerfile
