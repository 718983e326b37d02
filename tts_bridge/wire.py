"""Encodings every door shares: request ids and JSON that always encodes.

The MQTT answers, the Wyoming server and the audio links all name requests and send JSON; keeping
both here means no door borrows them from another door's codec.
"""

from __future__ import annotations

import json
import uuid
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
