"""Encodings every door shares: request ids and JSON that always encodes.

The MQTT answers, the Wyoming server and the audio links all name requests and send JSON; keeping
both here means no door borrows them from another door's codec.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any


def new_id() -> str:
    """A fresh request id (32 hex characters) for a request that came without one."""
    return uuid.uuid4().hex


def encode_json(body: Any) -> bytes:
    """JSON as UTF-8 text; anything UTF-8 cannot carry (a lone surrogate from a request's id
    or option key) is escaped as JSON ``\\uXXXX`` instead, so a refusal is always sent."""
    try:
        return json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(body, ensure_ascii=True).encode()


def json_depth(raw: bytes | str, limit: int) -> int:
    """How deeply the JSON text ``raw`` nests, counted without parsing it (strings skipped);
    stops counting once past ``limit``. json.loads recurses once per level: text nested many
    thousands deep raises RecursionError there, so a door checks this first."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if "[" not in text and "{" not in text:
        return 0
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif char in "]}":
            depth -= 1
    return deepest


class JsonTooDeepError(ValueError):
    """JSON nested deeper than a door accepts."""


def load_json(
    raw: bytes | str, max_depth: int, parse_constant: Callable[[str], Any] | None = None
) -> Any:
    """json.loads for what a client sends: nesting past ``max_depth`` raises JsonTooDeepError
    before parsing (never a RecursionError from the parser); text that is not JSON raises
    ValueError (UnicodeDecodeError for bytes that are not UTF-8)."""
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    # The scan bounds what the parser may recurse into; the parsed value's own depth (a
    # value inside a container counts one level deeper than it) is the limit's measure.
    if json_depth(text, max_depth) > max_depth:
        raise JsonTooDeepError(f"JSON nesting exceeds {max_depth} levels")
    value = json.loads(text, parse_constant=parse_constant)
    if _parsed_depth(value) > max_depth:
        raise JsonTooDeepError(f"JSON nesting exceeds {max_depth} levels")
    return value


def _parsed_depth(value: Any) -> int:
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


def raw_size(text: str) -> int:
    """UTF-8 bytes of a request's text as sent (a lone surrogate counts as three): what
    limits.max_raw_text_bytes counts on every door."""
    return len(text.encode("utf-8", "surrogatepass"))
