"""Settings: the example file, environment overrides, and clear errors naming the key."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tts_bridge.audio.formats import AudioFormat
from tts_bridge.config import ConfigError, Settings, load_settings
from tts_bridge.engines import catalog
from tts_bridge.engines.chattts.voice_options import ChatTTSVoiceOptions
from tts_bridge.engines.settings import VoiceSettings
from tts_bridge.mqtt.settings import MqttSettings, default_client_id

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
    # client_id "auto" follows the journal folder, which the example spells as a literal path
    # (here the tests' own XDG folders differ from it).
    assert settings.mqtt.client_id == default_client_id(settings.journal.path.parent)
    assert defaults.mqtt.client_id == default_client_id(defaults.journal.path.parent)
    assert settings.mqtt.model_copy(update={"client_id": "x"}) == defaults.mqtt.model_copy(
        update={"client_id": "x"}
    )
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
    # Each engine's own voice keys (ChatTTS: spk_emb, backend) are documented as well.
    for kind in catalog.kinds():
        voice_keys |= set(catalog.spec(kind).voice_options.model_fields)
    missing = (leaves | voice_keys) - documented
    assert not missing, f"config.example.yaml does not document: {sorted(missing)}"


def _path_settings(model: type[BaseModel], prefix: str = "") -> list[tuple[type[BaseModel], str]]:
    """Every setting whose type is a path, with the section that holds it."""
    found: list[tuple[type[BaseModel], str]] = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += _path_settings(annotation, prefix + name + ".")
        elif "Path" in str(annotation):
            found.append((model, name))
    return found


def test_every_path_setting_expands_the_home_folder() -> None:
    # Voices and targets are mappings of sections; the walk sees only nested sections.
    sections = _path_settings(Settings) + _path_settings(VoiceSettings)
    required = {"engine": "piper"}  # a voice's one required key
    names = {f"{model.__name__}.{name}" for model, name in sections}
    assert {"CacheSettings.dir", "TlsSettings.ca_file", "VoiceSettings.model"} <= names
    for model, name in sections:
        extra = {k: v for k, v in required.items() if k in model.model_fields}
        value = getattr(model.model_validate({**extra, name: "~/probe"}), name)
        assert value == Path.home() / "probe", f"{model.__name__}.{name}"


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
    backends = (
        ChatTTSVoiceOptions.of(voices["zh"]).backend,
        ChatTTSVoiceOptions.of(voices["zh2"]).backend,
    )
    assert backends == ("torch", "auto")
    # The key is ChatTTS's own: a Piper voice has none.
    assert voices["joe"].engine_options() == {}


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


# -- the environment: typed by the field it names ---------------------------------------------


def test_environment_strings_stay_strings() -> None:
    env = {
        "TTS_BRIDGE_MQTT__PASSWORD": "123456",
        "TTS_BRIDGE_MQTT__USERNAME": "#secret",
        "TTS_BRIDGE_MQTT__CLIENT_ID": "007",
        "TTS_BRIDGE_MQTT__BASE_TOPIC": "true",
    }
    mqtt = load_settings(None, environ=env).mqtt
    assert (mqtt.password, mqtt.username, mqtt.client_id, mqtt.base_topic) == (
        "123456",
        "#secret",
        "007",
        "true",
    )
    password = load_settings(None, environ={"TTS_BRIDGE_MQTT__PASSWORD": "#secret"}).mqtt.password
    assert password == "#secret"


def test_environment_numbers_booleans_and_empty_values() -> None:
    env = {
        "TTS_BRIDGE_MQTT__PORT": "1884",
        "TTS_BRIDGE_MQTT__TLS__INSECURE": "yes",
        "TTS_BRIDGE_CACHE__ENABLED": "false",
        "TTS_BRIDGE_SCHEDULER__HYSTERESIS": "0.5",
        "TTS_BRIDGE_SYNTHESIS__ONNX_SPINNING": "off",
        "TTS_BRIDGE_SYNTHESIS__WORKERS": "",
        "TTS_BRIDGE_MQTT__USERNAME": "",
    }
    settings = load_settings(None, environ=env)
    assert settings.mqtt.port == 1884
    assert settings.mqtt.tls.insecure is True
    assert settings.cache.enabled is False
    assert settings.scheduler.hysteresis == 0.5
    assert settings.synthesis.onnx_spinning == "off"
    # Empty means "not set" for a setting that may be empty.
    assert settings.synthesis.workers is None
    assert settings.mqtt.username is None


@pytest.mark.parametrize("raw", ["kitchen,hall", " kitchen , hall ,", '["kitchen", "hall"]'])
def test_environment_lists_as_json_or_comma_separated(raw: str) -> None:
    settings = load_settings(None, environ={"TTS_BRIDGE_HOMEASSISTANT__TARGETS": raw})
    assert settings.homeassistant.targets == ["kitchen", "hall"]


def test_environment_phrases_list_and_json_objects() -> None:
    env = {
        "TTS_BRIDGE_PHRASES": '["Dinner is ready.", "Good night, everyone."]',
        "TTS_BRIDGE_VOICES__JOE__SPEED": "1.25",
        "TTS_BRIDGE_VOICES__JOE__OPTIONS__SEED": "7",
        "TTS_BRIDGE_HERMES": '{"enabled": true, "voice": "heart"}',
        "TTS_BRIDGE_HERMES__FINISH_MARGIN_S": "3",
    }
    settings = load_settings(None, environ=env)
    # A comma inside a phrase is kept: JSON says where each item ends.
    assert settings.phrases == ["Dinner is ready.", "Good night, everyone."]
    # Changing one voice keeps the others (the default voices stay).
    assert set(settings.voices) == {"joe", "heart", "xiaobei"}
    assert settings.voices["joe"].speed == 1.25
    assert settings.voices["joe"].engine == "piper"
    options = settings.voices["joe"].options
    assert options == {"seed": 7}
    assert isinstance(options["seed"], int)
    assert (settings.hermes.enabled, settings.hermes.voice, settings.hermes.finish_margin_s) == (
        True,
        "heart",
        3.0,
    )


def test_environment_variables_that_name_no_setting_are_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"TTS_BRIDGE_BIN": "/x", "TTS_BRIDGE_DEFAULT_VOCE": "heart", "TTS_BRIDGE_CONFIG": ""}
    with caplog.at_level("DEBUG", logger="tts_bridge.config"):
        settings = load_settings(None, environ=env)
    assert settings.default_voice == "joe"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # Only the near miss is worth a warning; a wrapper's own variable is not the bridge's.
    assert warnings == [
        "Ignoring TTS_BRIDGE_DEFAULT_VOCE: not a setting (did you mean TTS_BRIDGE_DEFAULT_VOICE?)"
    ]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"TTS_BRIDGE_MQTT__PASWORD": "x"},
            "TTS_BRIDGE_MQTT__PASWORD: mqtt has no key 'pasword' "
            "(did you mean TTS_BRIDGE_MQTT__PASSWORD?)",
        ),
        (
            {"TTS_BRIDGE_MQTT__HOST__NAME": "x"},
            "TTS_BRIDGE_MQTT__HOST__NAME: mqtt.host has no keys",
        ),
        ({"TTS_BRIDGE_MQTT__PORT": "abc"}, "TTS_BRIDGE_MQTT__PORT (mqtt.port): Input should be"),
        ({"TTS_BRIDGE_MQTT__PORT": "0"}, "TTS_BRIDGE_MQTT__PORT (mqtt.port): "),
        (
            {"TTS_BRIDGE_HOMEASSISTANT__TARGETS": '["a", '},
            "TTS_BRIDGE_HOMEASSISTANT__TARGETS: expected a JSON list",
        ),
        (
            {"TTS_BRIDGE_HOMEASSISTANT__TARGETS": "a b,c"},
            "TTS_BRIDGE_HOMEASSISTANT__TARGETS (homeassistant.targets): target 'a b' must match",
        ),
        ({"TTS_BRIDGE_HERMES": "on"}, "TTS_BRIDGE_HERMES: expected a JSON object"),
        (
            {"TTS_BRIDGE_DEFAULT_VOICE": "nobody"},
            "TTS_BRIDGE_DEFAULT_VOICE (default_voice): 'nobody' is not one of the voices",
        ),
        (
            {"TTS_BRIDGE_VOICES__JOE__BACKEND": "onnx"},
            "TTS_BRIDGE_VOICES__JOE__BACKEND (voices.joe.backend): 'onnx' is only for",
        ),
        (
            {
                "TTS_BRIDGE_MQTT__TLS__ENABLED": "true",
                "TTS_BRIDGE_MQTT__TLS__CA_FILE": "/no/ca.pem",
            },
            "TTS_BRIDGE_MQTT__TLS__CA_FILE (mqtt.tls.ca_file): no such file /no/ca.pem",
        ),
        ({"TTS_BRIDGE_MQTT____HOST": "x"}, "TTS_BRIDGE_MQTT____HOST: empty key"),
    ],
)
def test_environment_errors_name_the_variable(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, environ=env)
    message = str(caught.value)
    assert expected in message
    assert "Value error" not in message
    assert "\n" not in message


def test_errors_name_the_file_or_the_command_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mqtt:\n  prot: 1883\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(cfg, environ={"TTS_BRIDGE_MQTT__PORT": "x"})
    message = str(caught.value)
    assert f"{cfg}: mqtt.prot: unknown key (did you mean 'port'?)" in message
    assert "TTS_BRIDGE_MQTT__PORT (mqtt.port)" in message
    # A check across keys (a model validator) in the bridge's own words, naming the key.
    cfg.write_text("default_voice: nobody\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(cfg, environ={})
    message = str(caught.value)
    assert message == (
        f"invalid configuration: {cfg}: default_voice: 'nobody' is not one of the voices: "
        "heart, joe, xiaobei"
    )

    with pytest.raises(ConfigError, match=r"command line mqtt\.port: "):
        load_settings(None, {"mqtt": {"port": 0}}, environ={})


def test_precedence_defaults_file_environment_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mqtt:\n  host: file\n  port: 1001\n  username: file\n", encoding="utf-8")
    env = {"TTS_BRIDGE_MQTT__PORT": "1002", "TTS_BRIDGE_MQTT__USERNAME": "env"}
    mqtt = load_settings(cfg, {"mqtt": {"username": "flag"}}, environ=env).mqtt
    assert (mqtt.host, mqtt.port, mqtt.username, mqtt.base_topic) == (
        "file",
        1002,
        "flag",
        "tts_bridge",
    )
    # TTS_BRIDGE_CONFIG names the file when no --config is given.
    from_env = load_settings(None, environ={"TTS_BRIDGE_CONFIG": str(cfg)})
    assert from_env.mqtt.host == "file"


def test_non_utf8_files_are_named(tmp_path: Path) -> None:
    cfg = tmp_path / "latin1.yaml"
    cfg.write_bytes("mqtt:\n  host: café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"config file {re.escape(str(cfg))}: not UTF-8 text"):
        load_settings(cfg, environ={})
    password = tmp_path / "password"
    password.write_bytes(b"caf\xe9\n")
    env = {"TTS_BRIDGE_MQTT__PASSWORD_FILE": str(password)}
    with pytest.raises(ConfigError) as caught:
        load_settings(None, environ=env)
    assert f"{password} is not UTF-8 text" in str(caught.value)
    assert "TTS_BRIDGE_MQTT__PASSWORD_FILE" in str(caught.value)


def test_tls_files_must_exist_when_tls_is_on(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"mqtt:\n  tls:\n    enabled: true\n    ca_file: {missing}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(cfg, environ={})
    assert f"{cfg}: mqtt.tls.ca_file: no such file {missing}" in str(caught.value)
    missing.write_text("not checked here: ssl reads it\n", encoding="utf-8")
    assert load_settings(cfg, environ={}).mqtt.tls.ca_file == missing
    # With TLS off the files are not used, so they are not checked.
    off = {"TTS_BRIDGE_MQTT__TLS__CA_FILE": str(tmp_path / "nope.pem")}
    assert load_settings(None, environ=off).mqtt.tls.enabled is False


@pytest.mark.parametrize(
    ("env", "stderr"),
    [
        ({"TTS_BRIDGE_MQTT__PASWORD": "x"}, "TTS_BRIDGE_MQTT__PASWORD: mqtt has no key"),
        (
            {"TTS_BRIDGE_MQTT__TLS__ENABLED": "1", "TTS_BRIDGE_MQTT__TLS__CA_FILE": "/no/ca.pem"},
            "no such file /no/ca.pem",
        ),
    ],
)
def test_environment_errors_exit_2_with_one_line(env: dict[str, str], stderr: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TTS_BRIDGE_")}
    done = subprocess.run(
        [sys.executable, "-m", "tts_bridge", "cache", "stats"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**clean, **env},
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert stderr in lines[0]


def test_default_client_id_is_stable_and_distinct_per_state_folder(tmp_path: Path) -> None:
    first = load_settings(None, {"journal": {"path": str(tmp_path / "a" / "j.sqlite3")}}, {})
    again = load_settings(None, {"journal": {"path": str(tmp_path / "a" / "j.sqlite3")}}, {})
    other = load_settings(None, {"journal": {"path": str(tmp_path / "b" / "j.sqlite3")}}, {})
    assert first.mqtt.client_id == again.mqtt.client_id
    assert first.mqtt.client_id != other.mqtt.client_id
    assert first.mqtt.client_id.startswith("tts_bridge-")
    explicit = load_settings(None, {"mqtt": {"client_id": "kitchen-bridge"}}, {})
    assert explicit.mqtt.client_id == "kitchen-bridge"


def test_response_topics_must_be_topic_filters() -> None:
    assert MqttSettings(response_topics=["clients/#", "a/+/b"]).response_topics
    for bad in ("a/#/b", "a/b#", "x+/y", ""):
        with pytest.raises(ValueError, match="topic filter"):
            MqttSettings(response_topics=[bad])


def test_targets_take_a_format_and_a_payload() -> None:
    targets = {
        "kitchen": {"format": "MP3", "sample_rate": 44100, "channels": 2},
        "esp": {"payload": "url"},
        "attic": {"format": "ogg", "bitrate_kbps": 24},
    }
    settings = load_settings(overrides={"targets": targets}, environ={})
    kitchen, esp, attic = (settings.targets[n] for n in ("kitchen", "esp", "attic"))
    assert kitchen.audio_format == AudioFormat("mp3", 44100, 2)
    assert (kitchen.format, kitchen.payload) == ("mp3", "audio")
    assert (esp.audio_format, esp.payload) == (None, "url")
    assert attic.audio_format == AudioFormat("opus", bitrate_kbps=24)
    # homeassistant.targets (the notify entities) is its own list, unchanged.
    assert settings.homeassistant.targets == ["default"]
    assert load_settings(environ={}).targets == {}
    # A dump reads back as the same settings (the benchmarks write their bridges' config so).
    assert Settings.model_validate(settings.model_dump(mode="json")).targets == settings.targets
    env = {"TTS_BRIDGE_TARGETS__HALL__FORMAT": "flac", "TTS_BRIDGE_TARGETS__HALL__CHANNELS": "2"}
    assert load_settings(environ=env).targets["hall"].audio_format == AudioFormat("flac", None, 2)


@pytest.mark.parametrize(
    ("targets", "match"),
    [
        ({"kitchen": {"format": "aac"}}, r"targets\.kitchen: .*unknown audio format 'aac'"),
        ({"kitchen": {"format": "mp3", "sample_rate": 44000}}, r"mp3 supports sample rates"),
        ({"kitchen": {"sample_rate": 44100}}, r"sample_rate: only with a format"),
        ({"kitchen": {"payload": "bytes"}}, r"targets\.kitchen\.payload"),
        ({"kitchen": {"colour": "red"}}, r"targets\.kitchen\.colour: unknown key"),
        ({"bad name": {}}, r"targets: 'bad name' is not a valid target name"),
    ],
)
def test_bad_targets_name_the_key(targets: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(overrides={"targets": targets}, environ={})


def test_a_url_target_needs_the_http_server() -> None:
    with pytest.raises(ConfigError, match=r"targets\.esp\.payload: url needs .*http\.enabled"):
        load_settings(
            overrides={"http": {"enabled": False}, "targets": {"esp": {"payload": "url"}}},
            environ={},
        )
