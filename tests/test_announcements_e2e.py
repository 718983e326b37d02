"""End-to-end: announcements through the real bridge subprocess and a private mosquitto.

A chime at the start of the one answer on every door (the WAV on MQTT, the file behind the URL,
the Wyoming stream of a preset voice), the bridge API's lists and edits, and bad input refused
while the bridge keeps serving.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from tests.support.harness import (
    BridgeFactory,
    MqttProbe,
    ProbeFactory,
    ReceivedMessage,
    RunningBridge,
    bridge_api,
)
from tests.support.web import fetch
from tts_bridge.speech.chimes import ChimeLibrary
from tts_bridge.speech.loudness import LoudnessNormalizer
from tts_bridge.speech.settings import ChimesSettings

pytestmark = pytest.mark.slow

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
WAIT_S = 60.0
JOE_RATE = 22050
VOICES = ("joe", "heart")


def _chime(name: str, rate: int = JOE_RATE) -> np.ndarray:
    """The chime as the bridge makes it (built-in: the same synthesis, the same loudness)."""
    library = ChimeLibrary(ChimesSettings(dir=Path("/nonexistent")), LoudnessNormalizer(-18, -1))
    return library.pcm(name, rate)


def _say(probe: MqttProbe, target: str, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The answer and what came on the target's audio topic (b"" for an error)."""
    since = probe.mark()
    probe.publish(f"{BASE}/say/{target}", json.dumps(request))
    rid = request["id"]
    answer = probe.wait_for(
        lambda m: m.topic == RESPONSE and m.json()["id"] == rid, WAIT_S, since=since
    ).json()
    if answer["status"] != "ok":
        return answer, b""

    def audio(m: ReceivedMessage) -> bool:
        return m.topic == f"{BASE}/audio/{target}" and m.user_properties["id"] == str(rid)

    return answer, probe.wait_for(audio, WAIT_S, since=since).payload


def _samples(data: bytes) -> tuple[np.ndarray, int]:
    pcm, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    return np.asarray(pcm), int(rate)


async def _wyoming(port: int, event: Event) -> list[Event]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(event)
        events = []
        while True:
            got = await asyncio.wait_for(client.read_event(), WAIT_S)
            if got is None:
                break
            events.append(got)
            if got.type in ("audio-stop", "info", "error"):
                break
        return events


@pytest.fixture
def bridge(bridge_factory: BridgeFactory) -> RunningBridge:
    return bridge_factory(
        targets={
            "hall": {"chime": "dingdong"},
            "esp": {"payload": "url", "format": "wav"},
            "garage": {"gain_db": 6},
        },
        presets={"joe_chime": {"voice": "joe", "chime": "chime"}},
        scheduler={"idle_enabled": False},
    )


def test_a_chime_starts_the_one_answer_on_every_door(
    bridge: RunningBridge, probe_factory: ProbeFactory
) -> None:
    probe = probe_factory(RESPONSE, f"{BASE}/audio/#", f"{BASE}/bridge/response/#")
    probe.diagnostics = bridge.log_tail

    # MQTT: the request's chime, the WAV starts with it.
    answer, wav = _say(probe, "kitchen", {"text": "Dinner is ready.", "id": "c1", "chime": "ding"})
    assert answer["status"] == "ok", answer
    pcm, rate = _samples(wav)
    ding = _chime("ding", rate)
    assert np.array_equal(pcm[: ding.size], ding)

    # A target's default chime, and a request that turns it off.
    answer, wav = _say(probe, "hall", {"text": "Dinner is ready.", "id": "c2"})
    dingdong = _chime("dingdong")
    assert np.array_equal(_samples(wav)[0][: dingdong.size], dingdong)
    answer, wav = _say(probe, "hall", {"text": "Dinner is ready.", "id": "c3", "chime": ""})
    assert _samples(wav)[0].size < pcm.size - ding.size // 2

    # A target's gain on top of the common loudness: the same answer, 6 dB (2x) louder.
    _, plain = _say(probe, "kitchen", {"text": "Dinner is ready.", "id": "g1"})
    _, louder = _say(probe, "garage", {"text": "Dinner is ready.", "id": "g2"})
    quiet, loud = _samples(plain)[0].astype(float), _samples(louder)[0].astype(float)
    assert loud.size == quiet.size
    ratio = np.sqrt(np.mean(loud**2) / np.mean(quiet**2))
    assert ratio == pytest.approx(2.0, rel=0.05)

    # By URL: the file behind it starts with the chime too.
    answer, _ = _say(probe, "esp", {"text": "Dinner is ready.", "id": "c4", "chime": "alert"})
    status, _, body = fetch(answer["data"]["url"])
    assert status == 200
    alert = _chime("alert")
    assert np.array_equal(_samples(body)[0][: alert.size], alert)

    # Wyoming: the preset is a voice, and its stream starts with its chime.
    port = int(bridge.config["wyoming"]["port"])
    info = Info.from_event(asyncio.run(_wyoming(port, Describe().event()))[-1])
    voices = {v.name: v for v in info.tts[0].voices}
    assert "joe_chime" in voices and voices["joe_chime"].description == "joe with chime"
    events = asyncio.run(
        _wyoming(
            port,
            Synthesize(text="Dinner is ready.", voice=SynthesizeVoice(name="joe_chime")).event(),
        )
    )
    chunks = [AudioChunk.from_event(e).audio for e in events if e.type == "audio-chunk"]
    stream = np.frombuffer(b"".join(chunks), dtype="<i2")
    chime = _chime("chime")
    assert np.array_equal(stream[: chime.size], chime)

    # The bridge API lists the chimes; an unknown one is refused, and the bridge serves on.
    listed = bridge_api(probe, "chimes", timeout=WAIT_S)
    assert {c["name"] for c in listed["data"]["chimes"]} >= {"ding", "dingdong", "chime", "alert"}
    answer, _ = _say(probe, "kitchen", {"text": "Dinner is ready.", "id": "c5", "chime": "gong"})
    assert answer["status"] == "error" and answer["code"] == "unknown_chime", answer
    answer, _ = _say(probe, "kitchen", {"text": "Dinner is ready.", "id": "c6"})
    assert answer["status"] == "ok"


