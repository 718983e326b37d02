"""Small helpers shared by the benchmarks: the machine, a text table, child processes, memory."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
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


def _status_kb(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return None


def peak_rss_mb() -> float:
    """This process's peak RSS since exec (VmHWM), in MiB.

    Not getrusage's ru_maxrss: Linux carries that across fork and exec, so a child process would
    report its parent's peak when the parent was the bigger one.
    """
    kb = _status_kb("VmHWM")
    if kb is None:  # not Linux: the best there is
        import resource

        kb = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return kb / 1024


def rss_mb() -> float:
    """This process's current RSS (VmRSS), in MiB."""
    kb = _status_kb("VmRSS")
    return (kb or 0) / 1024


def run_child(module: str, args: Sequence[str], *, timeout: float) -> dict[str, Any]:
    """``python -m module args...`` in a fresh process; its last stdout line is a JSON object."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench child {module} {args[:1]} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def time_first_chunk(synthesize: Callable[[], Iterable[Any]]) -> dict[str, float]:
    """Time a synthesis from the call to its first yielded audio, and to its end.

    Returns milliseconds to the first non-empty chunk and to the end, the samples of that chunk
    and of all chunks (``len`` of each), and the number of non-empty chunks. Empty chunks (an
    engine may yield one as a "more follows" marker) are not audio and are not counted.
    """
    started = time.perf_counter()
    first_ms = 0.0
    first = total = chunks = 0
    for chunk in synthesize():
        if not len(chunk):
            continue
        if chunks == 0:
            first_ms = 1000 * (time.perf_counter() - started)
            first = len(chunk)
        chunks += 1
        total += len(chunk)
    if chunks == 0:
        raise RuntimeError("the engine yielded no audio")
    return {
        "first_ms": first_ms,
        "total_ms": 1000 * (time.perf_counter() - started),
        "first_samples": first,
        "total_samples": total,
        "chunks": chunks,
    }


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Replace ``owner.name`` with ``value`` for the duration (it must exist), then restore it.

    unittest.mock would do, but it imports asyncio: megabytes in a process whose RSS is measured.
    """
    if not hasattr(owner, name):
        raise AttributeError(f"{owner!r} has no {name!r} to replace (has the code changed?)")
    own = name in vars(owner)
    original = vars(owner)[name] if own else None
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)
