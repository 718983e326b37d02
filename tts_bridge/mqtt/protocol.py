"""Topics and payloads of the bridge's MQTT contract; pure functions, no network."""

from __future__ import annotations

import json
import re
import unicodedata
import uuid
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

from tts_bridge.config import LimitsSettings
from tts_bridge.formats import AudioFormat, FormatError

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


def mqtt_safe(value: str) -> bool:
    """True when `value` may go into an MQTT UTF-8 string (no control, format or surrogate
    characters, which brokers refuse as a malformed packet)."""
    return not any(unicodedata.category(c)[0] == "C" for c in value)


def new_id() -> str:
    return uuid.uuid4().hex


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, iteratively (a hostile payload must not recurse deeply)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(node, dict):
            stack.extend((v, level + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, level + 1) for v in node)
    return deepest


def _first_error(error: ValidationError) -> str:
    item = error.errors()[0]
    # Only the field name: union members ('id.str') mean nothing to a user.
    where = str(item["loc"][0]) if item["loc"] else "payload"
    if item["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if item["type"] == "missing":
        return f"field {where!r} is required"
    return f"field {where!r}: {item['msg']}"


def _parse_format(value: object, request_id: str | int | None) -> AudioFormat | None:
    if value is None:
        return None
    try:
        return AudioFormat.parse(value)
    except FormatError as exc:
        raise ProtocolError("invalid_format", f"field 'format': {exc}", request_id) from None


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
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        return SayRequest(new_id(), text, target, None, None, True)
    try:
        data = json.loads(stripped)
    except RecursionError:
        raise ProtocolError("json_too_deep", "JSON nesting is too deep") from None
    except ValueError as exc:
        raise ProtocolError(
            "invalid_json", f"payload looks like JSON but does not parse: {exc}"
        ) from None
    if _depth(data) > limits.max_json_depth:
        raise ProtocolError("json_too_deep", f"JSON nesting exceeds {limits.max_json_depth} levels")
    if not isinstance(data, dict):
        raise ProtocolError(
            "invalid_request", "a JSON payload must be an object with a 'text' field"
        )
    raw_id = data.get("id")
    request_id: str | int | None = (
        raw_id if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else None
    )
    try:
        parsed = SayPayload.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError("invalid_request", _first_error(exc), request_id) from None
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
    )


def parse_api_request(payload: bytes, limits: LimitsSettings) -> dict[str, Any]:
    """A bridge API payload: empty, a JSON object, or a plain string (as {"value": ...})."""
    if len(payload) > limits.max_payload_bytes:
        raise ProtocolError("payload_too_large", "payload too large")
    try:
        text = payload.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ProtocolError("invalid_utf8", "payload is not valid UTF-8") from None
    if not text:
        return {}
    if not text.startswith(("{", "[")):
        return {"value": text}
    try:
        data = json.loads(text)
    except RecursionError:
        raise ProtocolError("json_too_deep", "JSON nesting is too deep") from None
    except ValueError as exc:
        raise ProtocolError("invalid_json", f"payload does not parse as JSON: {exc}") from None
    if _depth(data) > limits.max_json_depth:
        raise ProtocolError("json_too_deep", f"JSON nesting exceeds {limits.max_json_depth} levels")
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
    return json.dumps(body, ensure_ascii=False).encode()


def ok_response(request_id: str | int, data: dict[str, Any]) -> bytes:
    return json.dumps({"status": "ok", "id": request_id, "data": data}).encode()


def error_response(request_id: str | int | None, code: str, message: str) -> bytes:
    body = {"status": "error", "id": request_id, "error": message, "code": code}
    return json.dumps(body, ensure_ascii=False).encode()