def test_lexicon_edits_change_every_voice_at_once_and_survive_a_restart(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(scheduler={"idle_enabled": False})
    probe = probe_factory(RESPONSE, f"{BASE}/audio/#", f"{BASE}/bridge/response/#")
    probe.diagnostics = bridge.log_tail
    text = "Siobhan is home."
    before = {v: _say(probe, "t", {"text": text, "id": f"b-{v}", "voice": v}) for v in VOICES}
    for voice, (answer, _) in before.items():
        assert answer["status"] == "ok", answer
        again, _ = _say(probe, "t", {"text": text, "id": f"a-{voice}", "voice": voice})
        assert again["data"]["cached"] is True

    changed = bridge_api(
        probe, "lexicon/set", {"word": "siobhan", "say": "shiv awn"}, timeout=WAIT_S
    )
    assert changed["status"] == "ok" and changed["data"]["saved"] is True, changed
    for voice in VOICES:
        # A new reading: new audio for every voice (not the cached sentence).
        answer, wav = _say(probe, "t", {"text": text, "id": f"c-{voice}", "voice": voice})
        assert answer["data"]["cached"] is False, answer
        assert wav != before[voice][1]
    refused = bridge_api(probe, "lexicon/set", {"word": "!!", "say": "bang"}, timeout=WAIT_S)
    assert refused["status"] == "error" and refused["code"] == "invalid_request"

    bridge.stop()
    bridge = bridge_factory(scheduler={"idle_enabled": False})
    listed = bridge_api(probe, "lexicon", timeout=WAIT_S)["data"]["entries"]
    assert {"word": "siobhan", "say": "shiv awn", "source": "runtime"} in listed
    answer, _ = _say(probe, "t", {"text": text, "id": "d", "voice": "joe"})
    assert answer["data"]["cached"] is True  # the edited reading, cached before the restart
    removed = bridge_api(probe, "lexicon/remove", {"word": "Siobhan"}, timeout=WAIT_S)
    assert removed["status"] == "ok", removed
    answer, _ = _say(probe, "t", {"text": text, "id": "e", "voice": "joe"})
    assert answer["data"]["cached"] is True  # the first reading again


def _longest_silence_ms(pcm: np.ndarray, rate: int) -> float:
    zero = np.concatenate([[False], pcm == 0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    runs = edges[1::2] - edges[::2]
    return float(runs.max()) * 1000 / rate if runs.size else 0.0


def test_ssml_on_mqtt_and_wyoming_and_bad_ssml_refused(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(scheduler={"idle_enabled": False})
    probe = probe_factory(RESPONSE, f"{BASE}/audio/#")
    probe.diagnostics = bridge.log_tail
    ssml = '<speak>The door is open.<break time="2s"/>Close it.</speak>'

    answer, wav = _say(probe, "t", {"text": ssml, "id": "s1", "voice": "joe"})
    assert answer["status"] == "ok", answer
    pcm, rate = _samples(wav)
    assert _longest_silence_ms(pcm, rate) >= 2000
    # Literal on request: the markup is not parsed (no two-second break).
    literal, wav = _say(probe, "t", {"text": ssml, "id": "s2", "voice": "joe", "ssml": False})
    assert literal["status"] == "ok", literal
    assert _longest_silence_ms(*_samples(wav)) < 2000

    port = int(bridge.config["wyoming"]["port"])
    events = asyncio.run(
        _wyoming(port, Synthesize(text=ssml, voice=SynthesizeVoice(name="joe")).event())
    )
    chunks = [AudioChunk.from_event(e).audio for e in events if e.type == "audio-chunk"]
    stream = np.frombuffer(b"".join(chunks), dtype="<i2")
    assert _longest_silence_ms(stream, JOE_RATE) >= 2000

    for n, bad in enumerate(
        [
            "<speak>Hello <break time='1s'></speak>",
            '<!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>',
        ]
    ):
        refused, _ = _say(probe, "t", {"text": bad, "id": f"bad{n}"})
        assert refused["status"] == "error" and refused["code"] == "invalid_ssml", refused
        assert "line 1, column" in refused["error"], refused
    # Plain text (not JSON) works too, and the bridge is still serving.
    since = probe.mark()
    probe.publish(
        f"{BASE}/say/t", '<speak>Still <say-as interpret-as="digits">42</say-as>.</speak>'
    )
    last = probe.wait_for(lambda m: m.topic == RESPONSE, WAIT_S, since=since).json()
    assert last["status"] == "ok", last
