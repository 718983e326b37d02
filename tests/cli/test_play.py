"""The reference player against a real mosquitto: WAVs from the audio and stream topics to files.

Playing through a sound card cannot happen here (no audio device), so that path runs a stand-in
``aplay`` script from a temporary PATH that stores what it is piped; everything else is real.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from paho.mqtt.properties import Properties

from tests.support.harness import REPO_ROOT, MqttProbe, ProbeFactory, request_properties
from tts_bridge.bench.localbroker import LocalBroker, free_port
from tts_bridge.cli.play import (
    EXIT_BROKER,
    EXIT_OK,
    EXIT_SETUP,
    file_part,
    run_player,
)

BASE = "tts_bridge"
AUDIO = f"{BASE}/audio/kitchen"
STREAM = f"{AUDIO}/stream"
WAIT_S = 15.0
FILE_RE = re.compile(r"^\d{8}-\d{6}\.\d{3}-(?P<rest>.+)\.wav$")


def make_wav(samples: int, rate: int = 16000) -> bytes:
    """A short mono 16-bit WAV; the sample count makes each one distinguishable."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(range(256)) * (samples * 2 // 256) + b"\0" * (samples * 2 % 256))
    return buffer.getvalue()


def audio_properties(**pairs: str) -> Properties:
    props = request_properties()
    props.UserProperty = list(pairs.items())
    return props


@dataclass
class PlayerRun:
    """run_player on a thread; ``result`` holds its exit status once it has returned."""

    thread: threading.Thread
    ready: threading.Event
    stop: threading.Event
    result: list[int] = field(default_factory=list)

    def join(self, timeout: float = WAIT_S) -> int:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "run_player did not return"
        return self.result[0]


StartPlayer = Callable[[Path | None, int | None], PlayerRun]


@pytest.fixture
def start_player(broker: LocalBroker) -> Iterator[StartPlayer]:
    """``start_player(out_dir, count)``: run_player on a thread, subscribed when it returns."""
    runs: list[PlayerRun] = []

    def start(out_dir: Path | None, count: int | None) -> PlayerRun:
        ready, stop = threading.Event(), threading.Event()
        result: list[int] = []

        def main() -> None:
            result.append(
                run_player(
                    broker.host,
                    broker.port,
                    BASE,
                    "kitchen",
                    out_dir,
                    count=count,
                    stop=stop,
                    ready=ready,
                )
            )

        run = PlayerRun(threading.Thread(target=main, daemon=True), ready, stop, result)
        runs.append(run)
        run.thread.start()
        assert ready.wait(WAIT_S), "the player did not subscribe"
        return run

    yield start
    for run in runs:  # a failed test must not leave a player running
        run.stop.set()
        run.thread.join(WAIT_S)


def publish_test_traffic(probe: MqttProbe) -> tuple[bytes, bytes]:
    """Noise the player must skip, then one announcement and one streamed sentence."""
    whole, sentence = make_wav(800), make_wav(1600)
    probe.publish(AUDIO, b'{"status": "error"}')  # not a WAV: skipped, not counted
    probe.publish(AUDIO, whole, properties=audio_properties(id="door/1 ../../x", tier="fast"))
    probe.publish(STREAM, sentence, properties=audio_properties(id="door-2", seq="0", last="1"))
    return whole, sentence


def test_writes_audio_and_stream_wavs(
    tmp_path: Path, probe_factory: ProbeFactory, start_player: StartPlayer
) -> None:
    probe = probe_factory()
    # A stale retained WAV must not be written again at every start.
    probe.publish(AUDIO, make_wav(100), retain=True)
    out_dir = tmp_path / "out" / "kitchen"
    run = start_player(out_dir, 2)

    whole, sentence = publish_test_traffic(probe)

    assert run.join() == EXIT_OK
    files = sorted(out_dir.iterdir())
    assert [f.name for f in files if f.name.startswith(".")] == []  # no partial files left
    assert len(files) == 2, [f.name for f in files]
    names = {}
    for path in files:
        match = FILE_RE.match(path.name)
        assert match, path.name
        names[match["rest"]] = path.read_bytes()
    # The id is cut down to safe characters (no path separators); a streamed chunk adds its seq.
    assert names == {"door_1_.._.._x": whole, "door-2-0": sentence}


def test_stop_event_ends_a_player_without_count(
    tmp_path: Path, probe_factory: ProbeFactory, start_player: StartPlayer
) -> None:
    out_dir = tmp_path / "out"
    run = start_player(out_dir, None)
    probe_factory().publish(AUDIO, make_wav(400), properties=audio_properties(id="a"))
    deadline = time.monotonic() + WAIT_S
    while not any(out_dir.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    run.stop.set()
    assert run.join() == EXIT_OK
    assert [FILE_RE.match(f.name) is not None for f in out_dir.iterdir()] == [True]


def test_plays_through_the_first_player_found(
    tmp_path: Path,
    probe_factory: ProbeFactory,
    start_player: StartPlayer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bin_dir, played = tmp_path / "bin", tmp_path / "played"
    bin_dir.mkdir()
    played.mkdir()
    stand_in = bin_dir / "aplay"
    # Stores stdin and the arguments it was given, as aplay would play stdin.
    stand_in.write_text(
        '#!/bin/sh\nn=$(ls "$PLAYED" | grep -c wav)\n'
        'cat > "$PLAYED/$n.wav"\necho "$@" > "$PLAYED/$n.args"\n'
    )
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("PLAYED", str(played))
    run = start_player(None, 2)

    whole, sentence = publish_test_traffic(probe_factory())

    assert run.join() == EXIT_OK
    assert (played / "0.wav").read_bytes() == whole
    assert (played / "1.wav").read_bytes() == sentence
    assert (played / "0.args").read_text().split() == ["-q", "-"]


def test_no_player_and_no_out_dir_is_a_clear_error(
    tmp_path: Path,
    broker: LocalBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    status = run_player(broker.host, broker.port, BASE, "kitchen", None)
    assert status == EXIT_SETUP
    assert "No audio player found" in caplog.text
    assert "--out" in caplog.text


def test_unreachable_broker_is_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    status = run_player("127.0.0.1", port, BASE, "kitchen", tmp_path / "out", count=1)
    assert status == EXIT_BROKER
    assert f"127.0.0.1:{port}" in caplog.text


@pytest.mark.parametrize("target", ["kitchen/upstairs", "", "a#"])
def test_bad_target_is_refused(tmp_path: Path, target: str) -> None:
    assert run_player("127.0.0.1", 1, BASE, target, tmp_path) == EXIT_SETUP


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("door-1", "door-1"),
        ("a/b\\c", "a_b_c"),
        ("../../etc/passwd", "etc_passwd"),
        ("晚饭", "noid"),
        ("", "noid"),
        (None, "noid"),
        ("x" * 100, "x" * 64),
    ],
)
def test_file_part(text: str | None, expected: str) -> None:
    assert file_part(text) == expected


def test_ctrl_c_exits_cleanly(tmp_path: Path, broker: LocalBroker) -> None:
    code = (
        "import logging, sys\n"
        "from pathlib import Path\n"
        "from tts_bridge.cli.play import run_player\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        f"sys.exit(run_player({broker.host!r}, {broker.port}, {BASE!r}, 'kitchen', "
        f"Path({str(tmp_path / 'out')!r})))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stderr=subprocess.PIPE, env=env, text=True
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "Listening on" in line:
                break
        else:
            pytest.fail(f"the player never listened:\n{''.join(seen)}")
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(WAIT_S) == EXIT_OK, rest
        assert "Traceback" not in rest, rest
        assert "Stopped after 0 audio message(s)" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
