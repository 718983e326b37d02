"""The encodings every door shares."""

from __future__ import annotations

import json

import pytest

from tts_bridge.wire import encode_json, json_depth


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("", 0),
        ('"just a string"', 0),
        ("{}", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('{"a": "[[[[[{{{{"}', 1),  # brackets in strings do not count
        ('{"a": "\\"[[["}', 1),  # nor after an escaped quote
        ('[{"x": "\\\\"}, [[]]]', 3),
    ],
)
def test_json_depth(text: str, depth: int) -> None:
    assert json_depth(text, 64) == depth
    assert json_depth(text.encode(), 64) == depth


def test_json_depth_stops_past_the_limit_without_recursing() -> None:
    deep = "[" * 200_000 + "]" * 200_000
    assert json_depth(deep, 8) == 9
    with pytest.raises(RecursionError):  # what it spares the doors
        json.loads(deep)


def test_encode_json_escapes_what_utf8_cannot_carry() -> None:
    assert json.loads(encode_json({"text": "a\ud800b"})) == {"text": "a\ud800b"}
    assert encode_json({"text": "é"}) == '{"text": "é"}'.encode()
