"""/metrics: the real service in process (HTTP server on a free loopback port, fake MQTT), scraped
and parsed with prometheus_client's own parser, counters moving after requests; the ChatTTS ONNX
stages on the tiny export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fake import BASE, Services
from tests.support.web import raw_request
from tts_bridge import app
from tts_bridge.engines.base import SynthesisOptions, timing_stages
from tts_bridge.speech.metrics import Metrics, State
from tts_bridge.web.server import AudioServer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def port_of(service: app.Service) -> int:
    return next(s for s in service.servers if isinstance(s, AudioServer)).port


def scrape(service: app.Service) -> Samples:
    status, headers, body = raw_request(port_of(service), "GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def speak(service: app.Service, body: dict[str, object]) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port_of(service), timeout=60)
    try:
        conn.request("POST", "/api/speak", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_counters_move_after_requests(services: Services) -> None:
    service, conn = services()
    before = scrape(service)
    text = "The metrics sentence is spoken once."
    assert speak(service, {"text": text, "voice": "joe", "tier": "quality"}) == 200
    assert speak(service, {"text": text, "voice": "joe", "tier": "quality"}) == 200
    assert speak(service, {"text": "Hello.", "voice": "bob"}) == 400
    since = conn.mark()
    conn.deliver(f"{BASE}/say/kitchen", json.dumps({"text": text, "id": "m1", "voice": "joe"}))
    conn.wait_for(lambda m: m.topic.endswith("/response/say"), since=since, what="the answer")
    after = scrape(service)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("tts_bridge_requests_total", door="http", status="ok", tier="quality") == 2
    assert moved("tts_bridge_requests_total", door="http", status="unknown_voice", tier="none") == 1
    assert moved("tts_bridge_requests_total", door="mqtt", status="ok", tier="quality") == 1
    assert moved("tts_bridge_cache_lookups_total", result="miss") >= 1
    assert moved("tts_bridge_cache_lookups_total", result="hit") >= 2
    for stage in ("total", "synthesis"):
        assert moved("tts_bridge_synthesis_seconds_count", voice="joe", stage=stage) >= 1
    assert moved("tts_bridge_synthesis_steps_total", voice="joe", stage="synthesis") >= 1
    assert moved("tts_bridge_real_time_factor_count", voice="joe") >= 1
    # Each request's stages, by door: the new sentence went through the engine, the repeat not.
    for stage in ("queue", "cache_read", "first_audio", "first_byte", "encode"):
        assert moved("tts_bridge_request_stage_seconds_count", door="http", stage=stage) == 2
    for stage in ("front", "engine", "loudness", "cache_write"):
        assert moved("tts_bridge_request_stage_seconds_count", door="http", stage=stage) == 1
    for stage in ("queue", "first_byte"):
        assert moved("tts_bridge_request_stage_seconds_count", door="mqtt", stage=stage) == 1
    assert moved("tts_bridge_request_stage_seconds_count", door="mqtt", stage="engine") == 0
    assert value(after, "tts_bridge_resident_memory_bytes") > 0
    assert value(after, "tts_bridge_broker_connected") == 1
    for lane in ("quality", "fast", "idle"):
        assert ("tts_bridge_queue_depth", (("lane", lane),)) in after
    assert value(after, "tts_bridge_cache_entries") >= 1
    # No request text in any label.
    labels = {v for _, pairs in after for _, v in pairs}
    assert not any("metrics sentence" in label for label in labels)


def test_metrics_can_be_turned_off(services: Services) -> None:
    service, _ = services(http={"metrics": False})
    status, _, _ = raw_request(port_of(service), "GET", "/metrics")
    assert status == 404


def test_each_service_has_its_own_registry() -> None:
    one, two = Metrics(), Metrics()
    one.request("http", "ok", "fast")
    one.model_loaded("piper:joe", 1.5)
    one.watch(lambda: State(queue_depth={"live": 3}, broker_connected=False))
    text = one.exposition().decode()
    assert 'tts_bridge_requests_total{door="http",status="ok",tier="fast"} 1.0' in text
    assert 'tts_bridge_queue_depth{lane="live"} 3.0' in text
    assert "tts_bridge_broker_connected 0.0" in text
    assert "tts_bridge_model_load_seconds_count" in text
    assert "tts_bridge_requests_total{" not in two.exposition().decode()


def test_a_request_s_stages_are_kept_and_its_first_byte_added_later() -> None:
    metrics = Metrics()
    seconds = {"queue": 0.001, "engine": 0.05, "prefill": 0.01}
    metrics.request_stages("wyoming", seconds)
    metrics.first_byte("wyoming", seconds, 0.06)  # the door writes after the work is counted
    assert metrics.recent_stages() == [
        ("wyoming", {"queue": 0.001, "engine": 0.05, "first_byte": 0.06})  # no engine stage
    ]
    text = metrics.exposition().decode()
    for stage in ("queue", "engine", "first_byte"):
        count = f'tts_bridge_request_stage_seconds_count{{door="wyoming",stage="{stage}"}} 1.0'
        assert count in text
    assert 'stage="prefill"' not in text


def test_a_failing_state_reader_leaves_the_other_metrics(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    metrics.request("wyoming", "ok", "quality")

    def broken() -> State:
        raise RuntimeError("no state")

    metrics.watch(broken)
    text = metrics.exposition().decode()
    assert 'door="wyoming"' in text
    assert "reading the service's state" in caplog.text.lower()


@pytest.mark.slow
def test_chattts_onnx_records_its_stages(tiny_export_fp32: Path) -> None:
    from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine

    engine = ChatTTSOnnxEngine(tiny_export_fp32, precision="fp32", threads=1)
    engine.load()
    try:
        with timing_stages() as stages:
            for _ in engine.synthesize("hello there", None, SynthesisOptions()):
                pass
    finally:
        engine.unload()
    assert {"prefill", "codes", "decoder", "vocoder"} <= set(stages.seconds)
    assert all(seconds > 0 for seconds in stages.seconds.values())
    assert stages.steps["prefill"] == 1
    assert stages.steps["codes"] >= 1

    # Streamed: the decoder and Vocos run piece by piece, and are timed the same way.
    engine.load()
    try:
        with timing_stages() as streamed:
            for _ in engine.synthesize_stream("hello there", None, SynthesisOptions()):
                pass
    finally:
        engine.unload()
    assert {"prefill", "codes", "decoder", "vocoder"} <= set(streamed.seconds)


def test_stages_outside_a_timed_sentence_are_dropped() -> None:
    from tts_bridge.engines.base import record_stage

    record_stage("prefill", 1.0)  # no sentence timed on this thread: nothing to add it to
    with timing_stages() as stages:
        record_stage("codes", 0.5)
        record_stage("codes", 0.25)
    assert stages.seconds == {"codes": 0.75}
    assert stages.steps == {"codes": 2}
