"""A pronunciation lexicon: words and phrases rewritten to what a voice should say.

Entries are whole words or phrases ("Nguyen" -> "win", "St Albans" -> "saint albans"), matched
case-insensitively, except an entry written in capitals ("US", "NASA"), which matches only as
written (so "us" stays a word). Where entries overlap, the longest wins. An entry may carry
phonemes for engines that take them (Piper reads ``[[ ... ]]`` as phonemes); the respelling is
what every other engine gets.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

MAX_WORD_CHARS = 64
MAX_SAY_CHARS = 200


class LexiconError(ValueError):
    """An entry that cannot be used (the message says why)."""


@dataclass(frozen=True)
class Entry:
    word: str
    say: str
    phonemes: str | None = None

    @property
    def key(self) -> str:
        return key_of(self.word)

    @property
    def exact_case(self) -> bool:
        """Written in capitals (an acronym): matched only as written."""
        letters = [c for c in self.word if c.isalpha()]
        return len(letters) >= 2 and all(c.isupper() for c in letters)


def key_of(word: str) -> str:
    """How entries are told apart: case and spacing do not make another entry."""
    return " ".join(word.split()).casefold()


def _plain(value: str, what: str, limit: int) -> str:
    value = " ".join(value.split())
    if not value:
        raise LexiconError(f"{what} is empty")
    if len(value) > limit:
        raise LexiconError(f"{what} has {len(value)} characters; the limit is {limit}")
    if any(unicodedata.category(c)[0] == "C" for c in value):
        raise LexiconError(f"{what} has control characters")
    return value


def make_entry(word: str, say: str, phonemes: str | None = None) -> Entry:
    """A checked entry; raises LexiconError."""
    word = _plain(word, "the word", MAX_WORD_CHARS)
    if not any(c.isalnum() for c in word):
        raise LexiconError(f"the word {word!r} has no letters or digits")
    say = _plain(say, "what to say", MAX_SAY_CHARS)
    if "[[" in say or "]]" in say:
        raise LexiconError("give phonemes as 'phonemes', not inside what to say")
    if phonemes is not None:
        phonemes = _plain(phonemes, "the phonemes", MAX_SAY_CHARS)
        if "[" in phonemes or "]" in phonemes:
            raise LexiconError("the phonemes must not contain brackets")
    return Entry(word, say, phonemes)


class Lexicon:
    """A fixed set of entries, compiled once; `apply` is safe from any thread."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.entries: dict[str, Entry] = {}
        for entry in entries:
            self.entries[entry.key] = entry
        self._exact = {e.word: e for e in self.entries.values() if e.exact_case}
        self._pattern = self._compile()

    def _compile(self) -> re.Pattern[str] | None:
        if not self.entries:
            return None
        # Longest first: the regex takes the first alternative that matches at a position.
        ordered = sorted(self.entries.values(), key=lambda e: len(e.word), reverse=True)
        alternatives = []
        for entry in ordered:
            words = [re.escape(w) for w in entry.word.split()]
            body = r"\s+".join(words)
            alternatives.append(f"(?-i:{body})" if entry.exact_case else body)
        # Whole words: no letter or digit right before or after.
        return re.compile(rf"(?<![^\W_])(?:{'|'.join(alternatives)})(?![^\W_])", re.IGNORECASE)

    def apply(self, text: str, *, phonemes: bool = False) -> str:
        """`text` with every entry's word replaced by its respelling (or, with `phonemes`, by
        ``[[ phonemes ]]`` for the entries that have them)."""
        if self._pattern is None:
            return text

        def replace(match: re.Match[str]) -> str:
            found = match.group(0)
            entry = self._exact.get(" ".join(found.split())) or self.entries.get(key_of(found))
            if entry is None:  # an acronym entry's letters in another case
                return found
            if phonemes and entry.phonemes:
                return f"[[ {entry.phonemes} ]]"
            return entry.say

        return self._pattern.sub(replace, text)
