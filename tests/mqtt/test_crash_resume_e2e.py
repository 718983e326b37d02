"""A bridge killed again and again: the requests queued behind the one that kills it are spoken.

The bridge runs as a subprocess with a test-only engine (tests/support/crash_engine.py) that
kills its process with SIGKILL on a magic text, or hangs in synthesis on another; mosquitto keeps
the bridge's session across the kills, as a broker with persistence would.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import crash_engine
from tests.support.harness import BridgeFactory, MqttProbe, ProbeFactory, RunningBridge
from tts_bridge.bench.localbroker import LocalBroker
from tts_bridge.mqtt.journal import DEFAULT_MAX_ATTEMPTS, Journal

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
TARGET = "attic"
WAIT_S = 60.0

pytestmark = pytest.mark.slow


class CrashBridgeFactory(BridgeFactory):
    module = "tests.support.crash_bridge"

    def default_config(self) -> dict[str, Any]:
        return {
            **super().default_config(),
            "voices": {"crash": {"engine": crash_engine.KIND}},
            "default_voice": "crash",
            "scheduler": {"idle_enabled": False},
        }


@pytest.fixture
def crashing(broker: LocalBroker, tmp_path: Path) -> Iterator[CrashBridgeFactory]:
    factory = CrashBridgeFactory(broker, tmp_path)
    try:
        yield factory
    finally:
        factory.close()


def say(probe: MqttProbe, request_id: str, text: str) -> None:
    probe.publish(f"{BASE}/say/{TARGET}", json.dumps({"text": text, "id": request_id}))


def answers(probe: MqttProbe) -> list[dict[str, Any]]:
    return [m.json() for m in probe.messages if m.topic == RESPONSE]


def spoken(probe: MqttProbe) -> Counter[str]:
    """Audio messages per request id."""
    return Counter(
        m.user_properties.get("id", "")
        for m in probe.messages
        if m.topic == f"{BASE}/audio/{TARGET}"
    )


def wait_until(bridge: RunningBridge, probe: MqttProbe, ids: set[str], timeout: float) -> bool:
    """Until every id in `ids` is answered (True) or the bridge died (False)."""
    deadline = time.monotonic() + timeout
    while not ids <= {a["id"] for a in answers(probe)}:
        if not bridge.running:
            return False
        assert time.monotonic() < deadline, f"no answer for {ids}\n{bridge.log_tail()}"
        time.sleep(0.05)
    return True


def wait_dead(bridge: RunningBridge, timeout: float = WAIT_S) -> None:
    returncode = bridge.proc.wait(timeout=timeout)
    bridge.kill()  # closes its log
    assert returncode == -signal.SIGKILL, bridge.log_tail()


def test_a_request_that_kills_the_bridge_is_refused_and_the_ones_behind_it_spoken(
    crashing: CrashBridgeFactory, probe_factory: ProbeFactory
) -> None:
    probe = probe_factory(f"{BASE}/#")
    bridge = crashing()
    say(probe, "poison", f"{crash_engine.POISON}: this one stops the bridge.")
    innocent = [f"behind-{i}" for i in range(5)]
    for i, request_id in enumerate(innocent):
        say(probe, request_id, f"Announcement number {i}, queued behind it.")
    wait_dead(bridge)
    starts = 1
    live = []
    while True:
        bridge = crashing(_wait_online=False)
        starts += 1
        probe.diagnostics = bridge.log_tail
        request_id = f"live-{starts}"  # arrives while the suspect waits its turn, or is tried
        say(probe, request_id, f"A live announcement at start {starts}.")
        live.append(request_id)
        if wait_until(bridge, probe, {"poison"}, WAIT_S):
            break
        wait_dead(bridge)
        # The ones that waited behind it were served before it was tried again.
        assert set(innocent) <= {a["id"] for a in answers(probe)}, bridge.log_tail()
        assert starts <= DEFAULT_MAX_ATTEMPTS + 1, "the poison request was never refused"
    assert wait_until(bridge, probe, {*innocent, *live}, WAIT_S), bridge.log_tail()
    # Its synthesis started at the first start and at each start after the waiting ones.
    assert starts == DEFAULT_MAX_ATTEMPTS + 1
    by_id = Counter(a["id"] for a in answers(probe))
    assert all(n == 1 for n in by_id.values()), by_id
    [refused] = [a for a in answers(probe) if a["id"] == "poison"]
    assert (refused["status"], refused["code"]) == ("error", "poison_request"), refused
    assert all(a["status"] == "ok" for a in answers(probe) if a["id"] != "poison")
    heard = spoken(probe)
    assert all(heard[i] == 1 for i in [*innocent, *live]), heard
    assert heard["poison"] == 0
    log = bridge.log_path.read_text(encoding="utf-8")
    # Named once, as an error (the answer itself is not a second log line).
    assert len([line for line in log.splitlines() if "poison_request" in line]) == 1, log
    assert "ERROR" in next(line for line in log.splitlines() if "poison_request" in line)
    bridge.stop()


def test_random_kills_without_a_poison_request_drop_nothing(
    crashing: CrashBridgeFactory,
    probe_factory: ProbeFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRASH_ENGINE_SECONDS", "0.08")  # kills land in synthesis, too
    rng = random.Random(35)
    probe = probe_factory(f"{BASE}/#")
    bridge = crashing()
    ids: list[str] = []
    kills = 4
    for round_ in range(kills + 1):
        for i in range(6):
            ids.append(f"stream-{round_}-{i}")
            say(probe, ids[-1], f"Announcement {i} of round {round_}.")
            time.sleep(rng.uniform(0.0, 0.1))
        if round_ < kills:
            time.sleep(rng.uniform(0.0, 0.3))  # SIGKILL at a random moment of the stream
            bridge.kill()
            bridge = crashing()
            probe.diagnostics = bridge.log_tail
    assert wait_until(bridge, probe, set(ids), WAIT_S), bridge.log_tail()
    statuses = Counter(a["status"] for a in answers(probe))
    assert statuses == {"ok": len(answers(probe))}, answers(probe)
    heard = spoken(probe)
    assert all(heard[i] >= 1 for i in ids), heard
    # A second answer only where a kill fell between publishing it and recording it.
    twice = [i for i, n in Counter(a["id"] for a in answers(probe)).items() if n > 1]
    assert len(twice) <= kills, twice
    bridge.stop()


def test_the_count_survives_a_kill_between_start_and_first_audio(
    crashing: CrashBridgeFactory, probe_factory: ProbeFactory, tmp_path: Path
) -> None:
    probe = probe_factory(f"{BASE}/#")
    bridge = crashing()
    say(probe, "hang", f"{crash_engine.HANG} in the engine.")
    say(probe, "behind", "Waiting behind it.")
    deadline = time.monotonic() + WAIT_S
    while crash_engine.HANG_LOG not in bridge.log_path.read_text(encoding="utf-8"):
        assert time.monotonic() < deadline, bridge.log_tail()
        time.sleep(0.02)
    time.sleep(0.3)  # the one behind it is journaled meanwhile
    bridge.kill()
    assert not answers(probe)
    with Journal(tmp_path / "journal.sqlite3") as journal:
        resumed = journal.resume()
    [suspect] = resumed.suspects
    [waiting] = resumed.entries
    assert json.loads(suspect.payload)["id"] == "hang" and suspect.attempts == 1
    assert json.loads(waiting.payload)["id"] == "behind" and waiting.attempts == 0
    assert resumed.poison == []
