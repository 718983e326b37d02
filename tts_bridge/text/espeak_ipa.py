"""English text to Kokoro's English phonemes through espeak-ng (shipped with Piper).

Kokoro was trained on misaki's phonemes, which write diphthongs and affricates as one symbol
(A = eɪ, I = aɪ, O = oʊ, ʤ, ʧ) and flap t as T; espeak-ng writes IPA. The table converts one
into the other (misaki's own EspeakFallback table, without tie bars: Piper's espeak bridge
writes diphthongs as two plain letters).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

_ESPEAK_TO_KOKORO = (
    ("aɪ", "I"),
    ("aʊ", "W"),
    ("dʒ", "ʤ"),
    ("eɪ", "A"),
    ("tʃ", "ʧ"),
    ("ɔɪ", "Y"),
    ("oʊ", "O"),
    ("ɜː", "ɜɹ"),
    ("ɚ", "əɹ"),
    ("ɐ", "ə"),
    ("r", "ɹ"),
    ("x", "k"),
    ("ç", "k"),
    ("ɾ", "T"),
    ("ʔ", "t"),
    ("ː", ""),
)
"""Longest first."""


def to_kokoro(ipa: str) -> str:
    """espeak-ng's US English IPA in Kokoro's symbols."""
    for old, new in _ESPEAK_TO_KOKORO:
        ipa = ipa.replace(old, new)
    return ipa


@functools.lru_cache(maxsize=1)
def _phonemizer() -> Callable[[str], list[list[str]]]:
    from piper.phonemize_espeak import EspeakPhonemizer

    espeak = EspeakPhonemizer()
    return lambda text: list(espeak.phonemize("en-us", text))


def english(text: str) -> str:
    """English text (a word or sentences, punctuation kept) as Kokoro phonemes."""
    sentences = _phonemizer()(text)
    return " ".join(to_kokoro("".join(s)).strip() for s in sentences if s).strip()
