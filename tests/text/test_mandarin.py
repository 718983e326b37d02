"""The Chinese front end of the kokoro voices: the bridge's normalization first, the tone
changes of 一 and 不, Latin words read rather than dropped."""

from __future__ import annotations

import pytest

from tts_bridge.text import mandarin


def _ipa(syllables: str) -> str:
    """Kokoro phonemes of space-separated TONE3 syllables, as one word."""
    return "".join(mandarin._syllable_ipa(s) for s in syllables.split())


@pytest.mark.parametrize(
    ("chars", "tones", "expected"),
    [
        ("不是", "bu4 shi4", "bu2 shi4"),
        ("不好", "bu4 hao3", "bu4 hao3"),
        ("一个", "yi1 ge4", "yi2 ge4"),
        ("一天", "yi1 tian1", "yi4 tian1"),
        ("一百", "yi1 bai3", "yi4 bai3"),
        ("看一看", "kan4 yi1 kan4", "kan4 yi5 kan4"),
        ("第一", "di4 yi1", "di4 yi1"),
        ("十一点", "shi2 yi1 dian3", "shi2 yi1 dian3"),
        ("二十一点五", "er4 shi2 yi1 dian3 wu3", "er4 shi2 yi1 dian3 wu3"),
        ("一点五", "yi1 dian3 wu3", "yi1 dian3 wu3"),
        ("一三八", "yi1 san1 ba1", "yi1 san1 ba1"),
        ("统一", "tong3 yi1", "tong3 yi1"),
    ],
)
def test_tone_sandhi_of_yi_and_bu(chars: str, tones: str, expected: str) -> None:
    assert mandarin.sandhi(chars, tones.split()) == expected.split()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # Times: misaki alone reads 7:30 as 七:三十.
        ("明天早上7:30提醒我开会。", ["qi1 dian3", "san1 shi2 fen1"]),
        # Decimals: the 一 of 二十一点五 keeps its first tone.
        ("室温21.5度。", ["er4 shi2 yi1 dian3 wu3"]),
        ("湿度45%。", ["bai3 fen1 zhi1", "si4 shi2 wu3"]),
        ("电费是¥128.50。", ["yi4 bai3 er4 shi2 ba1 dian3 wu3", "yuan2"]),
        ("2024年3月15日", ["er4 ling2 er4 si4", "nian2", "shi2 wu3"]),
        # Phone numbers digit by digit.
        ("请拨打13812345678", ["yi1 san1 ba1 yi1 er4 san1 si4 wu3 liu4 qi1 ba1"]),
        ("不是一个人", ["bu2 shi4", "yi2 ge4"]),
    ],
)
def test_normalized_before_the_phonemes(text: str, words: list[str]) -> None:
    phonemes = mandarin.to_phonemes(text).replace(" ", "")
    for word in words:
        assert _ipa(word) in phonemes, (word, mandarin.to_phonemes(text))


def test_latin_words_are_read_never_dropped() -> None:
    heard: list[str] = []

    def english(word: str) -> str:
        heard.append(word)
        return "wˈIfI"

    phonemes = mandarin.to_phonemes("WiFi密码是ABC，打开PM2.5净化器。", english)
    assert heard == ["WiFi"]  # words go to the English phonemizer
    assert "wˈIfI" in phonemes
    assert mandarin.spell("ABC") in phonemes  # acronyms are spelled
    assert mandarin.spell("PM") in phonemes
    assert _ipa("er4 dian3 wu3") in phonemes.replace(" ", "")
    # A failing English reader still leaves the word spoken, letter by letter.

    def broken(word: str) -> str:
        raise RuntimeError("no espeak")

    assert mandarin.latin_word("Alexa", broken) == mandarin.spell("Alexa")


def test_english_words_through_espeak_use_kokoro_symbols() -> None:
    phonemes = mandarin.latin_word("hello")
    assert phonemes and "O" in phonemes  # espeak's oʊ is Kokoro's O
    assert "ː" not in phonemes


def test_every_symbol_is_in_the_model_vocabulary() -> None:
    import json

    from tts_bridge.engines.kokoro import voice_dir

    vocab = json.loads((voice_dir() / "vocab.json").read_text("utf-8"))["vocab"]
    text = "下午3点，请用iPhone打开WiFi，温度-5度，一会儿见！不要忘了《说明书》。"
    unknown = {c for c in mandarin.to_phonemes(text) if c not in vocab}
    assert unknown == set()
