"""The front text (speech/front_text.py) on its own: what each voice is given and the cache key
it makes, from the lexicon and the voice's front end (no model is loaded)."""

from __future__ import annotations

from pathlib import Path

from tts_bridge.config import load_settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.front_text import FrontText
from tts_bridge.speech.loudness import LoudnessNormalizer
from tts_bridge.speech.pronunciations import Pronunciations
from tts_bridge.speech.validation import options_for


def test_the_lexicon_comes_before_the_front_end_and_the_key_holds_what_is_spoken(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        None,
        {
            "cache": {"dir": str(tmp_path / "cache")},
            "lexicon": {"Worcester": {"say": "wuster 2", "phonemes": "wˈʊstɚ"}},
        },
        environ={},
    )
    pool = EnginePool(settings)
    loud = LoudnessNormalizer(-18.0, -1.0)
    front = FrontText(settings, Pronunciations.from_settings(settings, None), loud)
    joe, heart = pool.voice("joe"), pool.voice("heart")
    # The respelling's number is read by the English front end like any other number.
    assert front.text(heart.engine, "Worcester at 5.") == "wuster two at five."
    # Piper takes the lexicon's phonemes.
    assert front.text(joe.engine, "Worcester at 5.") == "[[ wˈʊstɚ ]] at five."
    options = options_for(heart)
    key = front.key(heart, "Worcester at 5.", options)
    assert key.sentence == "wuster two at five."
    assert (key.voice, key.engine) == ("heart", heart.engine.identity)
    assert key.loudness == "-18LUFS/-1dBTP"
    # Another loudness is another key: its audio was normalized otherwise.
    quiet = FrontText(
        settings, Pronunciations.from_settings(settings, None), LoudnessNormalizer(None, -1.0)
    )
    assert quiet.key(heart, "Worcester at 5.", options) != key
