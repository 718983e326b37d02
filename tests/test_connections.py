"""Connection caps, their fitting under the open-file limit and the loop's fault log, in process
(tests/test_doors.py drives them through real sockets)."""

from __future__ import annotations

import errno
import logging
import resource

import pytest

from tts_bridge.config import load_settings
from tts_bridge.system.connections import (
    LISTEN_BACKLOG,
    RESERVED_FILES,
    ConnectionGate,
    LoopFaults,
    fit_connection_caps,
)


def test_the_gate_counts_per_door_and_per_peer() -> None:
    gate = ConnectionGate("http", 3, 2)
    assert gate.admit("a") is None
    assert gate.admit("a") is None
    assert gate.admit("a") == "http.max_connections_per_peer"
    assert gate.admit("b") is None
    assert gate.admit("c") == "http.max_connections"
    gate.release("a")
    assert gate.admit("c") is None
    snapshot = gate.snapshot()
    assert snapshot["open"] == 3 and snapshot["peers"] == 3
    assert snapshot["refused"] == {"http.max_connections_per_peer": 1, "http.max_connections": 1}


def test_caps_fit_under_the_open_file_limit() -> None:
    settings = load_settings(None, {}, environ={})
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    caps = fit_connection_caps(settings, raise_limit=False)
    assert caps.open_files_limit == soft
    room = soft - RESERVED_FILES - 2 * LISTEN_BACKLOG
    if room >= 2 * (256 + 64):
        assert (caps.http, caps.wyoming) == (256, 64)
        assert (caps.http_per_peer, caps.wyoming_per_peer) == (32, 8)
    else:
        assert caps.http + caps.wyoming <= max(2, room)


@pytest.mark.parametrize("limit", [256, 512])
def test_caps_shrink_together_under_a_low_limit(
    limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (limit, limit))
    settings = load_settings(None, {}, environ={})
    caps = fit_connection_caps(settings)
    room = limit - RESERVED_FILES - 2 * LISTEN_BACKLOG
    assert caps.http + caps.http // 8 + caps.wyoming + caps.wyoming // 8 <= room
    assert caps.http > caps.wyoming >= 1
    assert caps.http_per_peer <= caps.http and caps.wyoming_per_peer <= caps.wyoming


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_loop_faults_log_one_line_per_condition_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    faults = LoopFaults("HTTP", 60.0, clock)
    emfile = {
        "message": "socket.accept() out of system resource",
        "exception": OSError(errno.EMFILE, "Too many open files"),
    }
    with caplog.at_level(logging.ERROR, logger="tts_bridge.system.connections"):
        for _ in range(1000):
            faults(None, emfile)  # type: ignore[arg-type]
            clock.now += 0.01
        faults(None, {"message": "odd", "exception": ValueError("x")})  # type: ignore[arg-type]
        clock.now += 60
        faults(None, emfile)  # type: ignore[arg-type]
    lines = [r for r in caplog.records if r.name == "tts_bridge.system.connections"]
    assert len(lines) == 3
    assert lines[0].exc_info is None and "EMFILE" in lines[0].getMessage()
    assert lines[1].exc_info is not None  # anything else keeps its traceback
    assert "1000 time(s)" in lines[2].getMessage()  # 999 since the first line, and this one
    assert faults.snapshot()["EMFILE (too many open files in this process)"] == 1001
