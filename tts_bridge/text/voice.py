"""What a voice's phonemizer is given: the sentence made ready by the engine's front end.

An engine declares its ``front_end`` (``tts_bridge.engines.base.FrontEnd``): "english" (an
English-only phonemizer: numbers, abbreviations, units and Chinese names as English words),
"numbers" (numbers spelled out in the language each is written in: ChatTTS, Kokoro's Chinese),
a language code whose front end is registered (``tts_bridge.text.language``: a Piper voice of
that language), or "none" (the phonemizer reads the text itself, as espeak does for a Piper
voice of a language without a front end). The result is also the sentence of its cache key.
"""

from __future__ import annotations

from tts_bridge.text import language
from tts_bridge.text.english import for_english_voice
from tts_bridge.text.normalize import normalize
from tts_bridge.text.numbers import DateOrder


def for_voice(front_end: str, sentence: str, *, date_order: DateOrder = "dmy") -> str:
    """``sentence`` as an engine of ``front_end`` is given it."""
    if front_end == "english":
        return for_english_voice(sentence, date_order=date_order)
    if front_end == "numbers":
        return normalize(sentence, date_order=date_order)
    found = language.get(front_end)
    if found is None:  # "none", or a language whose front end is gone
        return sentence
    return found.for_voice(sentence, date_order=date_order)


def front_end_of(languages: frozenset[str]) -> str:
    """The front end of a voice that speaks ``languages`` (its engine's own, such as a Piper
    voice's config): English voices get "english", a voice of one language with a registered
    front end that language's code, any other "none" (its phonemizer's own reading)."""
    if languages == {"en"}:
        return "english"
    if len(languages) == 1:
        (code,) = languages
        if language.get(code) is not None:
            return code
    return "none"
