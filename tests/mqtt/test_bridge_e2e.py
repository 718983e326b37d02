"""End-to-end: the real bridge subprocess, the real voices and a private mosquitto on loopback.

Black-box tests of what only a real broker shows: MQTT 5 properties on the wire, retained state
and info, the Last Will, a restart, a refused payload costing neither connection nor process.
Nothing here imports the bridge's internals; the request logic is tested in process
(test_say.py, test_frontends.py). Voices: ``joe`` (Piper, 22.05 kHz, the default)
and ``heart`` (hibari, 24 kHz).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from tests.support.answers import Wav, assert_error, assert_ok, parse_wav
from tests.support.harness import (
    BridgeFactory,
    MqttProbe,
    ProbeFactory,
    ReceivedMessage,
    RunningBridge,
    request_properties,
)

pytestmark = pytest.mark.slow

BASE = "tts_bridge"
SAY = f"{BASE}/say"
RESPONSE = f"{BASE}/bridge/response/say"
STATE = f"{BASE}/bridge/state"
INFO = f"{BASE}/bridge/info"
REPLY = "e2e/reply"
# The first request of a bridge may load a voice model; later ones take well under a second.
WAIT_S = 60.0
JOE_RATE = 22050
HEART_RATE = 24000


# -- helpers -----------------------------------------------------------------------------------


def audio_topic(target: str) -> str:
    return f"{BASE}/audio/{target}"


def wait_response(
    probe: MqttProbe, since: int, *, request_id: Any = None, status: str | None = None
) -> dict[str, Any]:
    """The first bridge/response/say from ``since`` on (with this id / status, if given)."""

    def matches(m: ReceivedMessage) -> bool:
        if m.topic != RESPONSE:
            return False
        body = m.json()
        return (request_id is None or body["id"] == request_id) and (
            status is None or body["status"] == status
        )

    what = f"a {status or ''} response on {RESPONSE} (id={request_id!r})"
    body: dict[str, Any] = probe.wait_for(matches, WAIT_S, since=since, what=what).json()
    return body


def wait_audio(
    probe: MqttProbe, target: str, since: int, *, request_id: Any = None
) -> ReceivedMessage:
    topic = audio_topic(target)

    def matches(m: ReceivedMessage) -> bool:
        return m.topic == topic and (
            request_id is None or m.user_properties.get("id") == str(request_id)
        )

    return probe.wait_for(matches, WAIT_S, since=since, what=f"audio on {topic}")


def assert_audio_message(
    audio: ReceivedMessage, *, request_id: Any, sample_rate: int, cached: bool | None = None
) -> Wav:
    """The audio message carries one plausible mono WAV and the contract's MQTT 5 properties."""
    assert audio.qos == 1, f"audio must be QoS 1, came as QoS {audio.qos}"
    expiry = audio.message_expiry_interval
    assert expiry is not None and expiry > 0, f"no message expiry on the audio: {expiry}"
    props = audio.user_properties
    assert props.get("id") == str(request_id), props
    assert props.get("tier") in ("quality", "fast"), props
    assert props.get("cached") in ("true", "false"), props
    if cached is not None:
        assert props["cached"] == ("true" if cached else "false"), props
    wav = parse_wav(audio.payload)
    assert wav.channels == 1, f"expected mono, got {wav.channels} channels"
    assert wav.sample_rate == sample_rate
    assert float(np.max(np.abs(wav.samples))) > 0.01, "the audio is silent"
    return wav


def say(probe: MqttProbe, payload: bytes | str, target: str | None = "kitchen", **kw: Any) -> int:
    """Publish a request; returns the mark to search responses from."""
    since = probe.mark()
    topic = SAY if target is None else f"{SAY}/{target}"
    probe.publish(topic, payload, **kw)
    return since


def say_json(
    probe: MqttProbe, request: dict[str, Any], target: str | None = "kitchen", **kw: Any
) -> int:
    return say(probe, json.dumps(request), target, **kw)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def bridge(bridge_factory: BridgeFactory) -> RunningBridge:
    return bridge_factory()


@pytest.fixture
def probe(probe_factory: ProbeFactory, bridge: RunningBridge) -> MqttProbe:
    """Subscribed to everything under the base topic and to the test's reply topics."""
    probe = probe_factory(f"{BASE}/#", f"{REPLY}/#")
    probe.diagnostics = bridge.log_tail
    return probe


# -- the happy paths ---------------------------------------------------------------------------


def test_plain_text_to_target(probe: MqttProbe, probe_factory: ProbeFactory) -> None:
    since = say(probe, "Dinner is ready", "kitchen")
    response = wait_response(probe, since)
    audio = wait_audio(probe, "kitchen", since)

    assert_ok(response, target="kitchen", voice="joe", engine="piper", audio=audio)
    assert response["data"]["cached"] is False, "a fresh cache cannot have this sentence"
    assert isinstance(response["id"], str) and response["id"], response
    wav = assert_audio_message(audio, request_id=response["id"], sample_rate=JOE_RATE, cached=False)
    assert 0.5 <= wav.duration_s <= 6.0, f"'Dinner is ready' lasted {wav.duration_s:.2f} s"

    # Not retained: a subscriber that comes later gets nothing on the audio topic.
    late = probe_factory(audio_topic("kitchen"))
    with pytest.raises(AssertionError):
        late.wait_for(lambda m: True, timeout=1.0, what="(nothing: audio is not retained)")


