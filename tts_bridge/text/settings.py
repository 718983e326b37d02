"""The text room's settings: pronunciations (the lexicon)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from tts_bridge.settings_base import Section


class LexiconWord(Section):
    """What a word is said as (lexicon.<word>); a plain string stands for `say`."""

    say: str = Field(min_length=1, max_length=200)
    """A respelling every engine reads ("win" for Nguyen)."""
    phonemes: str | None = Field(None, min_length=1, max_length=200)
    """Phonemes for engines that take them (Piper: espeak-ng IPA); others say `say`."""


def _plain_respellings(value: object) -> object:
    if isinstance(value, dict):
        return {k: {"say": v} if isinstance(v, str) else v for k, v in value.items()}
    return value


def _check_words(lexicon: dict[str, LexiconWord]) -> dict[str, LexiconWord]:
    for word in lexicon:
        if not any(c.isalnum() for c in word) or len(word) > 64:
            # Starts with the entry, not a word: the error is then reported at "lexicon".
            raise ValueError(f"{word[:70]!r} must be 1-64 characters with a letter")
    return lexicon


Lexicon = Annotated[
    dict[str, LexiconWord], BeforeValidator(_plain_respellings), AfterValidator(_check_words)
]
"""Pronunciations shared by every voice: word or phrase -> what to say (a string or a
LexiconWord)."""
