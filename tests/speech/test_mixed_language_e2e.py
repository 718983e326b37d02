"""A mixed English/Chinese announcement over MQTT on a default install: the English voice speaks
the English sentence (a Chinese name in it in pinyin), a Chinese sentence goes to the Chinese
voice every install has (xiaobei, Kokoro on the real INT8 model)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import soundfile

from tests.support.harness import BridgeFactory, MqttProbe, ProbeFactory

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
WAIT_S = 180.0
JOE_RATE = 22050
KOKORO_RATE = 24000

pytestmark = [pytest.mark.slow]


def _ask(probe: MqttProbe, payload: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    since = probe.mark()
    probe.publish(f"{BASE}/say/hall", json.dumps(payload))
    answer = probe.wait_for(
        lambda m: m.topic == RESPONSE and m.json()["id"] == payload["id"], WAIT_S, since=since
    )
    body: dict[str, Any] = answer.json()
    if body["status"] != "ok":
        return body, b""
    wav = probe.wait_for(
        lambda m: m.topic == f"{BASE}/audio/hall" and m.user_properties.get("id") == payload["id"],
        WAIT_S,
        since=since,
    )
    return body, wav.payload


def test_mixed_announcement_is_spoken(
    bridge_factory: BridgeFactory,
    probe_factory: ProbeFactory,
) -> None:
    bridge = bridge_factory(
        synthesis={"onnx_threads": 1},
        default_voice="joe",
        scheduler={"idle_enabled": False, "latency_budget_ms": 60000},
    )
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail

    # An English sentence with a Chinese name: English, spoken by joe (once refused whole).
    named, wav = _ask(probe, {"text": "Call from 王小明 at 7:30 pm.", "id": "name"})
    assert named["status"] == "ok", named
    assert (named["data"]["voice"], named["data"]["engine"]) == ("joe", "piper"), named
    assert "sentence_voices" not in named["data"], named
    audio, rate = soundfile.read(io.BytesIO(wav))
    assert rate == JOE_RATE and len(audio) / rate > 1.0
    assert "Wang Xiaoming at seven thirty p m" in bridge.log_tail(400)  # what joe was given

    # A Chinese sentence in an English announcement: the Chinese voice speaks it.
    mixed, wav = _ask(
        probe,
        {"text": "The washing machine has finished. 洗衣机洗好了，请晾衣服。", "id": "mixed"},
    )
    assert mixed["status"] == "ok", mixed
    assert mixed["data"]["voice"] == "joe", mixed
    assert mixed["data"]["sentence_voices"] == ["joe", "xiaobei"], mixed
    assert mixed["data"]["sentences"] == 2, mixed
    audio, rate = soundfile.read(io.BytesIO(wav))
    assert rate == JOE_RATE, "one WAV at the requesting voice's rate"
    assert len(audio) / rate > 1.0

    # A Chinese announcement to a bridge whose default voice is English: xiaobei speaks it.
    chinese, wav = _ask(probe, {"text": "明天早上7:30提醒我开会。", "id": "zh"})
    assert chinese["status"] == "ok", chinese
    assert chinese["data"]["sentence_voices"] == ["xiaobei"], chinese
    audio, rate = soundfile.read(io.BytesIO(wav))
    assert len(audio) / rate > 1.0

    # Asked for by name, at its own rate.
    named_zh, wav = _ask(probe, {"text": "不是一个人。", "voice": "xiaobei", "id": "xb"})
    assert named_zh["status"] == "ok", named_zh
    assert (named_zh["data"]["voice"], named_zh["data"]["engine"]) == ("xiaobei", "kokoro")
    audio, rate = soundfile.read(io.BytesIO(wav))
    assert rate == KOKORO_RATE and len(audio) / rate > 0.5
