"""Validation (speech/validation.py): a request to a plan, against the real bundled voices'
configuration (no model is loaded to validate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tts_bridge.config import Settings, load_settings
from tts_bridge.engines.registry import EnginePool, UnknownVoiceError
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.chimes import ChimeLibrary
from tts_bridge.speech.loudness import LoudnessNormalizer
from tts_bridge.speech.request import SpeechRequest
from tts_bridge.speech.synthesis import Synthesizer
from tts_bridge.speech.validation import RequestError, Validator


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("validation")
    return load_settings(
        None,
        {
            "cache": {"dir": str(tmp / "cache")},
            "synthesis": {"onnx_threads": 1},
            "presets": {"doorbell": {"voice": "joe", "chime": "ding"}},
        },
        environ={},
    )


@pytest.fixture(scope="module")
def synth(settings: Settings) -> Synthesizer:
    return Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))


@pytest.fixture(scope="module")
def validator(settings: Settings) -> Validator:
    loudness = LoudnessNormalizer(None, settings.synthesis.true_peak_dbtp)
    return Validator(settings, EnginePool(settings), ChimeLibrary(settings.chimes, loudness))


def test_refusals(synth: Synthesizer) -> None:
    with pytest.raises(UnknownVoiceError):
        synth.render("Hello.", "nobody")
    with pytest.raises(RequestError) as caught:
        synth.render("Hello.", "joe", lang="zh")
    assert caught.value.code == "unsupported_language"


def test_chinese_without_a_chinese_voice_is_refused(tmp_path: Path) -> None:
    settings = load_settings(
        None,
        {"cache": {"dir": str(tmp_path)}, "voices": {"joe": {"engine": "piper"}}},
        environ={},
    )
    english_only = Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))
    with pytest.raises(RequestError) as caught:
        english_only.validate("客厅温度很高。", "joe", None)
    assert caught.value.code == "unsupported_language"
    english_only.cache.close()


def test_chinese_goes_to_the_default_chinese_voice(synth: Synthesizer) -> None:
    plan = synth.validate("客厅温度很高。", "joe", None)
    assert [v.name if v else None for v in plan.others] == ["xiaobei"]


def test_a_request_is_validated_whole(validator: Validator) -> None:
    """Every field validation reads comes from the request: voice, language, options, chimes
    (its own before its preset's before the door's default) and the SSML flag."""
    request = SpeechRequest(
        text="<speak>Hi there. <break time='1s'/>Bye.</speak>",
        voice="doorbell",
        language="en",
        options={"speed": 1.5},
        chime_after="alert",
        default_chime="alert",
        ssml=True,
    )
    plan = validator.plan(request)
    assert plan.voice.name == "joe"
    assert plan.sentences == ["Hi there.", "Bye."]
    assert plan.language == "en"
    assert plan.options.speed == 1.5 and plan.overrides == {"speed": 1.5}
    assert (plan.chime, plan.chime_after) == ("ding", "alert")  # the preset's before the door's
    assert plan.gaps_ms == (0, 1000, 0)
    spoken = validator.plan(SpeechRequest(text="<speak>Hi.</speak>", voice="joe", ssml=False))
    assert spoken.sentences == ["<speak>Hi.</speak>"] and spoken.gaps_ms == ()
    own = validator.plan(SpeechRequest(text="Hi.", voice="doorbell", chime=""))
    assert own.chime is None
    door = validator.plan(SpeechRequest(text="Hi.", voice="joe", default_chime="alert"))
    assert door.chime == "alert"


def test_a_request_is_refused_with_its_reason(validator: Validator) -> None:
    for request, code in [
        (SpeechRequest(text="  "), "empty_text"),
        (SpeechRequest(text="Hi.", voice="joe", options={"pitch": 2}), "invalid_options"),
        (SpeechRequest(text="Hi.", voice="joe", language="zh"), "unsupported_language"),
        (SpeechRequest(text="Hi.", voice="joe", chime="gong"), "unknown_chime"),
        (SpeechRequest(text="<speak>Hi", voice="joe", ssml=True), "invalid_ssml"),
    ]:
        with pytest.raises(RequestError) as caught:
            validator.plan(request)
        assert caught.value.code == code, request
    with pytest.raises(UnknownVoiceError):
        validator.plan(SpeechRequest(text="Hi.", voice="nobody"))
