"""One request object from every door to the scheduler: `Pipeline.prepare` takes a
`SpeechRequest` whole, and what it says reaches the job (no model is loaded to route)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tts_bridge import app
from tts_bridge.config import load_settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.pipeline import SpeechError
from tts_bridge.speech.request import SpeechRequest
from tts_bridge.speech.synthesis import Synthesizer


def test_a_request_reaches_validation_routing_and_the_queue_whole(tmp_path: Path) -> None:
    settings = load_settings(None, {"cache": {"dir": str(tmp_path / "cache")}}, environ={})
    synth = Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))
    pipeline = app.build_pipeline(settings, synth)
    request = SpeechRequest(
        id="r1",
        text="The kettle has boiled.",
        voice="joe",
        language="en",
        options={"speed": 1.25},
        priority="high",
        door="http",
        peer="192.0.2.7",
        target="kitchen",
        tier="fast",
        use_cache=False,
        received=12.5,
    )
    job = pipeline.prepare(request)
    assert job.request is request
    assert (job.id, job.target, job.priority, job.door, job.peer) == (
        "r1",
        "kitchen",
        "high",
        "http",
        "192.0.2.7",
    )
    assert (job.use_cache, job.received) == (False, 12.5)
    assert job.plan.voice.name == "joe" and job.plan.options.speed == 1.25
    assert (job.route.tier, job.route.reason) == ("fast", "forced")
    assert job.route.voice.name == "heart"  # joe's fast voice
    # Validation alone, then routing: what a door that journals in between does.
    plan = pipeline.check(request)
    assert pipeline.route(request, plan).route.voice is job.route.voice
    # Each request gets its own id and arrival time unless its door gives them.
    first, second = SpeechRequest(text="Hi."), SpeechRequest(text="Hi.")
    assert first.id != second.id and first.received <= second.received
    with pytest.raises(SpeechError) as caught:
        pipeline.prepare(SpeechRequest(text="Hi.", voice="nobody"))
    assert caught.value.code == "unknown_voice"
    synth.cache.close()
