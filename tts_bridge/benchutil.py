"""Small helpers shared by the benchmarks: the machine's description and a text table."""

from __future__ import annotations

import os
import platform
from typing import Any


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
    }


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Left-aligned columns, a header line first."""
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += [
        "  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True))
        for r in rows
    ]
    return "\n".join(lines)
