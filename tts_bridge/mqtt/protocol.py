"""Topics and payloads of the bridge's MQTT contract; pure functions, no network."""

from __future__ import annotations

import difflib
import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from tts_bridge.audio.formats import AudioFormat, FormatError
from tts_bridge.engines.base import SynthesisOptions, check_option_ranges
from tts_bridge.speech.request import SpeechRequest, with_target_defaults
from tts_bridge.speech.scheduler import PRIORITIES, Priority, as_priority
from tts_bridge.speech.settings import LimitsSettings, TargetSettings
from tts_bridge.text.sentences import clean
from tts_bridge.wire import JsonTooDeepError, encode_json, load_json, new_id, raw_size

DEFAULT_TARGET = "default"
_TARGET_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_LANG_RE = re.compile(r"^[a-z]{2,3}([-_][A-Za-z]{2,4})?$")


@dataclass(frozen=True)
class Topics:
    """Every topic derived from the base topic."""

    base: str

    @property
    def say(self) -> str:
        return f"{self.base}/say"

    @property
    def say_targets(self) -> str:
        return f"{self.base}/say/+"

    @property
    def state(self) -> str:
        return f"{self.base}/bridge/state"

    @property
    def info(self) -> str:
        return f"{self.base}/bridge/info"

    def audio(self, target: str) -> str:
        return f"{self.base}/audio/{target}"

    def audio_stream(self, target: str) -> str:
        return f"{self.base}/audio/{target}/stream"

    def response(self, name: str) -> str:
        return f"{self.base}/bridge/response/{name}"

    @property
    def requests(self) -> str:
        return f"{self.base}/bridge/request/#"

    @property
    def health(self) -> str:
        return f"{self.base}/bridge/health"

    @property
    def event(self) -> str:
        """Each say answer as a Home Assistant event (see discovery.answer_event)."""
        return f"{self.base}/bridge/event"

    def request_name(self, topic: str) -> str | None:
        """The API name of a bridge request topic ('cache/stats'); None otherwise."""
        prefix = f"{self.base}/bridge/request/"
        return topic[len(prefix) :] if topic.startswith(prefix) else None

    def target_of(self, topic: str) -> str | None:
        """The target of a say topic ('default' for <base>/say); None if not a say topic."""
        if topic == self.say:
            return DEFAULT_TARGET
        prefix = self.say + "/"
        if topic.startswith(prefix):
            return topic[len(prefix) :]
        return None


