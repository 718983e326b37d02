"""A fault that repeats every second is reported once a minute, with how often it happened.

The throttle serves the door loops (failed accepts), the MQTT client (refused publishes) and
the maintenance thread; tested here with a clock the test moves."""

from __future__ import annotations

import logging

import pytest

from tts_bridge.mqtt.bridge import MaintenanceFaults
from tts_bridge.system.faults import LogThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_first_occurrence_then_once_per_interval_with_the_count() -> None:
    clock = Clock()
    throttle = LogThrottle(60.0, clock)
    assert throttle.due("EMFILE") == 1
    reports = []
    for _ in range(150):  # one a second for two and a half minutes
        clock.now += 1.0
        reports.append(throttle.due("EMFILE"))
    counted = [r for r in reports if r is not None]
    assert counted == [60, 60]  # at 60 s and at 120 s, each counting what came since
    assert throttle.due("ENFILE") == 1  # another condition has its own clock


def test_forget_and_clear_make_the_next_occurrence_news() -> None:
    clock = Clock()
    throttle = LogThrottle(60.0, clock)
    assert throttle.due("a") == 1
    assert throttle.due("b") == 1
    assert throttle.due("a") is None
    throttle.forget("a")
    assert throttle.due("a") == 1
    assert throttle.due("b") is None
    throttle.clear()
    assert throttle.due("b") == 1


def test_keys_from_outside_cannot_grow_it_without_bound() -> None:
    clock = Clock()
    throttle = LogThrottle(60.0, clock, max_keys=8)
    for target in range(1000):  # a client inventing a target (a topic) per request
        assert throttle.due((f"tts_bridge/audio/t{target}", "Not authorized")) == 1
    # The 8 most recent keys are remembered; the first one was let go.
    for target in range(992, 1000):
        assert throttle.due((f"tts_bridge/audio/t{target}", "Not authorized")) is None
    assert throttle.due(("tts_bridge/audio/t0", "Not authorized")) == 1


def test_a_lasting_maintenance_fault_is_one_traceback_then_a_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    faults = MaintenanceFaults(LogThrottle(60.0, clock))
    error = OSError(24, "Too many open files")
    with caplog.at_level(logging.INFO, logger="tts_bridge.mqtt.bridge"):
        for _ in range(300):  # five minutes of passes, one a second
            faults.failed(error)
            clock.now += 1.0
        faults.passed()
        faults.passed()  # nothing to say while it works
        faults.failed(error)  # the same fault after a recovery is news again
    records = [r for r in caplog.records if r.name == "tts_bridge.mqtt.bridge"]
    messages = [r.getMessage() for r in records]
    assert len(records) == 1 + 4 + 1 + 1, messages
    assert records[0].exc_info is not None and messages[0] == "Maintenance failed"
    assert all(r.exc_info is None for r in records[1:5])
    assert messages[1] == (
        "Maintenance still failing (60 passes since the last report): "
        "OSError: [Errno 24] Too many open files"
    )
    assert messages[5] == "Maintenance works again after 300 failed passes"
    assert records[6].exc_info is not None


def test_a_new_maintenance_fault_gets_its_own_traceback(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    faults = MaintenanceFaults(LogThrottle(60.0, clock))
    with caplog.at_level(logging.ERROR, logger="tts_bridge.mqtt.bridge"):
        faults.failed(OSError(24, "Too many open files"))
        clock.now += 1.0
        faults.failed(PermissionError(13, "Permission denied"))
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert [type(r.exc_info[1]).__name__ for r in tracebacks if r.exc_info] == [
        "OSError",
        "PermissionError",
    ]
