"""Idle pre-rendering in batches: ChatTTS ONNX renders several waiting sentences in one call.

Real models only: a tiny random ChatTTS checkpoint (tests/support/chattts_tiny.py) exported to ONNX
by
the project's exporter, served by the real bridge over a private mosquitto. Which path rendered
a sentence is read from the bridge's own log: the engine logs every code loop with its texts
joined by " | ", and the idle worker logs each batch. The tiny model's random weights never
pick the end code, so every generation runs to its token budget: audio longer than one
generation's cap (30 s) can only come from several generations, i.e. the one-at-a-time path.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

from tests.support.chattts_tiny import NEEDS_CHATTTS_ONNX, TinyModels
from tests.support.harness import (
    BridgeFactory,
    MqttProbe,
    ProbeFactory,
    ReceivedMessage,
    RunningBridge,
    bridge_api,
)
from tts_bridge.config import load_settings
from tts_bridge.engines.chattts.common import MAX_GENERATION_SECONDS, expected_seconds
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.idle import BATCH_MAX_AUDIO_S
from tts_bridge.speech.synthesis import Synthesizer

BASE = "tts_bridge"
WAIT_S = 120.0
VOICE = "xiao"
SHORT = ["Door open.", "Lights on.", "Rain soon.", "Tea time."]
# One sentence of about 28 s expected speech: more than one generation (25 s) holds.
LONG = (
    "The weather service says that heavy rain and strong wind will reach the valley late "
    "this evening so please close the windows bring the garden chairs inside check that the "
    "cellar door is shut and keep the car in the garage until the storm has passed tomorrow "
    "morning when the roads will be cleared and the buses will run again on their usual "
    "timetable for everyone who needs to travel."
)
# The engine's debug line for each code loop it runs (batched, or one text streaming).
ENGINE_LOOP = re.compile(
    r"tts_bridge\.engines\.chattts\.onnx_engine: ChatTTS ONNX(?:, [\w ]+)?: (.*) \(max \d+ tokens"
)
IDLE_BATCH = re.compile(r"Idle: (\w+) batch of (\d+) in (\w+)")

pytestmark = [pytest.mark.slow, NEEDS_CHATTTS_ONNX]


@pytest.fixture(scope="module")
def export(tiny_export_fp32: Path) -> Path:
    """The tiny checkpoint exported (FP32; the export's own manifest vouches for its files)."""
    return tiny_export_fp32


@pytest.fixture(scope="module")
def slower_export(tiny_models: TinyModels, tiny_checkpoint: Path) -> Path:
    """A larger random model (hidden 512 x 8 layers) whose batches take a while."""
    return tiny_models.export(2, hidden_size=512, num_layers=8, quantize=False)


def _voice(export: Path) -> dict[str, Any]:
    return {"engine": "chattts-onnx", "model": str(export), "precision": "fp32"}


def _start(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory, export: Path, batch_size: int
) -> tuple[RunningBridge, MqttProbe]:
    """A bridge serving `export` as VOICE, idle batches of `batch_size`; a probe on every topic."""
    bridge = bridge_factory(
        voices={VOICE: _voice(export)},
        default_voice=VOICE,
        synthesis={"onnx_threads": 1, "workers": 1},
        scheduler={
            "idle_delay_s": 0.2,
            "idle_max_load": 1000.0,
            "idle_batch_size": batch_size,
        },
    )
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    return bridge, probe


def _api(probe: MqttProbe, name: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    return bridge_api(probe, name, payload, timeout=WAIT_S, base=BASE)


def _say(probe: MqttProbe, payload: dict[str, Any]) -> dict[str, Any]:
    since = probe.mark()
    probe.publish(f"{BASE}/say/batch", json.dumps(payload))

    def is_answer(m: ReceivedMessage) -> bool:
        return m.topic == f"{BASE}/bridge/response/say" and m.json()["id"] == payload["id"]

    body: dict[str, Any] = probe.wait_for(is_answer, WAIT_S, since=since).json()
    return body


def _prerender_all(probe: MqttProbe, phrases: list[str]) -> dict[str, Any]:
    """Queue `phrases` (one sentence each) and wait until the idle thread has rendered them."""
    queued = _api(probe, "prerender", {"phrases": phrases, "voice": VOICE})
    assert queued["status"] == "ok", queued
    assert queued["data"]["queued_sentences"] == len(phrases), queued
    deadline = time.monotonic() + WAIT_S
    while True:
        health: dict[str, Any] = _api(probe, "health_check")["data"]
        done = health["background_done"]["prerender"] == len(phrases)
        if done and health["background_pending"] == 0:
            return health
        assert time.monotonic() < deadline, f"idle work not done in {WAIT_S} s: {health}"
        time.sleep(0.3)


def _assert_all_cached(probe: MqttProbe, phrases: list[str], others: int = 0) -> None:
    """Every phrase is answered from the cache, which holds them and `others` entries."""
    for i, text in enumerate(phrases):
        answer = _say(probe, {"text": text, "id": f"check-{i}", "voice": VOICE})
        assert answer["status"] == "ok", answer
        assert answer["data"]["cached"] is True, (text, answer)
    stats = _api(probe, "cache/stats")["data"]
    assert stats["entries"] == len(phrases) + others, stats


def _engine_loops(bridge: RunningBridge) -> list[str]:
    """The engine's log line for each code loop it ran (the texts, joined by ' | ')."""
    log = bridge.log_path.read_text(encoding="utf-8", errors="replace")
    return [m[1] for m in ENGINE_LOOP.finditer(log)]


def _idle_batches(bridge: RunningBridge) -> list[tuple[str, int, str]]:
    log = bridge.log_path.read_text(encoding="utf-8", errors="replace")
    return [(m[1], int(m[2]), m[3]) for m in IDLE_BATCH.finditer(log)]


def test_prerender_over_mqtt_renders_in_one_batch_and_caches_every_sentence(
    export: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    assert sum(expected_seconds(t) for t in SHORT) <= BATCH_MAX_AUDIO_S  # one batch holds all
    bridge, probe = _start(bridge_factory, probe_factory, export, batch_size=4)
    health = _prerender_all(probe, SHORT)
    assert health["background_done"]["prerender"] == 4, health
    assert _idle_batches(bridge) == [("prerender", 4, VOICE)], bridge.log_tail()
    loops = _engine_loops(bridge)
    assert len(loops) == 1, loops  # one code loop for all four
    assert all(text in loops[0] for text in SHORT), loops
    _assert_all_cached(probe, SHORT)


def test_too_long_sentence_is_rendered_alone_and_all_are_cached(
    export: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    assert expected_seconds(LONG) > 25.0  # more than one generation
    bridge, probe = _start(bridge_factory, probe_factory, export, batch_size=4)
    phrases = [SHORT[0], LONG, *SHORT[1:3]]
    health = _prerender_all(probe, phrases)
    assert health["background_done"]["prerender"] == 4, health
    # The three short ones together; the long one on its own, in more than one generation.
    assert _idle_batches(bridge) == [("prerender", 3, VOICE)], bridge.log_tail()
    loops = _engine_loops(bridge)
    batched = [loop for loop in loops if " | " in loop]
    assert len(batched) == 1 and all(text in batched[0] for text in phrases[::2]), loops
    assert len(loops) >= 3, loops  # the batch, then at least two generations of LONG
    _assert_all_cached(probe, phrases)


def test_batch_size_one_renders_one_sentence_at_a_time(
    export: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge, probe = _start(bridge_factory, probe_factory, export, batch_size=1)
    health = _prerender_all(probe, SHORT)
    assert health["background_done"]["prerender"] == 4, health
    assert _idle_batches(bridge) == [], bridge.log_tail()
    loops = _engine_loops(bridge)
    assert len(loops) == 4 and not any(" | " in loop for loop in loops), loops
    _assert_all_cached(probe, SHORT)


def test_live_request_during_a_batch_is_answered(
    slower_export: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge, probe = _start(bridge_factory, probe_factory, slower_export, batch_size=4)
    queued = _api(probe, "prerender", {"phrases": SHORT, "voice": VOICE})
    assert queued["status"] == "ok", queued
    # As soon as the engine starts the batch's code loop, a live request arrives.
    deadline = time.monotonic() + WAIT_S
    while not _engine_loops(bridge):
        assert time.monotonic() < deadline, bridge.log_tail()
        time.sleep(0.02)
    answer = _say(probe, {"text": "Someone is at the door.", "id": "live", "voice": VOICE})
    assert answer["status"] == "ok", answer
    assert answer["data"]["cached"] is False, answer
    deadline = time.monotonic() + 10  # the bridge logs "done" just after it answers
    while "Request live done" not in (log := bridge.log_path.read_text(encoding="utf-8")):
        assert time.monotonic() < deadline, bridge.log_tail()
        time.sleep(0.05)
    first_loop = ENGINE_LOOP.search(log)
    assert first_loop is not None and " | " in first_loop[1], log
    started = first_loop.start()
    received = log.index("Request live for batch")
    gave_way = log.index("Idle: gave way to live work")
    answered = log.index("Request live done")
    # It arrived while the batch ran; the batch stopped within a step instead of holding the
    # only synthesis slot to its end, and the live request was answered.
    assert started < received < gave_way < answered, bridge.log_tail()
    assert "Idle: prerender batch of 4" not in log[:answered], bridge.log_tail()
    print(f"live request during a batch: answered in {answer['data']['latency_ms']:.0f} ms")
    # The interrupted batch stayed queued and is rendered whole at the next idle moment.
    deadline = time.monotonic() + WAIT_S
    while True:
        health = _api(probe, "health_check")["data"]
        if health["background_done"]["prerender"] == len(SHORT):
            break
        assert time.monotonic() < deadline, (health, bridge.log_tail())
        time.sleep(0.3)
    assert health["background_interrupted"] >= 1, health
    _assert_all_cached(probe, SHORT, others=1)  # and the live request's sentence


# -- Synthesizer.sentences_batch on its own -------------------------------------------------------


def _synthesizer(tmp_path: Path, export: Path) -> Synthesizer:
    settings = load_settings(
        None,
        {
            "cache": {"dir": str(tmp_path / "cache")},
            "models": {"dir": str(tmp_path / "models")},
            "synthesis": {"onnx_threads": 1},
            "voices": {VOICE: _voice(export), "heart": {"engine": "hibari"}},
            "default_voice": VOICE,
        },
        environ={},
    )
    return Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))


def test_sentences_batch_renders_a_too_long_text_alone(tmp_path: Path, export: Path) -> None:
    synth = _synthesizer(tmp_path, export)
    voice = synth.engines.voice(VOICE)
    options = synth.options_for(voice)
    texts = [SHORT[0], LONG, SHORT[1]]
    pieces = synth.sentences_batch(voice, texts, options)
    assert [(p.index, p.text, p.cached) for p in pieces] == [
        (i, t, False) for i, t in enumerate(texts)
    ]
    seconds = [p.pcm.size / voice.engine.sample_rate for p in pieces]
    # Each generation runs to its budget here: LONG took several, the short ones one each.
    assert seconds[1] > MAX_GENERATION_SECONDS, seconds
    assert 0 < seconds[0] <= MAX_GENERATION_SECONDS and 0 < seconds[2] <= MAX_GENERATION_SECONDS
    assert all(synth.is_cached(voice, text, options) for text in texts)
    again = synth.sentences_batch(voice, texts, options)
    assert all(p.cached for p in again)
    assert [p.pcm.tolist() for p in again] == [p.pcm.tolist() for p in pieces]
    assert list(synth.stats.rtf()) == [voice.engine.identity]


def test_sentences_batch_without_engine_batching_goes_one_at_a_time(
    tmp_path: Path, export: Path
) -> None:
    synth = _synthesizer(tmp_path, export)
    heart = synth.engines.voice("heart")
    assert not hasattr(heart.engine, "synthesize_batch")
    options = synth.options_for(heart)
    pieces = synth.sentences_batch(heart, SHORT[:2], options)
    assert all(p.pcm.size > 0 and not p.cached for p in pieces)
    assert all(synth.is_cached(heart, text, options) for text in SHORT[:2])
