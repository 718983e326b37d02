"""One validated settings object: YAML file, then TTS_BRIDGE_* environment, then command-line flags.

Environment overrides use a double underscore between levels, e.g. ``TTS_BRIDGE_MQTT__HOST=broker``
or ``TTS_BRIDGE_LIMITS__MAX_TEXT_CHARS=500``. Each value is read as the type of its setting: text
settings take the text as it is (``TTS_BRIDGE_MQTT__PASSWORD=123456``, ``...CLIENT_ID=007``),
numbers and booleans (true/false, 1/0, yes/no, on/off) are converted, lists are JSON
(``["a", "b"]``) or comma-separated (``a,b``), and a whole section or voice is a JSON object. An
empty value means "not set" for a setting that may be empty. Variables that name no setting
(``TTS_BRIDGE_BIN``) are not the bridge's and are ignored; an unknown key below a known section
(``TTS_BRIDGE_MQTT__PASWORD``) is an error naming the variable.

How the settings are composed: each room declares its own sections next to its code, on top of
``settings_base.Section`` (unknown keys refused, defaults validated) -- the MQTT door in
``mqtt/settings.py`` (mqtt, journal, homeassistant, hermes), the Wyoming door in
``wyoming/settings.py``, the web door in ``web/settings.py`` (http), the speech core in
``speech/settings.py`` (cache, limits, synthesis, scheduler, chimes, presets, targets), text in
``text/settings.py`` (lexicon) and the engines in ``engines/settings.py`` (models, voices; each
engine's own voice keys are its ``EngineSpec.voice_options``). This module only names them as
fields of ``Settings``, checks what spans rooms (a preset's voice, a url target needs http) and
loads the sources. To add a section: declare its model in its room's settings module, add one
field here (``section: Model = Field(default_factory=Model)``), and document its keys in
config.example.yaml (a test checks that every key is there); the environment, the errors naming
their source and the add-on's options follow by themselves. This module imports no engine.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from tts_bridge.engines.settings import (
    AUTO_FAST_VOICE,
    ModelsSettings,
    VoiceSettings,
    default_voices,
    voice_rules,
)
from tts_bridge.mqtt.settings import (
    HermesSettings,
    HomeAssistantSettings,
    JournalSettings,
    MqttSettings,
    default_client_id,
)
from tts_bridge.settings_base import (
    NAME_PATTERN,
    NAME_RE,
    ExpandedPath,
    Section,
    default_data_dir,
    not_utf8,
)
from tts_bridge.speech.settings import (
    CacheSettings,
    ChimesSettings,
    LimitsSettings,
    PresetSettings,
    SchedulerSettings,
    SynthesisSettings,
    TargetSettings,
)
from tts_bridge.text.settings import Lexicon
from tts_bridge.web.settings import HttpSettings
from tts_bridge.wyoming.settings import WyomingSettings

_LOGGER = logging.getLogger(__name__)

ENV_PREFIX = "TTS_BRIDGE_"


class LoggingSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level; --debug overrides it."""