def test_response_topic_gets_wav_with_correlation_data(probe: MqttProbe) -> None:
    reply_topic = f"{REPLY}/wav"
    correlation = b"\x00corr-\xff-1"
    since = say(
        probe,
        "Someone is at the door",
        "porch",
        properties=request_properties(response_topic=reply_topic, correlation_data=correlation),
    )
    reply = probe.wait_for(
        lambda m: m.topic == reply_topic, WAIT_S, since=since, what=f"a reply on {reply_topic}"
    )
    assert reply.content_type == "audio/wav", reply.content_type
    assert reply.correlation_data == correlation, reply.correlation_data
    wav = parse_wav(reply.payload)
    assert wav.channels == 1 and wav.sample_rate == JOE_RATE
    assert 0.5 <= wav.duration_s <= 6.0, f"lasted {wav.duration_s:.2f} s"


def test_cache_survives_bridge_restart(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory()
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    since = say_json(probe, {"text": "The front door is open", "id": "before"})
    before = wait_response(probe, since, request_id="before")
    before_audio = wait_audio(probe, "kitchen", since, request_id="before")
    assert before["status"] == "ok" and before["data"]["cached"] is False, before
    bridge.stop()

    again = bridge_factory()  # the same cache dir (tmp_path/cache)
    assert again.config["cache"]["dir"] == bridge.config["cache"]["dir"]
    probe.diagnostics = again.log_tail
    since = say_json(probe, {"text": "The front door is open", "id": "after"})
    after = wait_response(probe, since, request_id="after")
    after_audio = wait_audio(probe, "kitchen", since, request_id="after")
    assert_ok(after, target="kitchen", voice="joe", engine="piper", audio=after_audio)
    assert after["data"]["cached"] is True, after
    assert_audio_message(after_audio, request_id="after", sample_rate=JOE_RATE, cached=True)
    assert after_audio.payload == before_audio.payload, "audio changed across the restart"


# -- bridge state, info, Last Will ---------------------------------------------------------------


def test_retained_state_and_info(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge_factory(limits={"max_text_chars": 321, "max_payload_bytes": 4096})
    probe = probe_factory(STATE, INFO)
    state = probe.wait_for(lambda m: m.topic == STATE, 10, what="retained state")
    assert state.retain, "bridge/state must be retained"
    assert state.json() == {"state": "online"}

    info_message = probe.wait_for(lambda m: m.topic == INFO, 10, what="retained info")
    assert info_message.retain, "bridge/info must be retained"
    info = info_message.json()
    assert isinstance(info["version"], str) and info["version"], info
    voices = info["voices"]
    assert isinstance(voices, dict), info
    assert {"joe", "heart"} <= set(voices), voices
    assert all(isinstance(v, dict) for v in voices.values()), voices
    assert info["default_voice"] == "joe", info
    # The contract leaves the shape of "engines" open (names, identities or a mapping): only
    # require that both engines of the default voices are named in it.
    engines = info["engines"]
    assert engines, info
    assert any("piper" in str(e) for e in engines), engines
    assert any("hibari" in str(e) for e in engines), engines
    limits = info["limits"]
    assert isinstance(limits, dict), info
    assert limits.get("max_text_chars") == 321, limits
    assert limits.get("max_payload_bytes") == 4096, limits


def test_last_will_after_sigkill(
    bridge: RunningBridge, probe: MqttProbe, probe_factory: ProbeFactory
) -> None:
    since = probe.mark()
    bridge.kill()
    offline = probe.wait_for(
        lambda m: m.topic == STATE and m.json() == {"state": "offline"},
        30,
        since=since,
        what="the Last Will on bridge/state",
    )
    assert offline.json() == {"state": "offline"}

    later = probe_factory(STATE)
    state = later.wait_for(lambda m: m.topic == STATE, 10, what="retained state")
    assert state.retain, "the Last Will must be retained"
    assert state.json() == {"state": "offline"}


# -- bad input: a clear error, then the bridge keeps serving ------------------------------------


@dataclass(frozen=True)
class BadInput:
    payload: bytes
    code: str
    config: dict[str, Any] | None = None
    request_id: Any = None
    """The id the error response must echo (None: any non-empty id, generated if need be)."""


# Every error code is covered in process (tests/mqtt/test_say.py); these go through the
# real process and broker: a refused payload does not cost the connection or the process.
BAD_INPUTS: dict[str, BadInput] = {
    "invalid-utf8": BadInput(b"\xff\xfe\xfa", "invalid_utf8"),
    "unknown-voice": BadInput(
        b'{"text": "hello", "voice": "nobody", "id": "uv-1"}', "unknown_voice", request_id="uv-1"
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_bad_input_gets_error_and_bridge_keeps_serving(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory, case: BadInput
) -> None:
    bridge = bridge_factory(**(case.config or {}))
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail

    since = say(probe, case.payload, "errors")
    error = wait_response(probe, since, request_id=case.request_id)
    assert_error(error, case.code)
    if case.request_id is None and case.code in (
        "invalid_utf8",
        "invalid_json",
        "json_too_deep",
        "payload_too_large",
    ):
        assert isinstance(error["id"], str), f"expected a generated string id: {error}"

    # Still serving: a good request right after is answered with audio.
    good_since = say_json(probe, {"text": "Still here", "id": "good-1"}, "errors")
    good = wait_response(probe, good_since, request_id="good-1")
    audio = wait_audio(probe, "errors", good_since, request_id="good-1")
    assert_ok(good, target="errors", voice="joe", engine="piper", audio=audio)
    assert bridge.running

    # The bad request produced no audio at all.
    stray = [
        m
        for m in probe.messages[since:]
        if m.topic.startswith(f"{BASE}/audio/") and m.user_properties.get("id") != "good-1"
    ]
    assert not stray, f"audio was published for a rejected request: {[str(m) for m in stray]}"
