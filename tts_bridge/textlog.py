"""User text in log lines: shortened and on one line, so logs stay readable and small."""

from __future__ import annotations


def short(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")
