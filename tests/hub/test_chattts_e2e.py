"""ChatTTS in one command, end to end against the loopback hub: ``models download chattts``
fetches the tiny generated checkpoint laid out as the real asset repository, verifies it against
a sha256 map of it (standing in for ChatTTS's own), records it, exports it to ONNX, quantizes
the GPT to INT8 and makes the default voice -- then the bridge speaks that voice over MQTT,
on the export's FP32 graphs with the INT8 graphs as its fast tier.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chattts_tiny import NEEDS_CHATTTS_ONNX, make_tiny_checkpoint
from tests.support.harness import BridgeFactory, ProbeFactory, ReceivedMessage
from tests.support.hfhub import FakeHub
from tts_bridge.cli.main import main
from tts_bridge.engines.manifests import user_manifests
from tts_bridge.hub import chattts

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
WAIT_S = 120.0

pytestmark = [pytest.mark.slow, NEEDS_CHATTTS_ONNX]


def test_download_export_quantize_and_speak(
    tmp_path: Path,
    *,
    hub: FakeHub,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bridge_factory: BridgeFactory,
    probe_factory: ProbeFactory,
) -> None:
    tiny = make_tiny_checkpoint(tmp_path / "upstream", seed=1)
    files = {p.relative_to(tiny).as_posix(): p.read_bytes() for p in tiny.rglob("*") if p.is_file()}
    hub.add(chattts.REPO, chattts.REVISION, files)
    map_path = tmp_path / "sha256_map.json"
    digests = {chattts.map_key(rel): hashlib.sha256(d).hexdigest() for rel, d in files.items()}
    map_path.write_text(json.dumps(digests), encoding="utf-8")
    # The tiny checkpoint's map where ChatTTS's own would be read.
    monkeypatch.setattr(chattts, "installed_sha256_map", lambda: map_path)

    models = tmp_path / "models"
    config: dict[str, Any] = {
        "models": {"dir": str(models)},
        "voices_file": str(tmp_path / "voices.yaml"),
        "synthesis": {"onnx_threads": 1},
    }
    path = tmp_path / "download.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["models", "download", "chattts", "--yes", "--config", str(path)]) == 0
    out = capsys.readouterr()
    assert "verifying 10 files" in out.out and "ready: voice 'xiaoyu'" in out.out, out

    recorded = user_manifests(models)
    assert recorded["chattts"].expected_hashes() == {
        rel: hashlib.sha256(d).hexdigest() for rel, d in files.items()
    }
    export = {f.path for f in recorded["chattts-onnx"].files}
    assert any(p.endswith(".int8.onnx") for p in export), export
    assert not (models / ".downloads").exists(), "staging is gone once everything is in place"
    voices = yaml.safe_load((tmp_path / "voices.yaml").read_text(encoding="utf-8"))["voices"]
    assert voices["xiaoyu"]["model"] == "chattts" and voices["xiaoyu"]["fast_voice"] == "auto"

    bridge = bridge_factory(
        voices_file=config["voices_file"],
        synthesis=config["synthesis"],
        default_voice="xiaoyu",
        scheduler={"idle_enabled": False},
    )
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    info = probe.wait_for(lambda m: m.topic == f"{BASE}/bridge/info", WAIT_S).json()
    assert info["voices"]["xiaoyu"]["fast_voice"] == "xiaoyu_int8", info["voices"]
    for tier, wanted in (("quality", "xiaoyu"), ("fast", "xiaoyu_int8")):
        since = probe.mark()
        request = {"text": "客厅温度21度。", "id": tier, "tier": tier}
        probe.publish(f"{BASE}/say/living", json.dumps(request))
        answer = probe.wait_for(_answer_to(tier), WAIT_S, since=since).json()
        assert answer["status"] == "ok", answer
        assert (answer["data"]["engine"], answer["data"]["voice"]) == ("chattts-onnx", wanted)
        audio = probe.wait_for(lambda m: m.topic == f"{BASE}/audio/living", WAIT_S, since=since)
        assert audio.payload[:4] == b"RIFF" and len(audio.payload) > 1000


def _answer_to(request_id: str) -> Callable[[ReceivedMessage], bool]:
    return lambda m: m.topic == RESPONSE and m.json()["id"] == request_id
