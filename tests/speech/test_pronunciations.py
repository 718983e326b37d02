"""The shared lexicon: what each voice is given, the cache keys, and edits kept across restarts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tts_bridge.config import ConfigError, Settings, load_settings
from tts_bridge.engines.base import Engine
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.pronunciations import FILE_NAME, Pronunciations
from tts_bridge.speech.synthesis import Synthesizer
from tts_bridge.text.lexicon import LexiconError

SENTENCE = "Siobhan Nguyen lives at 12 Worcester Road."


def _settings(tmp: Path, **more: object) -> Settings:
    return load_settings(
        None,
        {"cache": {"dir": str(tmp / "cache")}, "synthesis": {"onnx_threads": 1}, **more},
        environ={},
    )


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / "names.yaml").write_text(
        "Worcester: {say: wuster, phonemes: wˈʊstɚ}\nSiobhan: from the file\n", encoding="utf-8"
    )
    return _settings(
        tmp_path,
        lexicon={"Siobhan": "shiv awn"},
        lexicon_file=str(tmp_path / "names.yaml"),
    )


def _synth(settings: Settings, state: Path) -> Synthesizer:
    return Synthesizer(
        settings,
        EnginePool(settings),
        SentenceCache(settings.cache),
        pronunciations=Pronunciations.from_settings(settings, state),
    )


def test_every_voice_is_given_the_lexicons_words(settings: Settings, tmp_path: Path) -> None:
    synth = _synth(settings, tmp_path / "state")
    joe = synth.engines.voice("joe").engine  # Piper: takes phonemes
    heart = synth.engines.voice("heart").engine
    # The configured entry wins over the file's; the number is read after the lexicon.
    assert synth.front_text(heart, SENTENCE) == "shiv awn Nguyen lives at twelve wuster Road."
    assert synth.front_text(joe, SENTENCE) == ("shiv awn Nguyen lives at twelve [[ wˈʊstɚ ]] Road.")
    synth.pronunciations.set("Nguyen", "win")
    for engine in (joe, heart):
        assert "win lives" in synth.front_text(engine, SENTENCE)


def _given(monkeypatch: pytest.MonkeyPatch, engine: Engine) -> list[str]:
    """What `engine` is given to speak from now on, call by call (it still speaks)."""
    given: list[str] = []
    for name in ("synthesize", "synthesize_stream"):
        method = getattr(engine, name, None)
        if method is None:
            continue

        def record(text: str, *rest: Any, _method: Any = method, **kwargs: Any) -> Any:
            given.append(text)
            return _method(text, *rest, **kwargs)

        monkeypatch.setattr(engine, name, record)
    return given


def test_an_edit_reaches_the_engine_and_only_the_sentences_it_touches_are_made_again(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synth = _synth(settings, tmp_path / "state")
    voice = synth.engines.voice("joe")  # Piper: given the file's phonemes
    given = _given(monkeypatch, voice.engine)
    first = synth.render(SENTENCE, "joe").wav
    synth.render("Hi.", "joe")
    assert given == ["shiv awn Nguyen lives at twelve [[ wˈʊstɚ ]] Road.", "Hi."]

    given.clear()
    synth.pronunciations.set("nguyen", "win")
    synth.render(SENTENCE, "joe")
    synth.render("Hi.", "joe")  # untouched: still the cache's
    assert given == ["shiv awn win lives at twelve [[ wˈʊstɚ ]] Road."]

    given.clear()
    synth.pronunciations.remove("NGUYEN")
    assert synth.render(SENTENCE, "joe").wav == first  # the first rendering, from the cache
    assert given == []


def test_edits_survive_a_restart_and_configured_entries_stay(
    settings: Settings, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    store = Pronunciations.from_settings(settings, state)
    entry, saved = store.set("Nguyen", "win")
    assert saved and entry.say == "win"
    store.set("Siobhan", "shiv on")  # a run-time entry wins over the configured one
    again = Pronunciations.from_settings(settings, state)
    listed = {e["word"]: (e["say"], e["source"]) for e in again.entries()}
    assert listed["Nguyen"] == ("win", "runtime")
    assert listed["Siobhan"] == ("shiv on", "runtime")
    assert listed["Worcester"] == ("wuster", "configuration")
    assert json.loads((state / FILE_NAME).read_text(encoding="utf-8"))["version"] == 1
    with pytest.raises(LexiconError, match="configuration"):
        again.remove("Worcester")
    with pytest.raises(LexiconError, match="not in it"):
        again.remove("Smith")


def test_a_damaged_saved_lexicon_is_ignored(settings: Settings, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / FILE_NAME).write_text("{not json", encoding="utf-8")
    store = Pronunciations.from_settings(settings, state)
    assert store.apply("Siobhan") == "shiv awn"
    store.set("Nguyen", "win")  # the next edit replaces the file
    assert Pronunciations.from_settings(settings, state).apply("Nguyen") == "win"


def test_bad_configured_entries_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="lexicon"):
        _settings(tmp_path, lexicon={"!!": "bang"})
    # A file is read at start-up: what cannot be used is logged, the rest applies.
    (tmp_path / "list.yaml").write_text("- a\n- b\n", encoding="utf-8")
    (tmp_path / "mixed.yaml").write_text("Nguyen: win\nBad: {sound: x}\n", encoding="utf-8")
    for name, said in (("list.yaml", "Nguyen"), ("mixed.yaml", "win"), ("missing.yaml", "Nguyen")):
        settings = _settings(tmp_path, lexicon_file=str(tmp_path / name))
        assert Pronunciations.from_settings(settings, None).apply("Nguyen") == said
    assert "must map words" in caplog.text and "'Bad' is not used" in caplog.text
    assert "Cannot read lexicon_file" in caplog.text
