"""Idle pre-rendering in batches: ChatTTS ONNX renders several waiting sentences in one call.

Real models only: a tiny random ChatTTS checkpoint (tests/support/chattts_tiny.py) exported to ONNX
by the project's exporter, served by the real service in process (on a fake MQTT connection, see
tests/support/fake.py). Which path rendered a sentence is read from the service's own log: the
engine logs every code loop with its texts joined by " | ", and the idle worker logs each batch.
The tiny model's random weights never pick the end code, so every generation runs to its token
budget: audio longer than one generation's cap (30 s) can only come from several generations,
i.e. the one-at-a-time path.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

from tests.support.chattts_tiny import NEEDS_CHATTTS_ONNX, TinyModels
from tests.support.fake import Services, body
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


class Running:
    """An in-process service serving the tiny export as VOICE, and its log lines."""

    def __init__(
        self, services: Services, caplog: pytest.LogCaptureFixture, export: Path, batch_size: int
    ) -> None:
        caplog.set_level(logging.DEBUG)
        self._caplog = caplog
        self.service, self.conn = services(
            voices={VOICE: _voice(export)},
            default_voice=VOICE,
            synthesis={"onnx_threads": 1, "workers": 1},
            scheduler={
                "idle_delay_s": 0.2,
                "idle_max_load": 1000.0,
                "idle_batch_size": batch_size,
            },
        )

    def log(self) -> str:
        """The log as the bridge process writes it: 'logger: message' lines."""
        return "\n".join(f"{r.name}: {r.getMessage()}" for r in list(self._caplog.records))

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def api(self, name: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        since = self.conn.mark()
        self.conn.deliver(f"{BASE}/bridge/request/{name}", json.dumps(payload or {}))
        answer = self.conn.wait_for(
            lambda m: m.topic == f"{BASE}/bridge/response/{name}", WAIT_S, since=since
        )
        found: dict[str, Any] = body(answer)
        return found

    def say(self, payload: dict[str, Any]) -> dict[str, Any]:
        since = self.conn.mark()
        self.conn.deliver(f"{BASE}/say/batch", json.dumps(payload))
        answer = self.conn.wait_for(
            lambda m: m.topic == f"{BASE}/bridge/response/say" and body(m)["id"] == payload["id"],
            WAIT_S,
            since=since,
        )
        found: dict[str, Any] = body(answer)
        return found

    def prerender_all(self, phrases: list[str]) -> dict[str, Any]:
        """Queue `phrases` (one sentence each) and wait until the idle thread rendered them."""
        queued = self.api("prerender", {"phrases": phrases, "voice": VOICE})
        assert queued["status"] == "ok", queued
        assert queued["data"]["queued_sentences"] == len(phrases), queued
        deadline = time.monotonic() + WAIT_S
        while True:
            health: dict[str, Any] = self.api("health_check")["data"]
            done = health["background_done"]["prerender"] == len(phrases)
            if done and health["background_pending"] == 0:
                return health
            assert time.monotonic() < deadline, f"idle work not done in {WAIT_S} s: {health}"
            time.sleep(0.1)

    def assert_all_cached(self, phrases: list[str], others: int = 0) -> None:
        """Every phrase is answered from the cache, which holds them and `others` entries."""
        for i, text in enumerate(phrases):
            answer = self.say({"text": text, "id": f"check-{i}", "voice": VOICE})
            assert answer["status"] == "ok", answer
            assert answer["data"]["cached"] is True, (text, answer)
        stats = self.api("cache/stats")["data"]
        assert stats["entries"] == len(phrases) + others, stats

    def engine_loops(self) -> list[str]:
        """The engine's log line for each code loop it ran (the texts, joined by ' | ')."""
        return [m[1] for m in ENGINE_LOOP.finditer(self.log())]

    def idle_batches(self) -> list[tuple[str, int, str]]:
        return [(m[1], int(m[2]), m[3]) for m in IDLE_BATCH.finditer(self.log())]


def test_prerender_over_mqtt_renders_in_one_batch_and_caches_every_sentence(
    export: Path, services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    assert sum(expected_seconds(t) for t in SHORT) <= BATCH_MAX_AUDIO_S  # one batch holds all
    bridge = Running(services, caplog, export, batch_size=4)
    health = bridge.prerender_all(SHORT)
    assert health["background_done"]["prerender"] == 4, health
    assert bridge.idle_batches() == [("prerender", 4, VOICE)], bridge.log_tail()
    loops = bridge.engine_loops()
    assert len(loops) == 1, loops  # one code loop for all four
    assert all(text in loops[0] for text in SHORT), loops
    bridge.assert_all_cached(SHORT)


def test_too_long_sentence_is_rendered_alone_and_all_are_cached(
    export: Path, services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    assert expected_seconds(LONG) > 25.0  # more than one generation
    bridge = Running(services, caplog, export, batch_size=4)
    phrases = [SHORT[0], LONG, *SHORT[1:3]]
    health = bridge.prerender_all(phrases)
    assert health["background_done"]["prerender"] == 4, health
    # The three short ones together; the long one on its own, in more than one generation.
    assert bridge.idle_batches() == [("prerender", 3, VOICE)], bridge.log_tail()
    loops = bridge.engine_loops()
    batched = [loop for loop in loops if " | " in loop]
    assert len(batched) == 1 and all(text in batched[0] for text in phrases[::2]), loops
    assert len(loops) >= 3, loops  # the batch, then at least two generations of LONG
    bridge.assert_all_cached(phrases)


def test_batch_size_one_renders_one_sentence_at_a_time(
    export: Path, services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = Running(services, caplog, export, batch_size=1)
    health = bridge.prerender_all(SHORT)
    assert health["background_done"]["prerender"] == 4, health
    assert bridge.idle_batches() == [], bridge.log_tail()
    loops = bridge.engine_loops()
    assert len(loops) == 4 and not any(" | " in loop for loop in loops), loops
    bridge.assert_all_cached(SHORT)


def test_live_request_during_a_batch_is_answered(
    slower_export: Path, services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = Running(services, caplog, slower_export, batch_size=4)
    queued = bridge.api("prerender", {"phrases": SHORT, "voice": VOICE})
    assert queued["status"] == "ok", queued
    # As soon as the engine starts the batch's code loop, a live request arrives.
    deadline = time.monotonic() + WAIT_S
    while not bridge.engine_loops():
        assert time.monotonic() < deadline, bridge.log_tail()
        time.sleep(0.02)
    answer = bridge.say({"text": "Someone is at the door.", "id": "live", "voice": VOICE})
    assert answer["status"] == "ok", answer
    assert answer["data"]["cached"] is False, answer
    deadline = time.monotonic() + 10  # the service logs "done" just after it answers
    while "Request live done" not in (log := bridge.log()):
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
        health = bridge.api("health_check")["data"]
        if health["background_done"]["prerender"] == len(SHORT):
            break
        assert time.monotonic() < deadline, (health, bridge.log_tail())
        time.sleep(0.3)
    assert health["background_interrupted"] >= 1, health
    bridge.assert_all_cached(SHORT, others=1)  # and the live request's sentence


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
