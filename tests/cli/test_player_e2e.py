"""`tts-bridge play` receives what the real bridge process publishes through a real broker.

Discovery, Hermes, streaming and the bridge API are tested in process (test_frontends.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile

from tests.support.harness import BridgeFactory, ProbeFactory

BASE = "tts_bridge"
WAIT_S = 60.0

pytestmark = pytest.mark.slow


def test_player_writes_what_arrives(
    tmp_path: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory()
    out = tmp_path / "played"
    config = bridge.config_path
    player = subprocess.Popen(
        [
            *(sys.executable, "-m", "tts_bridge", "play", "--config", str(config)),
            *("--target", "porch", "--out", str(out), "--count", "1"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    probe = probe_factory(f"{BASE}/#")
    deadline = time.monotonic() + WAIT_S
    while not out.exists() and time.monotonic() < deadline:  # the player made its folder
        time.sleep(0.1)
    time.sleep(0.5)
    probe.publish(f"{BASE}/say/porch", json.dumps({"text": "Someone is at the door.", "id": "p1"}))
    output, _ = player.communicate(timeout=WAIT_S)
    assert player.returncode == 0, output
    (wav,) = out.glob("*.wav")
    assert "p1" in wav.name
    audio, rate = soundfile.read(wav)
    assert rate == 22050 and 0.8 < len(audio) / rate < 4
