"""Settings: the example file, environment overrides, and clear errors naming the key."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from tts_bridge.config import ConfigError, Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.yaml"


def _keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        keys.add(prefix + name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= _keys(annotation, prefix + name + ".")
    return keys


def test_example_config_loads_and_matches_defaults() -> None:
    settings = load_settings(EXAMPLE, environ={})
    defaults = Settings()
    assert settings.mqtt == defaults.mqtt
    assert settings.limits == defaults.limits
    assert settings.synthesis == defaults.synthesis
    assert set(settings.voices) == set(defaults.voices)
    assert settings.default_voice == defaults.default_voice
    assert settings.cache.dir == Path("~/.cache/tts_bridge").expanduser()


def test_example_config_documents_every_key() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\s*([a-z_0-9]+):", text, flags=re.MULTILINE))
    leaves = {key.rsplit(".", 1)[-1] for key in _keys(Settings)}
    voice_keys = set(Settings().voices["joe"].model_dump())
    missing = (leaves | voice_keys) - documented
    assert not missing, f"config.example.yaml does not document: {sorted(missing)}"


def test_environment_overrides_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mqtt:\n  host: from-file\n  port: 1884\n", encoding="utf-8")
    env = {"TTS_BRIDGE_MQTT__HOST": "from-env", "TTS_BRIDGE_LIMITS__MAX_TEXT_CHARS": "300"}
    settings = load_settings(cfg, environ=env)
    assert settings.mqtt.host == "from-env"
    assert settings.mqtt.port == 1884
    assert settings.limits.max_text_chars == 300


def test_flags_override_environment() -> None:
    settings = load_settings(
        None, {"mqtt": {"port": 2000}}, environ={"TTS_BRIDGE_MQTT__PORT": "1999"}
    )
    assert settings.mqtt.port == 2000


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("mqtt:\n  port: 0\n", "mqtt.port"),
        ("mqtt:\n  prot: 1883\n", "mqtt.prot"),
        ("limits:\n  max_text_chars: lots\n", "limits.max_text_chars"),
        ("default_voice: nobody\n", "default_voice"),
        ("voices:\n  x:\n    engine: espeak\n", "voices.x.engine"),
        ("mqtt:\n  base_topic: 'a/#'\n", "mqtt.base_topic"),
        ("synthesis:\n  onnx_spinning: sometimes\n", "synthesis.onnx_spinning"),
        ("synthesis:\n  onnx_inter_op_threads: 0\n", "synthesis.onnx_inter_op_threads"),
        ("synthesis:\n  onnx_arena: maybe\n", "synthesis.onnx_arena"),
        ("voices:\n  x:\n    engine: chattts\n    backend: gpu\n", "voices.x.backend"),
        ("voices:\n  x:\n    engine: piper\n    backend: onnx\n", "voices.x"),
    ],
)
def test_invalid_config_names_the_key(tmp_path: Path, yaml_text: str, key: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml_text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(cfg, environ={})
    assert key in str(caught.value)


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("mqtt:\n  port: 99999\n", "mqtt.port"),
        ("synthesis:\n  onnx_spinning: fast\n", "synthesis.onnx_spinning"),
        ("voices:\n  joe:\n    engine: hibari\n    backend: torch\n", "voices.joe"),
    ],
)
def test_invalid_config_exits_2_with_one_clear_line(
    tmp_path: Path, yaml_text: str, key: str
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml_text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "tts_bridge", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert key in lines[0]


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml", environ={})
    cfg = tmp_path / "list.yaml"
    cfg.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(cfg, environ={})


def test_onnx_session_settings(tmp_path: Path) -> None:
    defaults = Settings().synthesis
    assert (defaults.onnx_inter_op_threads, defaults.onnx_arena, defaults.onnx_spinning) == (
        None,
        True,
        "auto",
    )
    cfg = tmp_path / "c.yaml"
    # A bare YAML off/on is a boolean to PyYAML; it still means the word.
    cfg.write_text(
        "synthesis:\n  onnx_spinning: off\n  onnx_arena: false\n  onnx_inter_op_threads: 2\n",
        encoding="utf-8",
    )
    synthesis = load_settings(cfg, environ={}).synthesis
    assert (synthesis.onnx_spinning, synthesis.onnx_arena, synthesis.onnx_inter_op_threads) == (
        "off",
        False,
        2,
    )
    from_env = load_settings(None, environ={"TTS_BRIDGE_SYNTHESIS__ONNX_SPINNING": "on"})
    assert from_env.synthesis.onnx_spinning == "on"


def test_chattts_backend_setting(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "voices:\n  joe:\n    engine: piper\n"
        "  zh:\n    engine: chattts\n    model: chattts\n    backend: torch\n"
        "  zh2:\n    engine: chattts\n    model: chattts\n",
        encoding="utf-8",
    )
    voices = load_settings(cfg, environ={}).voices
    assert (voices["zh"].backend, voices["zh2"].backend, voices["joe"].backend) == (
        "torch",
        "auto",
        "auto",
    )


def test_http_section_defaults_and_errors() -> None:
    http = load_settings(environ={}).http
    assert (http.enabled, http.port, http.base_url) == (True, 10201, None)
    assert http.format.container == "mp3" and http.format.sample_rate == 44100
    env = {"TTS_BRIDGE_HTTP__BASE_URL": "http://192.168.1.20:10201/", "TTS_BRIDGE_HTTP__PORT": "0"}
    http = load_settings(environ=env).http
    assert (http.base_url, http.port) == ("http://192.168.1.20:10201", 0)
    with pytest.raises(ConfigError, match=r"http\.base_url: .*http:// or https://"):
        load_settings(overrides={"http": {"base_url": "ftp://x"}}, environ={})
    with pytest.raises(ConfigError, match=r"http\.format: .*opus supports sample rates"):
        load_settings(
            overrides={"http": {"format": {"format": "opus", "sample_rate": 44100}}}, environ={}
        )
