"""A sentence as an English-only voice (Piper, hibari) should be given it: nothing to spell.

English phonemizers read what they do not know letter by letter or symbol by symbol: "kWh" is
"K W H", "Dr." ends a sentence, a Chinese name is "Chinese letter". :func:`for_english_voice`
rewrites, in this order:

- Chinese characters as toneless pinyin (pypinyin), a name's surname apart from its given name:
  "王小明" -> "Wang Xiaoming"; CJK punctuation as its ASCII counterpart;
- abbreviations as words: titles before a name ("Dr. Miller" -> "Doctor Miller", "St. Mary's"
  -> "Saint Mary's"), street types after one ("Baker St." -> "Baker Street"), and "approx.",
  "e.g.", "i.e.", "vs.", "etc.", "Fig.", "No. 5", ...; a dot that ended the text stays;
- short weekday names before a date or a time ("Mon 12/24" -> "Monday December twenty-fourth");
- every number, unit, amount, date and time (:func:`tts_bridge.text.normalize.normalize`, read in
  English);
- a unit without a number ("per kWh" -> "per kilowatt hour", "°C" -> "degrees Celsius"), and a
  slash between words ("heat/cool" -> "heat or cool").

URLs and e-mail addresses are left exactly as written. Words, names and model numbers stay words
("RTX 3090" -> "RTX thirty ninety").
"""

from __future__ import annotations

import re
from typing import Final

from tts_bridge.text.normalize import DateOrder, normalize

_HAN_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_CJK_PUNCTUATION: Final = {
    "，": ", ",
    "。": ". ",
    "！": "! ",
    "？": "? ",
    "：": ": ",
    "；": "; ",
    "、": ", ",
    "（": " (",
    "）": ") ",
    "“": '"',
    "”": '"',
    "「": '"',
    "」": '"',
}
_URL = re.compile(r"(?:https?://|www\.)\S+|\b[\w.+-]+@[\w-]+\.[\w.-]+", re.IGNORECASE)
_SPACES = re.compile(r"[ ]{2,}")
_SPACE_BEFORE_MARK = re.compile(r" +(?=[,.!?;:])")

