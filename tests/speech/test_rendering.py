"""Rendering (speech/rendering.py) through the real bundled voices (Piper joe, hibari heart)
and the sentence cache."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tests.support.harness import threads_started_niced
from tts_bridge.config import Settings, load_settings
from tts_bridge.engines import catalog
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.synthesis import Synthesizer


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("synth")
    return load_settings(
        None, {"cache": {"dir": str(tmp / "cache")}, "synthesis": {"onnx_threads": 1}}, environ={}
    )


@pytest.fixture(scope="module")
def synth(settings: Settings) -> Synthesizer:
    return Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))


def _read(wav: bytes) -> tuple[np.ndarray, int]:
    data, rate = soundfile.read(io.BytesIO(wav), dtype="int16")
    return data, rate


@pytest.mark.parametrize(("voice", "rate"), [("joe", 22050), ("heart", 24000)])
def test_voices_speak_and_cache(synth: Synthesizer, voice: str, rate: int) -> None:
    text = f"The washing machine has finished. Voice {voice} says hello."
    first = synth.render(text, voice)
    audio, sample_rate = _read(first.wav)
    assert sample_rate == rate == first.sample_rate
    assert audio.ndim == 1
    assert 2.0 < len(audio) / rate < 8.0, "length should fit about ten words"
    assert np.abs(audio).max() > 1000, "real speech, not silence"
    assert first.sentences == 2 and first.cached_sentences == 0
    again = synth.render(text, voice)
    assert again.cached and again.wav == first.wav
    # A new message made of a known sentence reuses it.
    mixed = synth.render("The washing machine has finished. Something new.", voice)
    assert (mixed.sentences, mixed.cached_sentences) == (2, 1)


def test_model_is_loaded_only_on_a_miss(settings: Settings, tmp_path: Path) -> None:
    warm = Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))
    warm.render("Only a cache hit later.", "heart")
    warm.cache.close()
    cold_pool = EnginePool(settings)
    cold = Synthesizer(settings, cold_pool, SentenceCache(settings.cache))
    assert cold.render("Only a cache hit later.", "heart").cached
    assert cold_pool.loaded() == []


def test_other_voices_do_not_read_chattts_tags_out(synth: Synthesizer) -> None:
    """A ChatTTS voice's request routed to the fast tier keeps its control tags; hibari and
    Piper would say "uv break" and "laugh" (they did: +0.6 s and +0.35 s of audio)."""
    plain = synth.render("Hello there, it is raining.", "heart", use_cache=False)
    tagged_text = "Hello [uv_break] there, it is raining [laugh]."
    tagged = synth.render(tagged_text, "heart", use_cache=False)
    assert tagged.wav == plain.wav  # hibari is deterministic: exactly the untagged audio
    # A sentence that is only a tag is silence, for Piper too; the text around it is spoken.
    rendering = synth.render("The door is open. [laugh]", "joe", use_cache=False)
    assert rendering.sentences == 2
    joe = synth.engines.voice("joe")
    options = synth.options_for(joe)
    assert synth.sentence(joe, 1, "[laugh]", options, False).pcm.size == 0
    assert synth.sentence(joe, 0, "[speed_5] The door is open.", options, False).pcm.size > 0


def test_say_command_writes_a_wav(tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    cmd = [sys.executable, "-m", "tts_bridge", "say", "Dinner is ready.", "-o", str(out)]
    cmd += ["--voice", "heart", "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    audio, rate = soundfile.read(out)
    assert rate == 24000 and 0.5 < len(audio) / rate < 3.0
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert "1/1 sentences from the cache" in again.stdout
    bad = subprocess.run(
        [*cmd[:4], "🎉", "-o", str(tmp_path / "x.wav"), "--cache-dir", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 1 and "nothing_speakable" in bad.stderr


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux only")
def test_models_load_at_normal_priority_even_from_the_idle_thread(tmp_path: Path) -> None:
    """onnxruntime starts its worker threads while loading, and a thread inherits the nice value
    of its creator: a model first used by the idle thread (nice +10) must not leave every later
    live request computing on deprioritized threads."""
    settings = load_settings(
        None,
        {"cache": {"dir": str(tmp_path / "cache")}, "synthesis": {"onnx_threads": 2}},
        environ={},
    )
    pool = EnginePool(settings)
    engine = pool.voice("joe").engine
    normal = os.getpriority(os.PRIO_PROCESS, 0)
    new = threads_started_niced(lambda: pool.ensure_loaded(engine), 60)
    assert engine.loaded
    assert new, "onnxruntime started no thread (2 intra-op threads were asked for)"
    assert set(new.values()) == {normal}, new
    pool.unload_all()


def test_cost_estimate_and_rtf_leave_the_model_load_out(tmp_path: Path) -> None:
    """Routing sends a live request to the fast tier when the quality voice's estimate misses
    the budget: a first load (several times a sentence's synthesis) must not count as cost."""
    settings = load_settings(
        None,
        {"cache": {"dir": str(tmp_path / "cache")}, "synthesis": {"onnx_threads": 1}},
        environ={},
    )
    pool = EnginePool(settings)
    synth = Synthesizer(settings, pool, SentenceCache(settings.cache))
    engine = pool.voice("joe").engine
    text = "The washing machine has finished."
    started = time.perf_counter()
    rendering = synth.render(text, "joe", use_cache=False)
    wall = time.perf_counter() - started
    load = pool.load_seconds[engine.identity]
    synthesis = synth.stats.rtf()[engine.identity] * rendering.duration_ms / 1000
    # The synthesis time counted is disjoint from the load: both fit in the wall time (the
    # 10 ms allow for the RTF's rounding); counting the load twice would overshoot by `load`.
    assert load > 0.01
    assert synthesis + load <= wall + 0.01, (synthesis, load, wall)
    # And the estimate learned exactly that time per character.
    seed = catalog.spec("piper").seed_seconds_per_char
    learned = synth.estimator.snapshot()[engine.identity]
    assert learned == pytest.approx(0.8 * seed + 0.2 * synthesis / len(text), rel=0.05)
    synth.cache.close()
    pool.unload_all()


def test_a_cache_hit_goes_out_before_its_bookkeeping_is_written(synth: Synthesizer) -> None:
    """The path to a hit's first byte only reads: the hit counter and the entry's recency are
    written once its audio was handed on."""
    from tts_bridge.speech.rendering import AudioPart
    from tts_bridge.speech.request import SpeechRequest

    text = "The porch light is on."
    plan = synth.plan(SpeechRequest(text=text, voice="heart"))
    synth.render_plan(plan, plan.voice)  # now cached
    seen: list[int] = []

    def on_part(part: AudioPart) -> None:
        assert part.cached
        seen.append(synth.cache.stats()["hits"])

    before = synth.cache.stats()["hits"]
    again = synth.render_plan(plan, plan.voice, on_part=on_part)
    assert again.cached and seen == [before]
    assert synth.cache.stats()["hits"] == before + 1
