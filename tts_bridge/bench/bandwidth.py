"""The machine's memory bandwidth, and a GPT step's floor under it.

A batch-1 step of the code loop reads every GPT weight once and does little arithmetic per byte,
so its time cannot fall below (bytes read) / (memory bandwidth). The bench measures the
bandwidth at start, in the same run as the steps, so a busy host lowers both alike.

The bandwidth is a numpy copy of a buffer far larger than the caches, split across the same
number of threads as the sessions use (numpy releases the GIL while it copies): bytes read plus
bytes written, per second, the best of a few repetitions. A copy is the access pattern closest
to a step's (stream in the weights, write the activations) that numpy can do at full speed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

BUFFER_BYTES = 256 * 1024 * 1024
"""Far above any CPU's last-level cache, small enough to allocate twice on a small board."""
REPEATS = 5


def memory_bandwidth(
    threads: int = 1, *, buffer_bytes: int = BUFFER_BYTES, repeats: int = REPEATS
) -> dict[str, Any]:
    """Copy bandwidth in GB/s (read + written bytes), the best of ``repeats`` copies."""
    threads = max(1, threads)
    count = buffer_bytes // 8
    source = np.ones(count, dtype=np.float64)  # touched: every page really is resident
    dest = np.zeros(count, dtype=np.float64)
    bounds = np.linspace(0, count, threads + 1, dtype=np.int64)
    parts = [(int(a), int(b)) for a, b in itertools.pairwise(bounds.tolist())]

    def copy(start: int, stop: int) -> None:
        np.copyto(dest[start:stop], source[start:stop])

    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=copy, args=part) for part in parts[1:]]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        copy(*parts[0])
        for worker in workers:
            worker.join()
        best = min(best, time.perf_counter() - started)
    return {
        "gb_per_s": round(2 * source.nbytes / best / 1e9, 2),
        "buffer_mb": round(source.nbytes / 1e6),
        "threads": threads,
        "how": "numpy copy of a buffer far larger than the caches, bytes read + written per "
        f"second, best of {repeats}",
    }


def step_floors(
    rows: Sequence[Mapping[str, Any]],
    weight_bytes: Mapping[str, int],
    gb_per_s: float,
) -> list[dict[str, Any]]:
    """For every ONNX row with a GPT step time: weights read per step, floor, step / floor.

    ``weight_bytes`` maps a case to the bytes of its GPT graph's weights (read once per step
    whatever the batch size). The KV cache a step reads grows with the text and is left out of
    the floor; the row shows its mean over the generation next to it.
    """
    floors = []
    for row in rows:
        case, step_ms = row["case"], row.get("gpt_ms_per_step")
        if case not in weight_bytes or step_ms is None:
            continue
        floor_ms = weight_bytes[case] / (gb_per_s * 1e9) * 1000
        floors.append(
            {
                "case": case,
                "batch": row["batch"],
                "weights MB/step": round(weight_bytes[case] / 1e6, 1),
                "KV MB/step (mean)": row.get("kv_mb_per_step_mean", ""),
                # Three significant digits: a tiny model's floor is far below 0.01 ms.
                "floor ms": float(f"{floor_ms:.3g}"),
                "GPT ms/step": step_ms,
                "x floor": round(step_ms / floor_ms, 2),
            }
        )
    return floors
