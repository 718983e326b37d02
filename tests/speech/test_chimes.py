"""Chimes: the built-in ones, a user's files, and their place in the answer's audio."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from tts_bridge.config import Settings, load_settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.chimes import BUILT_IN, ChimeError, ChimeLibrary
from tts_bridge.speech.loudness import LoudnessNormalizer, true_peak_dbfs
from tts_bridge.speech.request import Announcement
from tts_bridge.speech.settings import ChimesSettings
from tts_bridge.speech.synthesis import AudioPart, RequestError, Synthesizer

TARGET = -18.0


def _library(folder: Path, max_seconds: float = 5.0) -> ChimeLibrary:
    return ChimeLibrary(
        ChimesSettings(dir=folder, max_seconds=max_seconds), LoudnessNormalizer(TARGET, -1.0)
    )


@pytest.mark.parametrize("name", sorted(BUILT_IN))
@pytest.mark.parametrize("rate", [22050, 24000])
def test_built_in_chimes_are_made_at_the_voices_rate_and_loudness(
    tmp_path: Path, name: str, rate: int
) -> None:
    library = _library(tmp_path)
    pcm = library.pcm(name, rate)
    assert 0.3 < pcm.size / rate < 3.0
    assert LoudnessNormalizer(None, 0).measure(pcm, rate) == pytest.approx(TARGET, abs=1.0)
    assert true_peak_dbfs(pcm, rate) <= -0.9
    # No click: the first and last samples are near silence.
    assert abs(int(pcm[0])) < 300 and abs(int(pcm[-1])) < 300


def test_a_users_file_is_listed_decoded_resampled_cut_and_matched(tmp_path: Path) -> None:
    rate = 44100
    t = np.arange(int(8.0 * rate)) / rate  # longer than max_seconds
    stereo = np.stack([0.05 * np.sin(2 * np.pi * 700 * t)] * 2, axis=1)
    soundfile.write(tmp_path / "doorbell.flac", stereo, rate)
    (tmp_path / "notes.txt").write_text("not a chime", encoding="utf-8")
    library = _library(tmp_path, max_seconds=2.0)
    names = {c.name: c.source for c in library.list()}
    assert names["doorbell"] == "doorbell.flac" and names["ding"] == "built-in"
    assert "notes" not in names
    pcm = library.pcm("doorbell", 22050)
    assert pcm.size == pytest.approx(2.0 * 22050, abs=2)
    assert LoudnessNormalizer(None, 0).measure(pcm, 22050) == pytest.approx(TARGET, abs=0.5)


def test_unknown_and_broken_chimes_are_refused(tmp_path: Path) -> None:
    (tmp_path / "broken.wav").write_bytes(b"RIFF....not audio")
    library = _library(tmp_path)
    with pytest.raises(ChimeError) as caught:
        library.check("gong")
    assert caught.value.code == "unknown_chime" and "dingdong" in str(caught.value)
    with pytest.raises(ChimeError) as caught:
        library.pcm("broken", 22050)
    assert caught.value.code == "invalid_chime"


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("chimes")
    return load_settings(
        None,
        {
            "cache": {"dir": str(tmp / "cache")},
            "synthesis": {"onnx_threads": 1},
            "chimes": {"dir": str(tmp / "chimes")},
            "presets": {"joe_chime": {"voice": "joe", "chime": "dingdong"}},
        },
        environ={},
    )


@pytest.fixture(scope="module")
def synth(settings: Settings) -> Synthesizer:
    return Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))


def test_the_answer_starts_with_its_chime_and_ends_with_the_other(synth: Synthesizer) -> None:
    text = "Someone is at the front door."
    plan = synth.validate(text, "joe", None, None, Announcement(chime="ding", chime_after="alert"))
    parts: list[AudioPart] = []
    rendering = synth.render_plan(plan, plan.voice, on_part=parts.append)
    rate = rendering.sample_rate
    ding, alert = synth.chimes.pcm("ding", rate), synth.chimes.pcm("alert", rate)
    assert np.array_equal(rendering.pcm[: ding.size], ding)
    assert np.array_equal(rendering.pcm[-alert.size :], alert)
    gap = rendering.pcm[ding.size : ding.size + rate * synth_gap_ms(synth) // 1000]
    assert not gap.any(), "silence between the chime and the speech"
    # Streamed, the same audio: the chime is in the first part, not a message of its own.
    assert np.array_equal(np.concatenate([p.pcm for p in parts]), rendering.pcm)
    assert parts[-1].last and np.array_equal(parts[0].pcm[: ding.size], ding)
    # Too big for one message, sent per sentence: the same audio again.
    pieces = synth.sentence_parts(
        [synth.sentence(plan.voice, 0, plan.sentences[0], plan.options, True)],
        rate,
        rendering.layout,
    )
    assert np.array_equal(np.concatenate([p.pcm for p in pieces]), rendering.pcm)
    # The speech itself is what the cache holds: no chime in it.
    plain = synth.render(text, "joe")
    assert plain.cached and rendering.pcm.size == plain.pcm.size + ding.size + alert.size + (
        2 * rate * synth_gap_ms(synth) // 1000
    )


def synth_gap_ms(synth: Synthesizer) -> int:
    return synth._settings.chimes.gap_ms


def test_request_then_preset_then_target_decide_the_chime(synth: Synthesizer) -> None:
    text = "Dinner is ready."
    preset = synth.validate(text, "joe_chime", None)
    assert (preset.voice.name, preset.chime, preset.chime_after) == ("joe", "dingdong", None)
    own = synth.validate(text, "joe_chime", None, None, Announcement(chime="ding"))
    assert own.chime == "ding"
    none = synth.validate(text, "joe_chime", None, None, Announcement(chime=""))
    assert none.chime is None
    target = synth.validate(text, "heart", None, None, Announcement(default_chime="alert"))
    assert target.chime == "alert"
    with pytest.raises(RequestError) as caught:
        synth.validate(text, "joe", None, None, Announcement(chime="gong"))
    assert caught.value.code == "unknown_chime"


def test_presets_must_name_a_voice(tmp_path: Path) -> None:
    from tts_bridge.config import ConfigError

    with pytest.raises(ConfigError, match=r"presets\.x\.voice"):
        load_settings(None, {"presets": {"x": {"voice": "nobody"}}}, environ={})
    with pytest.raises(ConfigError, match="a voice has this name"):
        load_settings(None, {"presets": {"joe": {"voice": "heart"}}}, environ={})
