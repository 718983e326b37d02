"""A mixed English/Chinese announcement over MQTT: the English voice speaks the English sentence
(a Chinese name in it in pinyin), a Chinese sentence goes to the voice that speaks Chinese (the
tiny random ChatTTS checkpoint exported to ONNX: its sound is noise, its routing and WAV are
real)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import soundfile
import yaml

from tests.support.chattts_tiny import NEEDS_CHATTTS_ONNX
from tests.support.harness import BridgeFactory, MqttProbe, ProbeFactory

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
WAIT_S = 180.0
JOE_RATE = 22050

pytestmark = [pytest.mark.slow, NEEDS_CHATTTS_ONNX]


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
    tmp_path: Path,
    tiny_export_fp32: Path,
    bridge_factory: BridgeFactory,
    probe_factory: ProbeFactory,
) -> None:
    # Any voice that speaks Chinese, added to the default ones as `voices new` adds it: ChatTTS
    # on onnxruntime loads and speaks in a fraction of the torch engine's time (both engines'
    # own tests are in tests/engines/chattts).
    chinese = {"engine": "chattts-onnx", "model": str(tiny_export_fp32), "precision": "fp32"}
    voices_file = tmp_path / "voices.yaml"
    voices_file.write_text(yaml.safe_dump({"voices": {"xiaoyu": chinese}}), encoding="utf-8")
    bridge = bridge_factory(
        voices_file=str(voices_file),
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
    assert mixed["data"]["sentence_voices"] == ["joe", "xiaoyu"], mixed
    assert mixed["data"]["sentences"] == 2, mixed
    audio, rate = soundfile.read(io.BytesIO(wav))
    assert rate == JOE_RATE, "one WAV at the requesting voice's rate"
    assert len(audio) / rate > 1.0
