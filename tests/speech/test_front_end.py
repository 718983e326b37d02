"""One text front end for every voice: what Piper and hibari are given, what the cache keys
hold, and which voice speaks each sentence of a mixed English/Chinese text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tts_bridge.config import Settings, load_settings
from tts_bridge.engines.piper import bundled_model
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import CacheKey, SentenceCache
from tts_bridge.speech.synthesis import RequestError, Synthesizer

# What home announcements looked like to joe before the front end: letters, slashes, a split.
SAMPLE = (
    "Solar made 14.2 kWh today; the oven draws 2100 W. Presents on 12/24, 65 km/h gusts, "
    "Dr. Miller calls at 23:00."
)
STRESS = str.maketrans("", "", "ˈˌ")
DOUBLE_U = "dʌbəlj"  # the letter W
SLASH = "slæʃ"
AITCH = "eɪtʃ"  # the letter H ("K W H", "K M slash H")


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("front-end")
    return load_settings(
        None, {"cache": {"dir": str(tmp / "cache")}, "synthesis": {"onnx_threads": 1}}, environ={}
    )


@pytest.fixture(scope="module")
def synth(settings: Settings) -> Synthesizer:
    return Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))


def _joe_phonemes(text: str) -> list[str]:
    """joe's own phonemizer (espeak-ng through piper), one string per sentence it makes."""
    from piper import PiperVoice
    from piper.config import PiperConfig

    model = bundled_model()
    config = PiperConfig.from_dict(json.loads(Path(f"{model}.json").read_text(encoding="utf-8")))
    voice: Any = PiperVoice(session=None, config=config)
    return ["".join(s).translate(STRESS) for s in voice.phonemize(text)]


def test_piper_is_given_words_not_letters(synth: Synthesizer) -> None:
    joe = synth.engines.voice("joe").engine
    raw = " ".join(_joe_phonemes(joe.prepare_text(SAMPLE)))
    # Without the front end joe says "K W H", "double-u", "slash" (the test can fail).
    assert DOUBLE_U in raw and SLASH in raw and AITCH in raw
    given = synth.front_text(joe, SAMPLE)
    sentences = _joe_phonemes(joe.prepare_text(given))
    spoken = " ".join(sentences)
    assert DOUBLE_U not in spoken and SLASH not in spoken and AITCH not in spoken, given
    assert len(sentences) == 2, "no sentence break at 'Dr.'"
    assert "kɪləwɑːt" in spoken
    assert given.startswith("Solar made fourteen point two kilowatt hours today")


@pytest.mark.parametrize("voice", ["joe", "heart"])
def test_english_voices_get_the_english_front_end(synth: Synthesizer, voice: str) -> None:
    engine = synth.engines.voice(voice).engine
    assert synth.front_text(engine, "Room 204, call 911.") == "Room two oh four, call nine one one."
    assert (
        synth.front_text(engine, "Call from 王小明 at 7:30 pm.")
        == "Call from Wang Xiaoming at seven thirty p m."
    )


def test_cache_key_holds_the_normalized_text(synth: Synthesizer) -> None:
    voice = synth.engines.voice("joe")
    options = synth.options_for(voice)
    plain = "The front door is open."
    # A sentence the front end leaves alone keeps the key it always had.
    assert synth._key(voice, plain, options) == CacheKey(
        sentence=plain,
        engine=voice.engine.identity,
        voice="joe",
        speaker=voice.speaker,
        options=tuple(sorted(options.cache_fields().items())),
        sample_rate=voice.engine.sample_rate,
        loudness="-18LUFS/-1dBTP",
    )
    assert synth._key(voice, "It is 21 °C.", options).sentence == (
        "It is twenty-one degrees Celsius."
    )


def test_a_changed_reading_is_a_new_entry_and_the_same_reading_shares_one(
    synth: Synthesizer,
) -> None:
    first = synth.render("Consumption today: 12.4 kWh.", "heart")
    assert not first.cached
    # The same words written out are the same sentence to the voice: one cache entry.
    same = synth.render("Consumption today: twelve point four kilowatt hours.", "heart")
    assert same.cached and same.wav == first.wav


def test_english_sentence_with_a_chinese_name_is_spoken(synth: Synthesizer) -> None:
    rendering = synth.render("Call from 王小明 at 7:30 pm.", "joe")
    assert rendering.engine == "piper" and rendering.duration_ms > 1000
    assert rendering.sentence_voices == ()


def test_chinese_sentence_without_a_chinese_voice_is_refused(tmp_path: Path) -> None:
    # A configuration that lists its own voices and none of them speaks Chinese.
    voices = {"joe": {"engine": "piper", "fast_voice": "heart"}, "heart": {"engine": "hibari"}}
    settings = load_settings(
        None, {"cache": {"dir": str(tmp_path / "cache")}, "voices": voices}, environ={}
    )
    english_only = Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))
    with pytest.raises(RequestError) as caught:
        english_only.render("Call from 王小明. 王小明说他马上到家。", "joe")
    assert caught.value.code == "unsupported_language"
