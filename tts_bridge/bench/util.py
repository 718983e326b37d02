"""Small helpers shared by the benchmarks: the machine, a text table, child processes, memory,
a bridge process of its own."""

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
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tts_bridge.config import Settings


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


def start_bridge(
    settings: Settings,
    *,
    host: str,
    port: int,
    base: str,
    workdir: Path,
    log: IO[str],
    overrides: dict[str, dict[str, Any]] | None = None,
) -> subprocess.Popen[bytes]:
    """``tts-bridge run`` in a child process on the bench's broker, with its state in
    ``workdir``; ``overrides`` change whole settings sections' keys."""
    import yaml

    config = settings.model_dump(mode="json")
    config["mqtt"].update({"host": host, "port": port, "base_topic": base, "client_id": "bench"})
    config["cache"]["dir"] = str(workdir / "cache")
    config["journal"]["path"] = str(workdir / "journal.sqlite3")
    config["wyoming"]["enabled"] = False  # an MQTT benchmark: no Wyoming server
    # Loopback and any free port: a benchmark's audio server stays off the LAN.
    config["http"].update({"host": "127.0.0.1", "port": 0})
    config["homeassistant"]["discovery"] = False  # a benchmark is not a device of the home
    for section, values in (overrides or {}).items():
        config.setdefault(section, {}).update(values)
    config_path = workdir / "bridge.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return subprocess.Popen(
        [sys.executable, "-m", "tts_bridge", "run", "--config", str(config_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
