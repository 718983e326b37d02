"""One loudness for every voice: the meter, the limiter, and the real voices through the bridge."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.support.chattts_tiny import NEEDS_CHATTTS_ONNX
from tts_bridge.bench.loudness import ANNOUNCEMENTS, measure_voices
from tts_bridge.config import Settings, load_settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.loudness import LoudnessNormalizer, apply_gain, true_peak_dbfs
from tts_bridge.speech.synthesis import AudioPart, Synthesizer

RATE = 22050


def _tone(seconds: float, amplitude: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return np.asarray(np.round(amplitude * 32767 * np.sin(2 * np.pi * hz * t)), dtype="<i2")


def test_a_quiet_sound_is_brought_to_the_target() -> None:
    norm = LoudnessNormalizer(-18.0, -1.0)
    quiet = _tone(2.0, 0.02)
    assert norm.measure(quiet, RATE) < -35
    loud, gain = norm.normalize(quiet, RATE)
    assert gain > 15
    assert norm.measure(loud, RATE) == pytest.approx(-18.0, abs=0.1)


def test_a_word_shorter_than_a_gating_block_is_measured_and_normalized() -> None:
    norm = LoudnessNormalizer(-18.0, -1.0)
    word = _tone(0.15, 0.05)  # BS.1770 needs 0.4 s: too short for the meter alone
    long = _tone(2.0, 0.05)
    assert norm.measure(word, RATE) == pytest.approx(norm.measure(long, RATE), abs=0.5)
    out, _ = norm.normalize(word, RATE)
    assert norm.measure(out, RATE) == pytest.approx(-18.0, abs=0.5)


def test_peaks_stay_under_the_ceiling_and_the_speech_on_target() -> None:
    norm = LoudnessNormalizer(-18.0, -1.0)
    # A full-scale click on a quiet tone (what Piper's peak-normalized audio looks like):
    # raising it by gain alone would clip the click.
    signal = _tone(2.0, 0.05).astype(np.float64)
    signal[RATE // 2 : RATE // 2 + 40] = 32000
    pcm = np.asarray(signal, dtype="<i2")
    out, gain = norm.normalize(pcm, RATE)
    assert gain > 5
    assert true_peak_dbfs(out, RATE) <= -1.0 + 0.1
    assert norm.measure(out, RATE) == pytest.approx(-18.0, abs=0.3)


def test_silence_and_no_audio_are_left_alone() -> None:
    norm = LoudnessNormalizer(-18.0, -1.0)
    silent = np.zeros(RATE, dtype="<i2")
    out, gain = norm.normalize(silent, RATE)
    assert gain == 0.0 and not out.any()
    assert norm.measure(np.zeros(0, dtype="<i2"), RATE) == -math.inf


def test_off_leaves_audio_as_made_and_keys_say_so() -> None:
    off = LoudnessNormalizer(None, -1.0)
    pcm = _tone(1.0, 0.1)
    assert off.normalize(pcm, RATE)[0] is pcm
    assert off.cache_field() != LoudnessNormalizer(-18.0, -1.0).cache_field()
    assert (
        LoudnessNormalizer(-16.0, -1.0).cache_field()
        != LoudnessNormalizer(-18.0, -1.0).cache_field()
    )


def test_gain_is_clipped_not_wrapped() -> None:
    loud = _tone(0.5, 0.9)
    out = apply_gain(loud, 12.0)
    assert out.max() == 32767 and out.min() == -32768
    assert np.all(np.sign(out[loud != 0]) == np.sign(loud[loud != 0]))


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("loudness")
    return load_settings(
        None, {"cache": {"dir": str(tmp / "cache")}, "synthesis": {"onnx_threads": 1}}, environ={}
    )


def test_joe_and_heart_answer_at_the_target(settings: Settings) -> None:
    """The bench's announcements: each within 1 LU of the target, so of each other."""
    target = settings.synthesis.loudness_lufs
    assert target is not None
    measured = measure_voices(settings, ("joe", "heart"), ANNOUNCEMENTS)
    for voice, figures in measured.items():
        for text, lufs in zip(ANNOUNCEMENTS, figures["lufs"], strict=True):
            assert abs(lufs - target) <= 1.0, (voice, text, lufs)
    assert abs(measured["joe"]["mean_lufs"] - measured["heart"]["mean_lufs"]) <= 1.0


def test_without_normalization_the_voices_miss_the_target(settings: Settings) -> None:
    """What the test above proves is the bridge's doing: as the engines make them, the
    announcements are not within 1 LU of the target (this one can fail if engines change)."""
    target = settings.synthesis.loudness_lufs
    assert target is not None
    off = settings.model_copy(
        update={"synthesis": settings.synthesis.model_copy(update={"loudness_lufs": None})}
    )
    measured = measure_voices(off, ("joe", "heart"), ANNOUNCEMENTS[:3])
    for voice, figures in measured.items():
        assert all(abs(lufs - target) > 1.0 for lufs in figures["lufs"]), (voice, figures)


@NEEDS_CHATTTS_ONNX
@pytest.mark.slow
def test_the_tiny_chattts_answers_at_the_target_too(tiny_export_fp32: Path, tmp_path: Path) -> None:
    """ChatTTS on random weights makes loud noise, nothing like speech: the same target."""
    voice = {"engine": "chattts-onnx", "model": str(tiny_export_fp32), "precision": "fp32"}
    settings = load_settings(
        None,
        {
            "cache": {"dir": str(tmp_path / "cache")},
            "synthesis": {"onnx_threads": 1},
            "voices": {"tiny": voice},
            "default_voice": "tiny",
        },
        environ={},
    )
    target = settings.synthesis.loudness_lufs
    assert target is not None
    texts = ANNOUNCEMENTS[:4]
    measured = measure_voices(settings, ("tiny",), texts)["tiny"]
    for text, lufs in zip(texts, measured["lufs"], strict=True):
        assert abs(lufs - target) <= 1.0, (text, lufs)
    # Streamed in pieces (before the sentence is complete): one gain for all of them, and the
    # sentence as cached is the pieces joined.
    synth = Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))
    tiny = synth.engines.voice("tiny")
    options = synth.options_for(tiny)
    parts: list[AudioPart] = []
    sentence = synth.sentence(tiny, 0, LONG, options, True, on_part=parts.append, streaming=True)
    assert len(parts) >= 3, "the engine streams this sentence in pieces"
    joined = np.concatenate([p.pcm for p in parts])
    assert np.array_equal(joined, sentence.pcm)
    hit = synth.cache.get(synth._key(tiny, LONG, options))
    assert hit is not None and np.array_equal(hit.pcm, joined)
    meter = LoudnessNormalizer(None, 0.0)
    assert abs(meter.measure(joined, tiny.engine.sample_rate) - target) <= 3.0
    assert true_peak_dbfs(joined, tiny.engine.sample_rate) <= -0.9
    synth.cache.close()


LONG = (
    "The weather service says that heavy rain and strong wind will reach the valley late this "
    "evening, so please close the windows and bring the garden chairs inside before dark."
)
