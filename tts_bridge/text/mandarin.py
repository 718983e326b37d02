"""Mandarin text to the phonemes Kokoro speaks: the bridge's Chinese normalization, word
segmentation (jieba), pinyin (pypinyin) with the tone changes of 一 and 不, then misaki's
pinyin-to-IPA table; Latin words inside a Chinese sentence are read in English.

misaki's own Chinese front end (v1.0) reads numbers with cn2an, which says "7:30" as 七:三十,
applies no tone sandhi to 一 and 不, and passes Latin letters through as raw symbols that the
model mumbles or skips; each of those is handled here before misaki sees the text.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

from tts_bridge.text import espeak_ipa
from tts_bridge.text.normalize import normalize

_LOGGER = logging.getLogger(__name__)

_HAN_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_LATIN_WORD = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)*")
_DIGITS = "零一二三四五六七八九"
_NUMERALS = frozenset("零〇一二两三四五六七八九十")
"""Characters around 一 that make it a digit of a number (十一, 一二三, 一点五): read yi1."""
_ENDS = frozenset("，。！？；：、,.!?;:…—\"'“”（）() ")

# English letter names as Kokoro's English phonemes (misaki's conventions: A = eɪ, I = aɪ,
# O = oʊ), for acronyms: "ABC", "PM", "TV".
_LETTERS = {
    "a": "ˈA",
    "b": "bˈi",
    "c": "sˈi",
    "d": "dˈi",
    "e": "ˈi",
    "f": "ˈɛf",
    "g": "ʤˈi",
    "h": "ˈAʧ",
    "i": "ˈI",
    "j": "ʤˈA",
    "k": "kˈA",
    "l": "ˈɛl",
    "m": "ˈɛm",
    "n": "ˈɛn",
    "o": "ˈO",
    "p": "pˈi",
    "q": "kjˈu",
    "r": "ˈɑɹ",
    "s": "ˈɛs",
    "t": "tˈi",
    "u": "jˈu",
    "v": "vˈi",
    "w": "dˈʌbᵊljˌu",
    "x": "ˈɛks",
    "y": "wˈI",
    "z": "zˈi",
}

EnglishPhonemizer = Callable[[str], str]
"""An English word to Kokoro phonemes."""


def sandhi(chars: str, tones: list[str]) -> list[str]:
    """The pinyin ``tones`` (TONE3 syllables, one per character of ``chars``) with the tone
    changes of 一 and 不 applied.

    不 before a fourth tone is bu2 (不是 búshì); 一 is yi2 before a fourth tone, yi4 before
    the others (一个 yígè, 一天 yìtiān), yi5 between a repeated verb (看一看), and keeps yi1
    where it is a digit: in a number (十一, 二十一点五, 一二三), after 第, at a phrase's end.
    """
    out = list(tones)
    for i, char in enumerate(chars):
        if char not in "一不":
            continue
        before = chars[i - 1] if i > 0 else ""
        after = chars[i + 1] if i + 1 < len(chars) else ""
        next_tone = out[i + 1][-1] if i + 1 < len(out) and out[i + 1][-1:].isdigit() else ""
        if char == "不":
            out[i] = "bu2" if next_tone == "4" else "bu4"
            continue
        after_next = chars[i + 2] if i + 2 < len(chars) else ""
        if (
            not after
            or after in _ENDS
            or before in _NUMERALS
            or before == "第"
            or after in _NUMERALS
            or (after == "点" and after_next in _NUMERALS)
        ):
            out[i] = "yi1"
        elif before and before == after:
            out[i] = "yi5"
        elif next_tone == "4":
            out[i] = "yi2"
        elif next_tone:
            out[i] = "yi4"
    return out


@functools.lru_cache(maxsize=1)
def _segmenter() -> Callable[[str], list[str]]:
    import jieba

    # jieba logs its dictionary build at DEBUG through a handler of its own, on every start.
    jieba.setLogLevel(logging.WARNING)
    return lambda text: [str(w) for w in jieba.lcut(text, cut_all=False) if w]


def _pinyin(text: str) -> list[list[str]]:
    """Words of a run of Chinese characters, each as its TONE3 syllables after sandhi."""
    from pypinyin import Style, lazy_pinyin

    words = _segmenter()(text)
    syllables: list[str] = []
    for word in words:
        syllables.extend(lazy_pinyin(word, style=Style.TONE3, neutral_tone_with_five=True))
    # One syllable per character, else the tones are left alone.
    changed = sandhi(text, syllables) if len(syllables) == len(text) else syllables
    out: list[list[str]] = []
    start = 0
    for word in words:
        out.append(changed[start : start + len(word)])
        start += len(word)
    return out


def _syllable_ipa(syllable: str) -> str:
    from misaki.zh import ZHG2P

    try:
        # The non-syllabic mark (U+032F) of the diphthongs is not in Kokoro's vocabulary.
        return str(ZHG2P.py2ipa(syllable)).replace("\u032f", "")
    except (AssertionError, ValueError, KeyError, IndexError):
        # pypinyin leaves characters without a reading as they are; the model has no sound for
        # them, so they are skipped (logged, not silent).
        _LOGGER.debug("No IPA for syllable %r", syllable)
        return ""


def spell(word: str) -> str:
    """An acronym letter by letter, as English letter names."""
    return " ".join(_LETTERS[c] for c in word.lower() if c in _LETTERS)


def latin_word(word: str, english: EnglishPhonemizer | None = None) -> str:
    """A Latin word inside Chinese text: acronyms (all capitals, or two letters at most) are
    spelled, other words read by the English phonemizer (espeak-ng, shipped with Piper)."""
    letters = word.replace("'", "").replace("’", "")
    if len(letters) <= 2 or letters.isupper():
        return spell(letters)
    reader = english or espeak_ipa.english
    try:
        phonemes = reader(word)
    except Exception:  # espeak unavailable: spelling the word still says it
        _LOGGER.warning(
            "English reading of a word (%d letters) failed; spelling it",
            len(letters),
            exc_info=True,
        )
        _LOGGER.debug("The word spelled: %r", word)
        phonemes = ""
    return phonemes or spell(letters)


def _punctuation(text: str) -> str:
    from misaki.zh import ZHG2P

    return str(ZHG2P.map_punctuation(text))


def to_phonemes(text: str, english: EnglishPhonemizer | None = None) -> str:
    """A Chinese sentence as Kokoro phonemes (IPA with tone arrows)."""
    text = _punctuation(normalize(text, "zh"))
    parts: list[str] = []
    pos = 0
    pattern = re.compile(f"{_HAN_RUN.pattern}|{_LATIN_WORD.pattern}")
    for match in pattern.finditer(text):
        parts.append(_other(text[pos : match.start()]))
        chunk = match.group()
        if _HAN_RUN.fullmatch(chunk):
            words = ["".join(_syllable_ipa(s) for s in word) for word in _pinyin(chunk)]
            parts.append(" ".join(w for w in words if w))
        else:
            parts.append(f" {latin_word(chunk, english)} ")
        pos = match.end()
    parts.append(_other(text[pos:]))
    return re.sub(r" {2,}", " ", "".join(parts)).strip()


def _other(text: str) -> str:
    """Text between words: punctuation the model knows stays, digits left over by the
    normalization are read one by one, anything else becomes a word break."""
    out = []
    for char in text:
        if char.isdigit() and char.isascii():
            digit = _DIGITS[int(char)]
            out.append(" " + "".join(_syllable_ipa(s) for w in _pinyin(digit) for s in w) + " ")
        elif char in ',.!?;:—…"()“”':
            out.append(char)
        else:
            out.append(" ")
    return "".join(out)
