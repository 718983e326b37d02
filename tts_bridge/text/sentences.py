"""Clean user text and split it into sentences (English and Chinese punctuation)."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence

# Sentence ends: ASCII . ! ? ; followed by space/end, CJK full stops (no space needed), ellipsis.
_SENTENCE_END = re.compile(
    r"""(?<=[.!?…])["'”’)\]]*\s+(?=\S)   # Latin end punctuation, then whitespace
      | (?<=[。！？；…])["'”’」』）]*      # CJK end punctuation needs no space after it
    """,
    re.VERBOSE,
)
# Words written with a dot that do not end a sentence: titles, street types, "approx.", months.
_ABBREVIATIONS = frozenset(
    {
        *("mr", "mrs", "ms", "dr", "prof", "gen", "capt", "sgt", "lt", "col", "rev", "mt"),
        *("st", "ave", "rd", "blvd", "ln", "jr", "sr"),
        *("no", "nr", "vs", "etc", "approx", "incl", "min", "max", "fig", "figs", "dept"),
        *("appt", "tel", "ext", "ca", "cf", "al", "esp", "est"),
        *("jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"),
    }
)
# Letters with dots: "U.S.", "e.g.", "p.m."; only a.m. and p.m. may end a sentence (before a
# capital: "We leave at 7 p.m. Dinner is at 8.").
_INITIALISM = re.compile(r"(?:[a-z]\.)+[a-z]")
_CLOCK_PERIODS = frozenset({"a.m", "p.m"})
_WHITESPACE = re.compile(r"\s+")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# Categories that carry something a voice can say: letters and digits.
_SPEAKABLE_CATEGORIES = ("L", "N")
# ChatTTS's control tags (pauses, laughter, the refine levels, speed) as a request may write them.
_CHATTTS_TAG = re.compile(r"\[(?:uv_break|v_break|lbreak|laugh|(?:speed|oral|laugh|break)_\d+)\]")
_SPACE_BEFORE_MARK = re.compile(r"\s+(?=[,.!?;:…，。！？；：])")


def clean(text: str) -> str:
    """Drop control and format characters (line breaks become spaces); collapse whitespace."""
    cleaner = StreamCleaner()
    return cleaner.feed(text) + cleaner.finish()


class StreamCleaner:
    """`clean` over text that arrives in pieces (a Wyoming stream), each character once.

    `feed` returns the cleaned text a piece adds. A run of whitespace is held back until
    something follows it (trailing whitespace never comes out), and so is a piece's last
    character with its combining marks, which the next piece may compose with (NFC: "e" then
    a combining accent).
    """

    def __init__(self) -> None:
        self._held = ""
        self._space = False
        self._started = False

    def feed(self, text: str) -> str:
        if not text:
            return ""
        normalized = unicodedata.normalize("NFC", self._held + text)
        # Held: the last starter and the combining marks after it (bounded: a stream of
        # marks alone must not be normalized again with every piece).
        cut = len(normalized) - 1
        while cut > 0 and unicodedata.combining(normalized[cut]) and len(normalized) - cut < 32:
            cut -= 1
        self._held = normalized[cut:]
        return self._clean(normalized[:cut])

    def finish(self) -> str:
        """The rest, once the text is complete."""
        rest, self._held = self._held, ""
        return self._clean(rest)

    def _clean(self, text: str) -> str:
        kept: list[str] = []
        for char in text:
            category = unicodedata.category(char)
            if char in "\n\r\t" or category == "Zs":
                self._space = self._started
            elif category[0] == "C":  # Cc control, Cf format (zero-width etc.), Co, Cs, Cn
                continue
            elif char.isspace():  # line and paragraph separators
                self._space = self._started
            else:
                if self._space:
                    kept.append(" ")
                    self._space = False
                kept.append(char)
                self._started = True
        return "".join(kept)


def has_cjk(text: str) -> bool:
    """True when the text contains Chinese characters (CJK unified ideographs)."""
    return _CJK.search(text) is not None


def drop_chattts_tags(text: str) -> str:
    """``text`` without ChatTTS's control tags: they mean something to ChatTTS only, and any
    other voice reads them out ("uv break"), as the fast tier does when a ChatTTS voice's
    request is routed there."""
    if "[" not in text:
        return text
    dropped = _WHITESPACE.sub(" ", _CHATTTS_TAG.sub(" ", text)).strip()
    return _SPACE_BEFORE_MARK.sub("", dropped)


def is_speakable(text: str) -> bool:
    """True when the text has at least one letter or digit (emoji and punctuation are not)."""
    return any(unicodedata.category(c)[0] in _SPEAKABLE_CATEGORIES for c in text)


def _ends_sentence(text: str, end: int, next_start: int) -> bool:
    """False after an abbreviation ("Dr. Smith", "Prof. Lee"), a single initial ("J. Smith") or
    letters with dots ("the U.S. grid", "at 7 p.m. tomorrow")."""
    if text[end - 1] != ".":
        return True
    start = text.rfind(" ", 0, end - 1) + 1
    word = text[start : end - 1].lstrip("(\"'“‘").lower()
    if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        return False
    if _INITIALISM.fullmatch(word):
        return word in _CLOCK_PERIODS and text[next_start : next_start + 1].isupper()
    return True


def split_sentences(text: str) -> list[str]:
    """Split cleaned text into sentences; each keeps its end punctuation."""
    out: list[str] = []
    cut = 0
    for match in _SENTENCE_END.finditer(text):
        if match.start() <= cut or not _ends_sentence(text, match.start(), match.end()):
            continue
        piece = text[cut : match.end()].strip()
        if piece:
            out.append(piece)
        cut = match.end()
    tail = text[cut:].strip()
    if tail:
        out.append(tail)
    # A fragment with nothing speakable (a stray "!") joins its predecessor.
    merged: list[str] = []
    for piece in out:
        if merged and not is_speakable(piece):
            merged[-1] = f"{merged[-1]}{piece}"
        else:
            merged.append(piece)
    return merged


# Clause ends: a comma or semicolon before whitespace (not "1,000"), Chinese 、，； without.
_CLAUSE_END = re.compile(r"(?<=[,;])[\"'”’)\]]*\s+(?=\S)|(?<=[、，；])[\"'”’」』）]*")
CLAUSE_MIN_UNITS = 30
"""The shortest clause rendered on its own (in `speech_units`: ten Chinese characters, five or
six English words): a shorter one joins the next, since a voice says a few words alone with the
prosody of a whole sentence (Kokoro misreads the tones of a short clause's first words)."""
CLAUSE_SPLIT_UNITS = 80
"""Sentences shorter than this (in `speech_units`) are rendered whole."""


def speech_units(text: str) -> int:
    """About how long `text` takes to say, in Latin characters: a Chinese character is a
    syllable, about three letters."""
    return len(text) + 2 * len(_CJK.findall(text))


def split_clauses(
    sentence: str, *, split_units: int = CLAUSE_SPLIT_UNITS, min_units: int = CLAUSE_MIN_UNITS
) -> list[str]:
    """A long sentence cut after its commas and semicolons (English and Chinese 、，；), each
    clause keeping its punctuation, short clauses joined to the next (and a short last one to
    the one before); a sentence under `split_units` stays whole. Joined with single spaces
    after Latin clauses, the clauses are the sentence again."""
    if speech_units(sentence) < split_units:
        return [sentence]
    pieces: list[str] = []
    cut = 0
    for match in _CLAUSE_END.finditer(sentence):
        if match.end() > cut:
            pieces.append(sentence[cut : match.end()].strip())
            cut = match.end()
    pieces.append(sentence[cut:].strip())
    clauses: list[str] = []
    for piece in filter(None, pieces):
        if clauses and speech_units(clauses[-1]) < min_units:
            clauses[-1] = _join(clauses[-1], piece)
        else:
            clauses.append(piece)
    if len(clauses) > 1 and speech_units(clauses[-1]) < min_units:
        last = clauses.pop()
        clauses[-1] = _join(clauses[-1], last)
    if not all(is_speakable(c) for c in clauses):
        return [sentence]
    return clauses


def join_clauses(clauses: Sequence[str]) -> str:
    """Clauses of one sentence (from `split_clauses`) as one text again."""
    return functools.reduce(_join, clauses)


def _join(first: str, second: str) -> str:
    return (
        first + second if _CJK.search(first[-1:]) or first[-1:] in "、，；" else f"{first} {second}"
    )