class ProtocolError(Exception):
    """A request that is refused; carries the machine code and the request id if known."""

    def __init__(self, code: str, message: str, request_id: str | int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


class SayPayload(BaseModel):
    """The JSON form of a say request (strict: a number is not text, unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")

    text: StrictStr
    id: StrictStr | StrictInt | None = Field(None)
    voice: StrictStr | None = None
    lang: StrictStr | None = None
    cache: StrictBool = True
    stream: StrictBool = False
    tier: Literal["quality", "fast"] | None = None
    latency_budget_ms: StrictInt | None = Field(None, ge=1, le=600_000)
    options: dict[str, StrictBool | StrictInt | StrictFloat] | None = Field(None, max_length=16)
    format: Any = None
    """Checked by AudioFormat.parse (a name or a mapping), which says what is allowed."""
    chime: StrictStr | None = Field(None, max_length=64)
    chime_after: StrictStr | None = Field(None, max_length=64)
    ssml: StrictBool | None = None
    priority: Any = None
    """Checked by _parse_priority, which answers its own error code."""


@dataclass(frozen=True)
class SayRequest:
    """A parsed, valid say request."""

    id: str | int
    text: str
    target: str
    voice: str | None
    lang: str | None
    use_cache: bool
    stream: bool = False
    tier: Literal["quality", "fast"] | None = None
    latency_budget_ms: int | None = None
    options: dict[str, bool | int | float] | None = None
    """Engine synthesis options (speed, temperature, ...); checked against the voice's engine."""
    id_given: bool = False
    """The client chose the id (so a second copy is a duplicate, see journal.request_key)."""
    format: AudioFormat | None = None
    """The audio format asked for (audio topic and URL); None = the target's."""
    chime: str | None = None
    """Chime before the speech ("" = none); None = the voice preset's or the target's."""
    chime_after: str | None = None
    ssml: bool | None = None
    """True: the text is SSML; False: spoken as written; None: SSML if it starts with <speak>."""
    priority: Priority = "normal"
    """Its place in the queue: alert > high > normal > low."""


def speech_request(
    say: SayRequest, received: float, target: TargetSettings | None = None
) -> SpeechRequest:
    """The speech core's request for a say request; `target` is its say target's settings
    (their chimes are the request's defaults)."""
    request = SpeechRequest(
        id=say.id,
        text=say.text,
        voice=say.voice,
        language=say.lang,
        options=say.options,
        format=say.format.container if say.format is not None else None,
        priority=say.priority,
        chime=say.chime,
        chime_after=say.chime_after,
        ssml=say.ssml,
        door="mqtt",
        target=say.target,
        tier=say.tier,
        use_cache=say.use_cache,
        stream=say.stream,
        budget_ms=say.latency_budget_ms,
        received=received,
    )
    return with_target_defaults(request, target)


def mqtt_safe(value: str) -> bool:
    """True when `value` may go into an MQTT UTF-8 string (no control, format or surrogate
    characters, which brokers refuse as a malformed packet)."""
    return not any(unicodedata.category(c)[0] == "C" for c in value)


def _first_error(error: ValidationError) -> str:
    item = error.errors()[0]
    # Only the field name: union members ('id.str') mean nothing to a user.
    where = str(item["loc"][0]) if item["loc"] else "payload"
    if item["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if item["type"] == "missing":
        return f"field {where!r} is required"
    return f"field {where!r}: {item['msg']}"


def _unknown_fields(keys: list[str]) -> str:
    """'unknown field 'txt' (did you mean 'text'?)' for the first unknown key (a key is
    user text: shown with repr and cut short), with the known fields when nothing is close."""
    key = str(keys[0])
    shown = repr(key if len(key) <= 40 else key[:40] + "...")
    close = difflib.get_close_matches(key.lower(), list(SayPayload.model_fields), n=1)
    if close:
        return f"unknown field {shown} (did you mean {close[0]!r}?)"
    return f"unknown field {shown}; known fields: {', '.join(SayPayload.model_fields)}"


def _validate_payload(data: dict[str, Any], request_id: str | int | None) -> SayPayload:
    unknown = [key for key in data if key not in SayPayload.model_fields]
    if unknown:
        # Named before anything else: {"txt": ...} is a misspelt key, not a missing text.
        raise ProtocolError("invalid_request", _unknown_fields(unknown), request_id)
    try:
        return SayPayload.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError("invalid_request", _first_error(exc), request_id) from None


_BOM = "\ufeff"
_OPTION_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_MAX_EXACT_INT = 2**53  # beyond this a JSON number means nothing to an engine option
# Characters of speech per second at speed 1.0, for the audio-length cap: a little faster than
# real speech (~14/s in English), so the estimate stays below the real length and only requests
# that are clearly too long are refused. CJK characters (a syllable each, ~4-5/s) and digits
# (spoken as words) count several times.
_CHARS_PER_SECOND = 16.0
_HEAVY_CHARS = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_HEAVY_WEIGHT = 3.5
_DIGIT_WEIGHT = 2.0


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _loads(text: str, limits: LimitsSettings) -> Any:
    """A JSON payload, without Python's NaN/Infinity extension (not JSON, and poison as
    options); JsonTooDeepError past limits.max_json_depth."""
    return load_json(text, limits.max_json_depth, parse_constant=_reject_constant)


def _check_options(options: dict[str, bool | int | float], request_id: Any) -> float:
    """Refuse option names and numbers no engine can take; returns the requested speed (1.0 if
    none). The options each engine knows, and their ranges, are checked again when the
    synthesizer builds the engine's options (SynthesisOptions.ranges and subclasses)."""
    for name, value in options.items():
        if not _OPTION_NAME_RE.match(name):
            raise ProtocolError(
                "invalid_options",
                "option names are 1-32 letters, digits or '_'",
                request_id,
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError(
                "invalid_options", f"option {name!r} must be a finite number", request_id
            )
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_EXACT_INT:
            raise ProtocolError("invalid_options", f"option {name!r} is too large", request_id)
    try:
        check_option_ranges(SynthesisOptions.ranges, options)
    except ValueError as exc:
        raise ProtocolError("invalid_options", str(exc), request_id) from None
    speed = options.get("speed", 1.0)
    return float(speed) if not isinstance(speed, bool) else 1.0


def estimated_audio_seconds(text: str, speed: float = 1.0) -> float:
    """A low estimate of how many seconds ``text`` takes to speak at ``speed`` (1.0 = normal)."""
    heavy = len(_HEAVY_CHARS.findall(text))
    digits = sum(c.isdigit() for c in text)
    weight = len(text) - heavy - digits + heavy * _HEAVY_WEIGHT + digits * _DIGIT_WEIGHT
    return weight / _CHARS_PER_SECOND / max(speed, 1e-6)


def check_audio_seconds(
    text: str, speed: float, limits: LimitsSettings, request_id: str | int | None = None
) -> None:
    """Raise ProtocolError('audio_too_long') when ``text`` at ``speed`` would make more than
    ``limits.max_audio_s`` seconds of audio. parse_say checks the request's own speed; the
    service checks again with the speed the voice actually renders at (a voice's default speed
    can be lower than 1.0)."""
    seconds = estimated_audio_seconds(text, speed)
    if seconds > limits.max_audio_s:
        raise ProtocolError(
            "audio_too_long",
            f"this text at speed {speed:g} makes about {seconds:.0f} s of audio; the limit is "
            f"{limits.max_audio_s:g} s (limits.max_audio_s)",
            request_id,
        )


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic filter matching ('+' one level, '#' the rest, '$' topics not by wildcards)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    parts = topic.split("/")
    for index, level in enumerate(topic_filter.split("/")):
        if level == "#":
            return True
        if index >= len(parts) or (level not in ("+", parts[index])):
            return False
    return len(parts) == len(topic_filter.split("/"))


def response_topic_refusal(
    topic: str,
    base_topic: str,
    *,
    discovery_prefix: str = "homeassistant",
    allowed: Sequence[str] = (),
) -> str | None:
    """Why the bridge must not publish to a requester's MQTT 5 Response Topic; None if it may.

    The bridge publishes with its own broker rights, so a response topic could make it write
    where the requester may not (a confused deputy): never under its own base topic (its say
    and API inputs, its audio outputs, its state, info and health), never Home Assistant
    discovery or Hermes topics, never a topic with wildcards or a '$' system topic. With
    ``allowed`` (mqtt.response_topics), the topic must also match one of those filters.
    """
    if not topic or "\x00" in topic or not mqtt_safe(topic):
        return "the response topic is empty or holds control characters"
    if "+" in topic or "#" in topic:
        return "a response topic cannot hold the wildcards '+' or '#'"
    if topic.startswith("$"):
        return "a response topic cannot be a '$' system topic"
    reserved = {
        base_topic: "the bridge's own topics",
        discovery_prefix: "Home Assistant discovery topics",
        "homeassistant": "Home Assistant discovery topics",
        "hermes": "Hermes topics",
    }
    for prefix, what in reserved.items():
        if topic == prefix or topic.startswith(prefix + "/"):
            return f"a response topic cannot be one of {what} ({prefix}/...)"
    if allowed and not any(topic_matches(pattern, topic) for pattern in allowed):
        return "the response topic is not in mqtt.response_topics"
    return None


def _parse_format(value: object, request_id: str | int | None) -> AudioFormat | None:
    if value is None:
        return None
    try:
        return AudioFormat.parse(value)
    except FormatError as exc:
        raise ProtocolError("invalid_format", f"field 'format': {exc}", request_id) from None


def _parse_priority(value: object, request_id: str | int | None) -> Priority:
    if value is None:
        return "normal"
    priority = as_priority(value)
    if priority is not None:
        return priority
    raise ProtocolError(
        "invalid_priority",
        f"field 'priority' must be one of {', '.join(PRIORITIES)}",
        request_id,
    )


def check_raw_text(text: str, limits: LimitsSettings, request_id: str | int | None = None) -> None:
    """Refuse text whose raw UTF-8 size passes limits.max_raw_text_bytes (before cleaning:
    whitespace and invisible characters cost memory and time too)."""
    # A character is at most 4 bytes: most texts are decided without encoding them.
    if len(text) * 4 <= limits.max_raw_text_bytes:
        return
    size = raw_size(text)
    if size > limits.max_raw_text_bytes:
        raise ProtocolError(
            "text_too_long",
            f"the text has {size} bytes; the limit is {limits.max_raw_text_bytes} "
            "(limits.max_raw_text_bytes)",
            request_id,
        )


def parse_say(target: str, payload: bytes, limits: LimitsSettings) -> SayRequest:
    """Turn a raw say payload into a request, or raise ProtocolError with a readable reason."""
    if not _TARGET_RE.match(target):
        raise ProtocolError("invalid_target", "target must be 1-64 letters, digits, '_' or '-'")
    if len(payload) > limits.max_payload_bytes:
        raise ProtocolError(
            "payload_too_large",
            f"payload has {len(payload)} bytes; the limit is {limits.max_payload_bytes}",
        )
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(
            "invalid_utf8", f"payload is not valid UTF-8 (byte {exc.start})"
        ) from None
    # A UTF-8 byte order mark (Windows editors, some HTTP-to-MQTT tools) is not text to speak,
    # and before JSON it would hide the JSON.
    text = text.removeprefix(_BOM)
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        check_raw_text(text, limits)
        # The cost of what will be spoken: a megabyte of spaces before "Hello." is one word.
        check_audio_seconds(clean(text), 1.0, limits, None)
        return SayRequest(new_id(), text, target, None, None, True)
    try:
        data = _loads(stripped, limits)
    except JsonTooDeepError as exc:
        raise ProtocolError("json_too_deep", str(exc)) from None
    except ValueError as exc:
        raise ProtocolError(
            "invalid_json", f"payload looks like JSON but does not parse: {exc}"
        ) from None
    if not isinstance(data, dict):
        raise ProtocolError(
            "invalid_request", "a JSON payload must be an object with a 'text' field"
        )
    raw_id = data.get("id")
    request_id: str | int | None = (
        raw_id if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else None
    )
    parsed = _validate_payload(data, request_id)
    if isinstance(parsed.id, str) and not 0 < len(parsed.id) <= 128:
        raise ProtocolError("invalid_request", "field 'id' must have 1-128 characters")
    if isinstance(parsed.id, str) and not mqtt_safe(parsed.id):
        # The id goes into MQTT 5 user properties: a control character or a lone surrogate
        # there makes the broker drop the connection (and paho resend it after reconnecting).
        raise ProtocolError("invalid_request", "field 'id' must not contain control characters")
    if parsed.lang is not None and not _LANG_RE.match(parsed.lang):
        raise ProtocolError(
            "invalid_request", "field 'lang' must be a language code like 'en'", parsed.id
        )
    speed = _check_options(parsed.options or {}, parsed.id)
    check_raw_text(parsed.text, limits, parsed.id)
    check_audio_seconds(clean(parsed.text), speed, limits, parsed.id)
    priority = _parse_priority(parsed.priority, parsed.id)
    return SayRequest(
        id=parsed.id if parsed.id is not None else new_id(),
        text=parsed.text,
        target=target,
        voice=parsed.voice,
        lang=parsed.lang.split("-")[0].split("_")[0].lower() if parsed.lang else None,
        use_cache=parsed.cache,
        stream=parsed.stream,
        tier=parsed.tier,
        latency_budget_ms=parsed.latency_budget_ms,
        options=parsed.options,
        id_given=parsed.id is not None,
        format=_parse_format(parsed.format, parsed.id),
        chime=parsed.chime,
        chime_after=parsed.chime_after,
        ssml=parsed.ssml,
        priority=priority,
    )


def parse_api_request(payload: bytes, limits: LimitsSettings) -> dict[str, Any]:
    """A bridge API payload: empty, a JSON object, or a plain string (as {"value": ...})."""
    if len(payload) > limits.max_payload_bytes:
        raise ProtocolError("payload_too_large", "payload too large")
    try:
        text = payload.decode("utf-8").removeprefix(_BOM).strip()
    except UnicodeDecodeError:
        raise ProtocolError("invalid_utf8", "payload is not valid UTF-8") from None
    if not text:
        return {}
    if not text.startswith(("{", "[")):
        return {"value": text}
    try:
        data = _loads(text, limits)
    except JsonTooDeepError as exc:
        raise ProtocolError("json_too_deep", str(exc)) from None
    except ValueError as exc:
        raise ProtocolError("invalid_json", f"payload does not parse as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_request", "the payload must be a JSON object")
    return data


def api_response(
    status: str, data: Any, transaction: Any, error: str | None = None, code: str | None = None
) -> bytes:
    body: dict[str, Any] = {"status": status, "data": data}
    if error is not None:
        body["error"] = error
        body["code"] = code
    if transaction is not None:
        body["transaction"] = transaction
    return encode_json(body)


def ok_response(request_id: str | int, data: dict[str, Any]) -> bytes:
    return encode_json({"status": "ok", "id": request_id, "data": data})


def error_response(request_id: str | int | None, code: str, message: str) -> bytes:
    body = {"status": "error", "id": request_id, "error": message, "code": code}
    return encode_json(body)
