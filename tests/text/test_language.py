"""Languages as modules: the registry, the built-in English and Mandarin front ends, and how a
language is added (a German front end registered by this test only: in the bridge it would be
tts_bridge/text/languages/german.py plus its line in language.BUILT_IN)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from num2words import num2words

from tts_bridge.engines import piper
from tts_bridge.system.threads import OnnxSessionPlan
from tts_bridge.text import language
from tts_bridge.text.english import for_english_voice
from tts_bridge.text.languages.english import EnglishNumbers
from tts_bridge.text.normalize import detect_language, normalize
from tts_bridge.text.numbers import DateOrder
from tts_bridge.text.voice import for_voice


class GermanNumbers(EnglishNumbers):
    """A stub: German integers, everything else as English reads it."""

    to = " bis "

    def number(self, number: str) -> str:
        return str(num2words(int(number.replace(",", "")), lang="de"))


class German:
    code = "de"
    names = frozenset({"de", "german", "deutsch"})
    numbers = GermanNumbers()

    @staticmethod
    def detect(text: str) -> int:
        return 0  # the stub never claims a text whose language is not given

    @staticmethod
    def for_voice(text: str, *, date_order: DateOrder) -> str:
        return normalize(text, "de", date_order=date_order)


@pytest.fixture
def german() -> Iterator[German]:
    front_end = German()
    language.register(front_end)
    try:
        yield front_end
    finally:
        language.unregister("de")


def _piper_voice(tmp_path: Path, code: str) -> piper.PiperEngine:
    """A Piper voice whose config names ``code`` (the model is never loaded)."""
    config = json.loads(Path(f"{piper.bundled_model()}.json").read_text(encoding="utf-8"))
    config["language"] = {"code": f"{code}_XX"}
    model = tmp_path / f"{code}.onnx"
    model.write_bytes(b"")
    Path(f"{model}.json").write_text(json.dumps(config), encoding="utf-8")
    return piper.PiperEngine(model, "0" * 64, OnnxSessionPlan(intra_op_threads=1))


def test_english_and_mandarin_come_with_the_bridge() -> None:
    assert [f.code for f in language.front_ends()] == ["en", "zh"]
    assert language.resolve("zh-CN") is language.get("zh")
    assert language.resolve("English") is language.get("en")
    assert language.resolve("auto") is None and language.resolve(None) is None
    assert language.detect("今天天气很好 ok").code == "zh"
    assert language.detect("the weather 很").code == "en"


def test_a_registered_language_reads_numbers(german: German) -> None:
    assert normalize("Es sind 21 Grad.", "de") == "Es sind einundzwanzig Grad."
    assert normalize("Es sind 21 Grad.", "de-DE") == "Es sind einundzwanzig Grad."
    assert normalize("von 10-15 Uhr", "german") == "von zehn bis fünfzehn Uhr"
    # A number touching a CJK character is still read in Chinese.
    assert normalize("温度21度", "de") == normalize("温度21度", "zh") == "温度二十一度"
    # Detection is the languages' own count: the stub claims nothing.
    assert detect_language("Es sind 21 Grad") == "en"
    assert detect_language("二十一度") == "zh"


def test_without_its_module_a_language_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported language 'de': expected 'en', 'zh'"):
        normalize("Es sind 21 Grad.", "de")


def test_a_piper_voice_gets_its_languages_front_end(german: German, tmp_path: Path) -> None:
    voice = _piper_voice(tmp_path, "de")
    assert voice.languages == {"de"} and voice.front_end == "de"
    assert for_voice(voice.front_end, "Es sind 21 Grad.") == "Es sind einundzwanzig Grad."
    language.unregister("de")
    # Without a front end the voice keeps espeak's own reading: the text as written.
    assert voice.front_end == "none"
    assert for_voice("de", "Es sind 21 Grad.") == "Es sind 21 Grad."


def test_what_each_voice_is_given(tmp_path: Path) -> None:
    sentence = "Dr. Miller kommt um 7:30."
    assert _piper_voice(tmp_path, "en").front_end == "english"
    assert for_voice("english", sentence) == for_english_voice(sentence)
    assert _piper_voice(tmp_path, "zh").front_end == "zh"
    assert for_voice("zh", "明天7:30开会") == "明天七点三十分开会"
    assert for_voice("numbers", "at 7:30") == normalize("at 7:30") == "at seven thirty"
    assert for_voice("none", sentence) == sentence
    assert for_voice("english", "1/12", date_order="mdy") == "January twelfth"
