"""SSML through the synthesizer: exact breaks in the audio, rates, substitutes, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from tts_bridge.config import Settings, load_settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.request import Announcement
from tts_bridge.speech.synthesis import AudioPart, RequestError, Synthesizer


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("ssml")
    return load_settings(
        None, {"cache": {"dir": str(tmp / "cache")}, "synthesis": {"onnx_threads": 1}}, environ={}
    )


@pytest.fixture(scope="module")
def synth(settings: Settings) -> Synthesizer:
    return Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))


def longest_silence_ms(pcm: np.ndarray, rate: int) -> float:
    """The longest run of exact digital silence (what the bridge inserts; engines' own quiet
    parts are not exactly zero for this long)."""
    zero = np.concatenate([[False], pcm == 0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    runs = edges[1::2] - edges[::2]
    return float(runs.max()) * 1000 / rate if runs.size else 0.0


@pytest.mark.parametrize("voice", ["joe", "heart"])
def test_a_break_is_exact_in_the_audio(synth: Synthesizer, voice: str) -> None:
    plain = synth.render("The door is open. Close it.", voice)
    ssml = synth.render('<speak>The door is open.<break time="1500ms"/>Close it.</speak>', voice)
    rate = ssml.sample_rate
    assert ssml.sentences == 2 and ssml.cached_sentences == 2  # the same sentences, cached
    pause_ms = synth._settings.synthesis.sentence_pause_ms
    # Between the sentences: the engine's own quiet edges and the bridge's silence, which the
    # break replaces (the usual pause) sample for sample.
    between = longest_silence_ms(plain.pcm, rate)
    assert pause_ms - 1 <= between < 1000
    gap = longest_silence_ms(ssml.pcm, rate)
    assert gap - between == pytest.approx(1500 - pause_ms, abs=1000 / rate), gap
    assert ssml.pcm.size - plain.pcm.size == rate * 1500 // 1000 - rate * pause_ms // 1000


def test_streamed_parts_join_to_the_answer(synth: Synthesizer) -> None:
    text = '<speak><break time="300ms"/>One.<break time="1s"/>Two.<break time="200ms"/></speak>'
    plan = synth.validate(text, "heart", None)
    assert plan.gaps_ms == (300, 1000, 200)
    parts: list[AudioPart] = []
    rendering = synth.render_plan(plan, plan.voice, on_part=parts.append)
    assert np.array_equal(np.concatenate([p.pcm for p in parts]), rendering.pcm)
    assert not rendering.pcm[: 300 * rendering.sample_rate // 1000].any()


def test_a_slower_rate_is_slower_audio(synth: Synthesizer) -> None:
    normal = synth.render("<speak>Please leave the building now.</speak>", "joe")
    slow = synth.render(
        '<speak><prosody rate="x-slow">Please leave the building now.</prosody></speak>', "joe"
    )
    assert not slow.cached  # another speed: another cache entry
    assert slow.duration_ms > normal.duration_ms * 1.3


def test_say_as_and_sub_reach_the_voice_as_words(synth: Synthesizer) -> None:
    plan = synth.validate(
        '<speak>Code <say-as interpret-as="digits">4711</say-as>, '
        '<sub alias="Doctor">Dr</sub> <say-as interpret-as="characters">ABC</say-as>.</speak>',
        "heart",
        None,
    )
    heart = plan.voice.engine
    assert synth.front_text(heart, plan.sentences[0]) == "Code four seven one one, Doctor A B C."


def test_ssml_off_speaks_the_text_as_written(synth: Synthesizer) -> None:
    plan = synth.validate("<speak>Hi</speak>", "joe", None, None, Announcement(ssml=False))
    assert plan.sentences == ["<speak>Hi</speak>"] and not plan.gaps_ms
    forced = synth.validate("<speak>Hi</speak>", "joe", None, None, Announcement(ssml=True))
    assert forced.sentences == ["Hi"]


def test_audio_elements_choose_the_chimes(synth: Synthesizer) -> None:
    plan = synth.validate('<speak><audio src="ding"/>Hi.</speak>', "joe", None)
    assert plan.chime == "ding"
    own = synth.validate(
        '<speak><audio src="ding"/>Hi.</speak>', "joe", None, None, Announcement(chime="alert")
    )
    assert own.chime == "alert"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("<speak>Hi <b></speak>", "invalid_ssml"),
        ('<speak><audio src="gong"/>Hi</speak>', "unknown_chime"),
        ("<speak><break/>!!</speak>", "nothing_speakable"),
        ("<speak><break/></speak>", "empty_text"),
        ("<speak>   </speak>", "empty_text"),
        ("<speak>" + '<break time="10s"/>x' * 40 + "</speak>", "invalid_ssml"),
        ("<speak>" + "word " * 1000 + "</speak>", "text_too_long"),
    ],
)
def test_bad_ssml_is_refused(synth: Synthesizer, text: str, code: str) -> None:
    with pytest.raises(RequestError) as caught:
        synth.validate(text, "joe", None)
    assert caught.value.code == code, caught.value