class Settings(Section):
    """Everything the bridge reads at start-up, validated once and passed down."""

    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    models: ModelsSettings = Field(default_factory=ModelsSettings)
    journal: JournalSettings = Field(default_factory=JournalSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    synthesis: SynthesisSettings = Field(default_factory=SynthesisSettings)
    voices: dict[str, VoiceSettings] = Field(default_factory=default_voices)
    default_voice: str = "joe"
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    homeassistant: HomeAssistantSettings = Field(default_factory=HomeAssistantSettings)
    hermes: HermesSettings = Field(default_factory=HermesSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    wyoming: WyomingSettings = Field(default_factory=WyomingSettings)
    targets: dict[str, TargetSettings] = Field(default_factory=dict)
    """Per say target (speaker): the audio format and what its audio topic carries; a target
    not listed gets WAV bytes on its topic."""
    chimes: ChimesSettings = Field(default_factory=ChimesSettings)
    presets: dict[str, PresetSettings] = Field(default_factory=dict)
    """Voices with a chime (e.g. joe_chime: {voice: joe, chime: dingdong}), listed with the
    voices to Wyoming clients and accepted wherever a voice name is."""
    lexicon: Lexicon = Field(default_factory=dict)
    """Pronunciations shared by every voice: word or phrase -> what to say."""
    lexicon_file: ExpandedPath | None = None
    """A YAML or JSON file of more entries in the same form (`lexicon` wins over it), read at
    start-up."""
    phrases: list[str] = Field(default_factory=list)
    """Sentences to pre-render in quality at idle (for the default voice)."""
    phrases_file: ExpandedPath | None = None
    """A text file of phrases, one per line ('#' starts a comment)."""
    voices_file: ExpandedPath = Field(default_factory=lambda: default_data_dir() / "voices.yaml")
    """Voices made with `tts-bridge voices new`, merged into `voices` when the file exists."""
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @field_validator("voices")
    @classmethod
    def _check_voice_names(cls, voices: dict[str, VoiceSettings]) -> dict[str, VoiceSettings]:
        for name in voices:
            if not NAME_RE.match(name):
                raise ValueError(f"voice name {name!r} must match {NAME_PATTERN}")
        if not voices:
            raise ValueError("at least one voice is needed")
        return voices

    @field_validator("targets")
    @classmethod
    def _check_target_names(cls, targets: dict[str, TargetSettings]) -> dict[str, TargetSettings]:
        for name in targets:
            if not NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a valid target name (they match {NAME_PATTERN})")
        return targets

    @model_validator(mode="after")
    def _check_url_targets(self) -> Settings:
        if not self.http.enabled:
            for name, target in self.targets.items():
                if target.payload == "url":
                    raise ValueError(
                        f"targets.{name}.payload: url needs the HTTP audio server (http.enabled)"
                    )
        return self

    @model_validator(mode="after")
    def _client_id_for_this_journal(self) -> Settings:
        if self.mqtt.client_id == default_client_id():  # "auto", resolved without the journal
            self.mqtt.client_id = default_client_id(self.journal.path.parent)
        return self

    @model_validator(mode="after")
    def _read_password_file(self) -> Settings:
        path = self.mqtt.password_file
        if path is not None:
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ValueError(f"mqtt.password_file: cannot read {path}: {exc.strerror}") from exc
            except UnicodeDecodeError as exc:
                raise ValueError(f"mqtt.password_file: {path} is {not_utf8(exc)}") from None
            self.mqtt.password = lines[0] if lines else ""
        return self

    @model_validator(mode="after")
    def _check_fast_voices(self) -> Settings:
        rules = voice_rules()
        for name, voice in self.voices.items():
            if voice.fast_voice is None:
                continue
            if voice.fast_voice == AUTO_FAST_VOICE and (
                rules is None or rules.takes_auto_fast_voice(voice.engine)
            ):
                continue  # resolved by the engine pool (see VoiceSettings.fast_voice)
            if voice.fast_voice not in self.voices:
                raise ValueError(f"voices.{name}.fast_voice: {voice.fast_voice!r} is not a voice")
            if voice.fast_voice == name:
                raise ValueError(f"voices.{name}.fast_voice: a voice cannot be its own fast tier")
        return self

    @model_validator(mode="after")
    def _check_presets(self) -> Settings:
        for name, preset in self.presets.items():
            if not NAME_RE.match(name):
                raise ValueError(f"preset name {name!r} must match {NAME_PATTERN}")
            if name in self.voices:
                raise ValueError(f"presets.{name}: a voice has this name already")
            if preset.voice not in self.voices:
                raise ValueError(f"presets.{name}.voice: {preset.voice!r} is not a voice")
        return self

    @model_validator(mode="after")
    def _check_hermes_voice(self) -> Settings:
        if self.hermes.voice is not None and self.hermes.voice not in self.voices:
            raise ValueError(f"hermes.voice: {self.hermes.voice!r} is not a voice")
        return self

    @model_validator(mode="after")
    def _check_default_voice(self) -> Settings:
        if self.default_voice not in self.voices:
            raise ValueError(
                f"default_voice {self.default_voice!r} is not one of the voices: "
                + ", ".join(sorted(self.voices))
            )
        return self


class ConfigError(Exception):
    """The configuration cannot be used; the message names the source and the key."""


# -- the environment ------------------------------------------------------------------------
#
# Read by hand rather than with pydantic-settings: the settings are validated once, from the
# YAML file, the environment, the voices file and the flags merged in that order, so the
# environment is one more dictionary here, not the root model (BaseSettings would own the
# precedence and every section class). Each value is converted by the type of the field it
# names, and every variable's key path is remembered so that an error names the variable.


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The annotation without ``None``, and whether ``None`` is allowed."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = get_args(annotation)
        rest = tuple(a for a in args if a is not type(None))
        inner = rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007 (a runtime union)
        return inner, len(rest) < len(args)
    return annotation, False


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _child(annotation: Any, key: str) -> Any | None:
    """The annotation of ``key`` inside a section (or a mapping such as voices); None if unknown."""
    inner, _ = _unwrap(annotation)
    if _is_model(inner):
        field = inner.model_fields.get(key)
        if field is None and inner.model_config.get("extra") == "allow":
            # A voice's engine keys: its engine's schema converts the text ("7" for an int).
            return str
        return None if field is None else field.annotation
    if get_origin(inner) is dict:
        return get_args(inner)[1]
    return None


def _names_key(section: Any, key: str, given: object) -> bool:
    """Whether ``key`` is a key of ``section``: one of its fields, or, where its owner takes
    keys of its own (a voice's engine), one the source wrote."""
    inner, _ = _unwrap(section)
    if _is_model(inner) and inner.model_config.get("extra") == "allow":
        return key in inner.model_fields or (isinstance(given, Mapping) and key in given)
    return _child(section, key) is not None


def _known_keys(annotation: Any) -> list[str]:
    inner, _ = _unwrap(annotation)
    return list(inner.model_fields) if _is_model(inner) else []


def _env_name(path: Sequence[str]) -> str:
    return ENV_PREFIX + "__".join(path).upper()


def _env_value(name: str, raw: str, annotation: Any) -> Any:
    """A variable's text as the field's type wants it: strings stay strings."""
    inner, nullable = _unwrap(annotation)
    if raw == "" and nullable:
        return None
    container = get_origin(inner)
    if _is_model(inner) or container is dict:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f'{name}: expected a JSON object such as {{"key": "value"}} ({exc.msg} at '
                f"column {exc.colno})"
            ) from None
        if not isinstance(value, dict):
            raise ConfigError(f'{name}: expected a JSON object such as {{"key": "value"}}')
        return value
    if container in (list, tuple, set):
        if not raw.lstrip().startswith("["):
            return [item.strip() for item in raw.split(",") if item.strip()]
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f'{name}: expected a JSON list such as ["a", "b"] or a comma-separated a,b '
                f"({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(value, list):
            raise ConfigError(f'{name}: expected a JSON list such as ["a", "b"] or a,b')
        return value
    if get_origin(inner) in (Union, types.UnionType) and not {str, Path} & set(get_args(inner)):
        # A union of numbers and booleans (voice options): "7" is an int, not 7.0.
        for kind in (int, float):
            try:
                return kind(raw)
            except ValueError:
                pass
    return raw  # pydantic turns "300" into 300 for an int field, "true" into True for a bool


def _env_target(name: str, path: list[str]) -> Any | None:
    """The annotation of the setting a variable names; None if it names none (not ours)."""
    annotation: Any = Settings
    for depth, part in enumerate(path):
        child = _child(annotation, part)
        if child is not None:
            annotation = child
            continue
        if depth == 0:
            close = difflib.get_close_matches("__".join(path), list(Settings.model_fields), 1, 0.8)
            if close:
                _LOGGER.warning(
                    "Ignoring %s: not a setting (did you mean %s?)", name, _env_name(close)
                )
            else:
                _LOGGER.debug("Ignoring %s: not a setting", name)
            return None
        where = ".".join(path[:depth])
        known = _known_keys(annotation)
        if not known:
            raise ConfigError(f"{name}: {where} has no keys below it")
        close = difflib.get_close_matches(part, known, n=1)
        hint = f"did you mean {_env_name([*path[:depth], close[0]])}?" if close else ""
        raise ConfigError(
            f"{name}: {where} has no key {part!r} ({hint or 'keys: ' + ', '.join(known)})"
        )
    return annotation


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """The TTS_BRIDGE_* variables as a settings tree, and each variable's key path.

    A variable whose first part names no setting is not the bridge's (TTS_BRIDGE_BIN for a
    wrapper script): it is ignored, with a warning when it is close to a setting's name. Below a
    known section an unknown key can only be a misspelling, and is an error like in the file.
    """
    tree: dict[str, Any] = {}
    sources: dict[tuple[str, ...], str] = {}
    # Sorted: TTS_BRIDGE_MQTT (a JSON object) comes before TTS_BRIDGE_MQTT__PORT, which refines it.
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG":
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            raise ConfigError(f"{name}: empty key (levels are separated by one double '__')")
        annotation = _env_target(name, path)
        if annotation is None:
            continue
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: conflicts with a TTS_BRIDGE_ variable above it")
        node[path[-1]] = _env_value(name, environ[name], annotation)
        sources[tuple(path)] = name
    return tree, sources


def merge_trees(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top: sections merge key by key, other values replace."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge_trees(out[key], value)
        else:
            out[key] = value
    return out


def _flatten(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            paths += _flatten(value, (*prefix, str(key)))
        else:
            paths.append((*prefix, str(key)))
    return paths


_LEADING_KEY = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)[ :]")


class _Sources:
    """Which source set which key, so that an error can say where to fix it."""

    def __init__(
        self,
        path: Path | None,
        env: dict[tuple[str, ...], str],
        flags: Mapping[str, Any] | None,
    ) -> None:
        self.path = path
        self.env = env
        self.flags = set(_flatten(flags or {}))

    def describe(self, loc: tuple[str, ...], key: str, message: str) -> str:
        names = [n for p, n in self.env.items() if _covers(p, loc)]
        if any(_covers(p, loc) for p in self.flags):
            return f"command line {key}: {message}"
        if names:
            return f"{', '.join(sorted(names))} ({key}): {message}"
        if self.path is not None:
            return f"{self.path}: {key}: {message}"
        return f"{key}: {message}"


def _covers(path: tuple[str, ...], loc: tuple[str, ...]) -> bool:
    """The key a source set is (in, or around) the key an error is about."""
    shorter = min(len(path), len(loc))
    return shorter > 0 and path[:shorter] == loc[:shorter]


def _describe(error: ValidationError, sources: _Sources) -> str:
    lines = []
    for item in error.errors():
        loc = tuple(str(p) for p in item["loc"])
        if item["type"] == "value_error" and "error" in item.get("ctx", {}):
            message = str(item["ctx"]["error"])  # our own words, without "Value error, "
        elif item["type"] == "extra_forbidden":
            message = "unknown key"
            parent: Any = Settings
            for part in loc[:-1]:
                parent = _child(parent, part) if parent is not None else None
            close = difflib.get_close_matches(loc[-1], _known_keys(parent), n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
        elif item["type"] == "missing":
            message = "is required"
        else:
            message = item["msg"]
        # A check across keys (a model validator) reports the section; its message starts with
        # the key it is about, which is the one to name (and whose source to blame).
        match = _LEADING_KEY.match(message)
        if match:
            section: Any = Settings
            for part in loc:
                section = _child(section, part) if section is not None else None
            lead = tuple(match.group(1).split("."))
            given = item.get("input")
            if not loc or (section is not None and _names_key(section, lead[0], given)):
                loc = (*loc, *lead)
                message = message[len(match.group(1)) :].lstrip(": ")
        key = ".".join(loc) or "settings"
        lines.append(sources.describe(loc, key, message))
    return "; ".join(lines)


def _with_voices_file(data: dict[str, Any]) -> dict[str, Any]:
    """Add the voices from the voices file (made by `voices new`); the config file wins."""
    raw = data.get("voices_file")
    path = Path(raw).expanduser() if raw else default_data_dir() / "voices.yaml"
    if not path.is_file():
        return data
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read voices file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"voices file {path}: {not_utf8(exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"voices file {path} is not valid YAML: {exc}") from exc
    extra = loaded.get("voices") if isinstance(loaded, dict) else None
    if not isinstance(extra, dict):
        raise ConfigError(f"voices file {path}: expected a 'voices:' mapping")
    voices = data.get("voices")
    if voices is None:
        voices = {k: v.model_dump(exclude_defaults=True) for k, v in default_voices().items()}
    return {**data, "voices": {**extra, **voices}}


def load_settings(
    path: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    base: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the settings: defaults < ``base`` < YAML file < TTS_BRIDGE_* environment < flag
    overrides. ``base`` is a settings tree that a launcher supplies (the add-on's options)."""
    data: dict[str, Any] = {}
    environ = os.environ if environ is None else environ
    if path is None and environ.get(ENV_PREFIX + "CONFIG"):
        path = Path(environ[ENV_PREFIX + "CONFIG"])
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path}: {not_utf8(exc)}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: the top level must be a mapping of keys")
        data = loaded
    if base:
        data = merge_trees(base, data)
    env_tree, env_sources = _env_overrides(environ)
    overrides = overrides or {}
    if "voices" not in data and "voices" in env_tree:
        # TTS_BRIDGE_VOICES__JOE__SPEED=1.2 changes joe; it does not replace the default voices.
        data["voices"] = {
            name: voice.model_dump(exclude_defaults=True)
            for name, voice in default_voices().items()
        }
    data = merge_trees(data, env_tree)
    data = merge_trees(data, overrides)
    data = _with_voices_file(data)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        sources = _Sources(path, env_sources, overrides)
        raise ConfigError(f"invalid configuration: {_describe(exc, sources)}") from None
    _LOGGER.debug("Settings loaded from %s", path or "defaults")
    return settings
