"""User text and log lines: never at INFO or above (the owner's words stay out of the usual log);
at DEBUG (`--debug`), shortened and on one line, so the log stays readable and small."""

from __future__ import annotations


def short(text: str, limit: int = 60) -> str:
    """The text for a DEBUG line: at most `limit` characters, on one line."""
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def size(text: str) -> str:
    """What an INFO line says of a text instead of its words: how long it is."""
    count = len(text)
    return f"{count} character{'' if count == 1 else 's'}"