# Before a capitalized word (a name): the title; otherwise the second reading, if any.
_TITLES: Final = {
    "Dr": ("Doctor", "Drive"),
    "St": ("Saint", "Street"),
    "Mr": ("Mister", None),
    "Mrs": ("Missus", None),
    "Ms": ("Miz", None),
    "Prof": ("Professor", None),
    "Gen": ("General", None),
    "Capt": ("Captain", None),
    "Sgt": ("Sergeant", None),
    "Lt": ("Lieutenant", None),
    "Col": ("Colonel", None),
    "Rev": ("Reverend", None),
    "Mt": ("Mount", None),
    "Jr": ("Junior", "Junior"),
    "Sr": ("Senior", "Senior"),
}
# Street types after a capitalized word ("Oak Ave.").
_STREETS: Final = {"Ave": "Avenue", "Rd": "Road", "Blvd": "Boulevard", "Ln": "Lane"}
_WORDS: Final = {
    "approx.": "approximately",
    "e.g.": "for example",
    "i.e.": "that is",
    "vs.": "versus",
    "vs": "versus",
    "etc.": "et cetera",
    "incl.": "including",
    "Fig.": "figure",
    "fig.": "figure",
    "dept.": "department",
    "appt.": "appointment",
}
_TITLE_RE = re.compile(
    r"(?<![A-Za-z.])(?P<abbr>"
    + "|".join(sorted({*_TITLES, *_STREETS}, key=len, reverse=True))
    # "Dr. Miller", "St Mary's": British English writes titles without the dot.
    + r")(?P<dot>\.)?(?=\s|$|[,;:!?)])"
)
_WORD_RE = re.compile(
    r"(?<![A-Za-z.])(?:"
    + "|".join(re.escape(w) for w in sorted(_WORDS, key=len, reverse=True))
    + r")(?![A-Za-z])"
)
_NUMBER_ABBR = re.compile(r"\b(?:No|Nr|no|nr)\.\s?(?=[0-9])")
_WEEKDAYS: Final = {
    "Mon": "Monday",
    "Tue": "Tuesday",
    "Tues": "Tuesday",
    "Wed": "Wednesday",
    "Thu": "Thursday",
    "Thur": "Thursday",
    "Thurs": "Thursday",
    "Fri": "Friday",
    "Sat": "Saturday",
    "Sun": "Sunday",
}
_WEEKDAY_RE = re.compile(
    r"\b(?P<day>" + "|".join(sorted(_WEEKDAYS, key=len, reverse=True)) + r")\.?,?"
    r"(?=\s+(?:[0-9]|(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\b))"
)
# Units that English voices spell out even without a number; singular after these words.
_BARE_UNITS: Final = {
    "kWh": ("kilowatt hour", "kilowatt hours"),
    "MWh": ("megawatt hour", "megawatt hours"),
    "Wh": ("watt hour", "watt hours"),
    "kW": ("kilowatt", "kilowatts"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"),
    "ppm": ("part per million", "parts per million"),
    "°C": ("degree Celsius", "degrees Celsius"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "℃": ("degree Celsius", "degrees Celsius"),
}
_BARE_UNIT_RE = re.compile(
    r"(?P<slash>/\s?)?(?<![A-Za-z])(?P<unit>"
    + "|".join(re.escape(u) for u in sorted(_BARE_UNITS, key=len, reverse=True))
    + r")(?![A-Za-z])"
)
_SINGULAR_BEFORE = re.compile(r"\b(?i:per|a|an|each|every|one)\s+$")
_WORD_SLASH = re.compile(r"(?<=[A-Za-z])/(?=[A-Za-z])")


def _pinyin(run: str) -> str:
    from pypinyin import Style, lazy_pinyin

    syllables = [s.replace("v", "u") for s in lazy_pinyin(run, style=Style.NORMAL)]
    if not syllables:
        return run
    if len(syllables) <= 4:  # a name: "Wang Xiaoming", "Li Lei"
        head, rest = syllables[0], "".join(syllables[1:])
        return f"{head.capitalize()} {rest.capitalize()}".strip()
    return " ".join(syllables)


def _han_to_pinyin(text: str) -> str:
    for mark, ascii_mark in _CJK_PUNCTUATION.items():
        text = text.replace(mark, ascii_mark)

    def spoken(match: re.Match[str]) -> str:
        words = _pinyin(match[0])
        before = match.string[match.start() - 1] if match.start() else " "
        after = match.string[match.end()] if match.end() < len(match.string) else " "
        return ("" if before.isspace() else " ") + words + ("" if after.isspace() else " ")

    return _HAN_RUN.sub(spoken, text)


def _keeps_final_dot(match: re.Match[str], word: str, dotted: bool) -> str:
    """A dot that ended the text ended the sentence too: keep it after the word."""
    rest = match.string[match.end() :]
    return word + "." if dotted and not rest.strip(" \"')]") else word


def _expand_title(match: re.Match[str]) -> str:
    abbr, dotted = match["abbr"], match["dot"] is not None
    text, end = match.string, match.end()
    next_is_name = re.match(r"\s+[A-Z]", text[end:]) is not None
    previous_is_name = re.search(r"[A-Z][a-z]+\s+$|[0-9]\s+[A-Z][a-z]+\s+$", text[: match.start()])
    if abbr in _STREETS:
        if not (previous_is_name or dotted):
            return match[0]
        return _keeps_final_dot(match, _STREETS[abbr], dotted)
    title, street = _TITLES[abbr]
    if not dotted and not next_is_name:
        return match[0]  # "St" or "Dr" alone, without a dot or a name: not ours to read
    word = title if next_is_name or street is None or not previous_is_name else street
    return _keeps_final_dot(match, word, dotted)


def _expand_word(match: re.Match[str]) -> str:
    return _keeps_final_dot(match, _WORDS[match[0]], match[0].endswith("."))


def _bare_unit(match: re.Match[str]) -> str:
    singular, plural = _BARE_UNITS[match["unit"]]
    if match["slash"]:
        return f" per {singular}"
    before = match.string[: match.start()]
    return singular if _SINGULAR_BEFORE.search(before) else plural


def _expand(text: str, date_order: DateOrder) -> str:
    text = _NUMBER_ABBR.sub("number ", text)
    text = _WEEKDAY_RE.sub(lambda m: _WEEKDAYS[m["day"]], text)
    text = _TITLE_RE.sub(_expand_title, text)
    text = _WORD_RE.sub(_expand_word, text)
    text = normalize(text, "en", date_order=date_order)
    text = _BARE_UNIT_RE.sub(_bare_unit, text)
    return _WORD_SLASH.sub(" or ", text)


def for_english_voice(text: str, *, date_order: DateOrder = "dmy") -> str:
    """``text`` with nothing an English phonemizer would spell out or stop at (see the module).

    Text that needs none of this is returned unchanged (the same string).
    """
    latin = text
    if _HAN_RUN.search(text) or any(mark in text for mark in _CJK_PUNCTUATION):
        latin = _han_to_pinyin(text)
    pieces: list[str] = []
    pos = 0
    for url in _URL.finditer(latin):
        pieces.append(_expand(latin[pos : url.start()], date_order))
        pieces.append(url[0])
        pos = url.end()
    pieces.append(_expand(latin[pos:], date_order))
    spoken = "".join(pieces)
    if spoken == text:
        return text
    return _SPACE_BEFORE_MARK.sub("", _SPACES.sub(" ", spoken)).strip()
