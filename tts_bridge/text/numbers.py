"""The shared rules that find numbers, times, dates, units and amounts in a text, and the
reader each language gives them (:class:`NumberReader`).

Every rule is a pattern and a renderer; the renderer decides what was found (a date, a score,
a fraction, a code) and asks the reader of the language the number is read in for the words.
What is the same in every language lives here: the patterns, the unit and currency tables, the
checks for years, codes and leading zeros. What a language says lives in its module under
``tts_bridge/text/languages/`` (see :mod:`tts_bridge.text.language`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from tts_bridge.text.units import UNIT_ALT, Currency, Unit, currency_for, find_unit

DateOrder = Literal["dmy", "mdy"]
"""How a numeric date without a year-first form is read: "1/12" is 1 December (dmy) or
January 12th (mdy). The other order is taken when it is the only valid one ("12/24")."""

# Integers written without separators from this length on are codes or ids, not quantities.
_DIGIT_STRING_MIN_LEN = 5

_FULLWIDTH_DIGIT = re.compile(r"[０-９]")

MONTH_NAMES: Final = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
# Full names first so that "June" is not cut to "Jun".
MONTH_ALT = (
    "(?:January|February|March|April|May|June|July|August|September|October|November|December"
    "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)"
)

# A number: thousands groups of exactly three digits, or a plain digit run; optional decimals.
_NUMBER = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?"
# Money also takes a decimal comma with one or two digits ("3,50 €").
_MONEY_NUMBER = r"(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:[.,][0-9]{1,2}(?![0-9])|\.[0-9]+)?"
# A sign only at the start of a token: "a-5" and "10-5" are hyphens, "温度-5" is a sign.
_SIGN = r"(?<![0-9A-Za-z_.,])[-+−]"
# "am", "a.m.", "PM", "p. m."; the final dot is left in place when it may end the sentence.
_AMPM = r"(?P<ap>[AaPp])\.?\s?[Mm](?:\.(?=\s*[a-z,;]))?(?![A-Za-z])"


# Words after which a number is a code to read digit by digit, whatever language reads it.
_CODE_CONTEXTS: Final = (
    re.compile(
        r"\b(?:code|pin|passcode|password|otp|extension|ext\.?)\s*(?:is\s+|was\s+|[:#=]\s*)?$",
        re.IGNORECASE,
    ),
    re.compile(
        r"(?:验证码|密码|取件码|取货码|提货码|编号|工号|尾号|号码|电话|手机号?|房间号|门牌号|车牌号?)"
        r"\s*(?:是|为|[:：])?\s*$"
    ),
)
# A slash read as a fraction before these words ("3/4 of the tank").
_FRACTION_NEXT = re.compile(
    r"\s+(?:of|full|empty|cups?|tanks?|teaspoons?|tablespoons?)\b|\s?(?:满|的|杯|箱)"
)
_OUT_OF_NEXT = re.compile(r"\s*(?:stars?|points?|marks?)\b")
_DECADE_BEFORE = re.compile(r"\b(?i:the|early|mid|late|her|his|their|my|your|our)[ -]$")


class NumberReader(Protocol):
    """What one language says for what the rules found. Numbers arrive as written (ASCII
    digits, "1,250", "21.50"); every method returns words without a digit."""

    @property
    def pads_latin(self) -> bool:
        """Words glued to a Latin letter get a space ("CO2" -> "CO two")."""

    @property
    def to(self) -> str:
        """Between the ends of a range (" to ", "到")."""

    @property
    def plus(self) -> str:
        """Before an international phone number."""

    @property
    def dot(self) -> str:
        """Between the parts of an IP or version number."""

    @property
    def all_the_time(self) -> str:
        """ "24/7"."""

    def digits(self, digits: str) -> str:
        """Digit by digit: a code, a phone number."""

    def integer(self, digits: str) -> str:
        """An unsigned integer as a quantity."""

    def number(self, number: str) -> str:
        """An unsigned number such as "1,250" or "21.50"; every written decimal is read."""

    def sign_word(self, sign: str | None) -> str:
        """The word for "+" or "-" before a number (with its space), "" for none."""

    def date(self, year: int, month: int, day: int | None) -> str:
        """A valid date; ``day`` None: the month of a year."""

    def day_of_month(self, day: int, month: int) -> str:
        """A date without a year ("12/24")."""

    def fraction(self, numerator: int, denominator: int) -> str:
        """ "3/4 of"."""

    def out_of(self, score: int, total: int) -> str:
        """A score: "8/10"."""

    def time(
        self, hour: int, minute: int, second: int | None, ampm: str | None, before: str
    ) -> str:
        """A valid time of day; ``ampm`` "a", "p" or None; ``before`` the text before it."""

    def money(self, sign: str | None, amount: str, currency: Currency) -> str:
        """An amount with a decimal point (if any) and no thousands separators."""

    def month_day(self, month: str, day: int) -> str:
        """ "November 30" (``month`` as written)."""

    def day_month(self, day: int, before: str) -> str | None:
        """ "30 November": the words for "30" (the month stays); None to read it otherwise."""

    def ordinal(self, digits: str) -> str:
        """ "3rd"."""

    def hash_number(self, digits: str) -> str:
        """ "#3"."""

    def decade(self, digits: str) -> str:
        """ "1990s", "the 90s"."""

    def with_unit(self, sign: str | None, number: str, unit: Unit) -> str:
        """A quantity with a unit that is not money."""

    def unit_range(
        self, sign: str | None, first: str, sign2: str | None, second: str, unit: Unit
    ) -> str | None:
        """A range with a unit said otherwise than "first to second unit"; None: that way."""

    def said_as_digits(self, number: str, before: str) -> str | None:
        """A phone, emergency, room or model number as people say it, from the words before
        it; None for a quantity."""

    def special_number(self, number: str, before: str, text: str, end: int) -> str | None:
        """A bare integer the language reads otherwise than as a quantity (a year); None:
        as a quantity. ``text[end:]`` follows it."""

    def year_range(self, first: str, second: str, text: str, end: int) -> str | None:
        """Two years ("1990-1995"); None: read as a range of numbers."""


def has_leading_zero(number: str) -> bool:
    whole = number.partition(".")[0]
    return len(whole) > 1 and whole.startswith("0")


def _is_digit_string(number: str) -> bool:
    """A code or id rather than a quantity: leading zero, or a long run without separators."""
    if "." in number or "," in number:
        return False
    return has_leading_zero(number) or len(number) >= _DIGIT_STRING_MIN_LEN


def is_year(number: str) -> bool:
    return len(number) == 4 and number.isdigit() and 1000 <= int(number) <= 2999


def _signed(sign: str | None, number: str, reader: NumberReader) -> str:
    return reader.sign_word(sign) + reader.number(number)


# --- rules -------------------------------------------------------------------------------------

Render = Callable[[re.Match[str], NumberReader], str | None]
"""Spoken text for a match, or None when the match is not what the rule reads after all."""


def _render_intl_phone(match: re.Match[str], reader: NumberReader) -> str:
    groups = re.findall(r"[0-9]+", match[0])
    return reader.plus + " ".join(reader.digits(group) for group in groups)


def _render_digit_groups(match: re.Match[str], reader: NumberReader) -> str:
    return " ".join(reader.digits(group) for group in re.findall(r"[0-9]+", match[0]))


def _render_dotted(match: re.Match[str], reader: NumberReader) -> str:
    return reader.dot.join(reader.digits(group) for group in match[0].split("."))


def _date(year: int, month: int, day: int | None, reader: NumberReader) -> str | None:
    if not 1 <= month <= 12 or (day is not None and not 1 <= day <= 31):
        return None
    return reader.date(year, month, day)


def _render_date_ymd(match: re.Match[str], reader: NumberReader) -> str | None:
    return _date(int(match["y"]), int(match["m"]), int(match["d"]), reader)


def _day_month(first: int, second: int, order: DateOrder) -> tuple[int, int] | None:
    day, month = (first, second) if order == "dmy" else (second, first)
    if not (1 <= month <= 12 and 1 <= day <= 31):
        day, month = month, day
    return (day, month) if 1 <= month <= 12 and 1 <= day <= 31 else None


def _render_date_dmy(
    match: re.Match[str], reader: NumberReader, order: DateOrder = "dmy"
) -> str | None:
    found = _day_month(int(match["a"]), int(match["b"]), order)
    return None if found is None else _date(int(match["y"]), found[1], found[0], reader)


def _render_slash(
    match: re.Match[str], reader: NumberReader, order: DateOrder = "dmy"
) -> str | None:
    """ "12/24" is a date (in ``order``), "3/4 of" a fraction, "8/10" a score, "24/7" all the
    time; a slash is never read out."""
    first, second = int(match["a"]), int(match["b"])
    text, end = match.string, match.end()
    if (first, second) == (24, 7):
        return reader.all_the_time
    if 0 < first < second <= 10 and _FRACTION_NEXT.match(text, end):
        return reader.fraction(first, second)
    found = None if _OUT_OF_NEXT.match(text, end) else _day_month(first, second, order)
    if found is None:
        return reader.out_of(first, second)
    day, month = found
    return reader.day_of_month(day, month)


def _render_year_month(match: re.Match[str], reader: NumberReader) -> str | None:
    return _date(int(match["y"]), int(match["m"]), None, reader)


def _time(match: re.Match[str], reader: NumberReader, prefix: str = "") -> str | None:
    hour = int(match[prefix + "h"])
    minute = int(match[prefix + "mi"] or 0)
    second = int(match[prefix + "s"]) if match[prefix + "s"] else None
    ampm = match[prefix + "ap"].lower() if match[prefix + "ap"] else None
    if hour > 24 or (ampm and hour > 12):
        return None
    return reader.time(hour, minute, second, ampm, match.string[: match.start()])


def _render_time(match: re.Match[str], reader: NumberReader) -> str | None:
    return _time(match, reader)


def _render_time_range(match: re.Match[str], reader: NumberReader) -> str | None:
    start, end = _time(match, reader, "t1"), _time(match, reader, "t2")
    if start is None or end is None:
        return None
    return f"{start}{reader.to}{end}"


def _render_hour_ampm(match: re.Match[str], reader: NumberReader) -> str | None:
    if not 1 <= int(match["h"]) <= 12:
        return None
    return _time(match, reader)


def _render_money(match: re.Match[str], reader: NumberReader) -> str:
    return _money(match["sign"], match["num"], currency_for(match["cur"]), reader)


def _money(sign: str | None, amount: str, currency: Currency, reader: NumberReader) -> str:
    # A comma followed by one or two digits at the end is a decimal comma ("3,50 €").
    if re.search(r",[0-9]{1,2}$", amount) and "." not in amount:
        amount = amount.replace(",", ".")
    return reader.money(sign, amount.replace(",", ""), currency)


def _render_month_day(match: re.Match[str], reader: NumberReader) -> str | None:
    day = int(match["d"])
    if not 1 <= day <= 31:
        return None
    return reader.month_day(match["month"], day)


def _render_day_month(match: re.Match[str], reader: NumberReader) -> str | None:
    day = int(match["d"])
    if not 1 <= day <= 31:
        return None
    return reader.day_month(day, match.string[: match.start()])


def _render_ordinal(match: re.Match[str], reader: NumberReader) -> str:
    return reader.ordinal(match["num"])


def _render_hash_number(match: re.Match[str], reader: NumberReader) -> str:
    # ChatTTS drops "#", and "#3" is said "number three" / 三号 anyway.
    return reader.hash_number(match["num"])


def _render_decade(match: re.Match[str], reader: NumberReader) -> str | None:
    digits = match["num"]
    # "the 90s" is a decade, "wait 30s" thirty seconds.
    if len(digits) == 2 and not _DECADE_BEFORE.search(match.string, 0, match.start()):
        return None
    return reader.decade(digits)


def _render_quantity(match: re.Match[str], reader: NumberReader) -> str:
    sign, number, unit_text = match["sign"], match["num"], match["unit"]
    unit = find_unit(unit_text) if unit_text else None
    if match["num2"]:
        return _range(match, unit, reader)
    if unit is None:
        return _bare_number(match, reader)
    if unit.kind == "money":
        return _money(sign, number, currency_for(unit_text), reader)
    return reader.with_unit(sign, number, unit)


def _bare_number(match: re.Match[str], reader: NumberReader) -> str:
    sign, number = match["sign"], match["num"]
    text, start, end = match.string, match.start(), match.end()
    if not sign and "," not in number and "." not in number:
        before = text[max(0, start - 40) : start]
        if any(context.search(before) for context in _CODE_CONTEXTS):
            return reader.digits(number)
        said = reader.said_as_digits(number, before)
        if said is not None:
            return said
        special = reader.special_number(number, before, text, end)
        if special is not None:
            return special
    if _is_digit_string(number):
        return reader.sign_word(sign) + reader.digits(number)
    return _signed(sign, number, reader)


def _range(match: re.Match[str], unit: Unit | None, reader: NumberReader) -> str:
    sign, first, sign2, second = match["sign"], match["num"], match["sign2"], match["num2"]
    phone = unit is None and not sign and not sign2 and len(first) == 3 and len(second) == 4
    if phone or has_leading_zero(first) or has_leading_zero(second):  # "06-1234", "555-1234"
        return " ".join(
            reader.digits(n) if n.isdigit() else reader.number(n) for n in (first, second)
        )
    to = reader.to
    if unit is None:
        years = None
        if not (sign or sign2) and is_year(first) and is_year(second):
            years = reader.year_range(first, second, match.string, match.end())
        return years or _signed(sign, first, reader) + to + _signed(sign2, second, reader)
    if unit.kind == "money":
        currency = currency_for(match["unit"])
        return _signed(sign, first, reader) + to + _money(sign2, second, currency, reader)
    special = reader.unit_range(sign, first, sign2, second, unit)
    if special is not None:
        return special
    return _signed(sign, first, reader) + to + reader.with_unit(sign2, second, unit)


def _time_regex(prefix: str) -> str:
    return (
        rf"(?P<{prefix}h>[0-9]{{1,2}}):(?P<{prefix}mi>[0-5][0-9])"
        rf"(?::(?P<{prefix}s>[0-5][0-9]))?(?![0-9]|:[0-9])"
        rf"(?:\s?{_AMPM.replace('<ap>', f'<{prefix}ap>')})?"
    )


@dataclass(frozen=True)
class _Rule:
    name: str
    pattern: re.Pattern[str]
    render: Render


# Earlier rules win when two matches start at the same place; the last rule reads any number and
# never declines, so every digit is replaced.
_RULES: Final = (
    _Rule(
        "intl_phone",
        re.compile(r"(?<![0-9A-Za-z+])\+(?=[0-9](?:[ \-.]?[0-9]){6})[0-9]+(?:[ \-.]?[0-9]+)*"),
        _render_intl_phone,
    ),
    _Rule(
        "date_ymd",
        re.compile(
            r"(?<![0-9.])(?P<y>[0-9]{4})(?P<sep>[-/.])(?P<m>[0-9]{1,2})(?P=sep)(?P<d>[0-9]{1,2})"
            r"(?![0-9]|[-/.:][0-9])"
        ),
        _render_date_ymd,
    ),
    _Rule(
        "date_dmy",
        re.compile(
            r"(?<![0-9.])(?P<a>[0-9]{1,2})(?P<sep>[-/.])(?P<b>[0-9]{1,2})(?P=sep)(?P<y>[0-9]{4})"
            r"(?![0-9]|[-/.:][0-9])"
        ),
        _render_date_dmy,
    ),
    _Rule(
        "year_month",
        re.compile(r"(?<![0-9.])(?P<y>(?:19|20)[0-9]{2})-(?P<m>0[1-9]|1[0-2])(?![0-9]|[-.:][0-9])"),
        _render_year_month,
    ),
    _Rule(
        "time_range",
        re.compile(rf"(?<![0-9:.]){_time_regex('t1')}\s?[-–~～]\s?{_time_regex('t2')}"),
        _render_time_range,
    ),
    _Rule("time", re.compile(rf"(?<![0-9:.]){_time_regex('')}"), _render_time),
    _Rule(
        "time_dot_ampm",
        re.compile(rf"(?<![0-9.])(?P<h>[0-9]{{1,2}})\.(?P<mi>[0-5][0-9])(?P<s>)\s?{_AMPM}"),
        _render_time,
    ),
    _Rule(
        "hour_ampm",
        re.compile(rf"(?<![0-9.:,])(?P<h>[0-9]{{1,2}})(?P<mi>)(?P<s>)\s?{_AMPM}"),
        _render_hour_ampm,
    ),
    _Rule(
        "slash",
        re.compile(r"(?<![0-9/.,:])(?P<a>[0-9]{1,2})/(?P<b>[0-9]{1,2})(?![0-9]|[/.,:][0-9])"),
        _render_slash,
    ),
    _Rule("dotted", re.compile(r"(?<![0-9.])[0-9]+(?:\.[0-9]+){2,}"), _render_dotted),
    _Rule(
        "digit_groups",
        re.compile(r"(?<![0-9])[0-9]+(?:-[0-9]+){2,}(?![0-9])"),
        _render_digit_groups,
    ),
    _Rule(
        "money_prefix",
        re.compile(rf"(?P<sign>{_SIGN})?(?P<cur>[€$£¥￥])\s?(?P<num>{_MONEY_NUMBER})"),
        _render_money,
    ),
    _Rule(
        "money_suffix",
        re.compile(
            rf"(?P<sign>{_SIGN})?(?P<num>{_MONEY_NUMBER})[ \u00a0\u202f]?"
            r"(?P<cur>€|\$|£|¥|￥|(?:EUR|GBP|USD|CNY|RMB)(?![A-Za-z]))"
        ),
        _render_money,
    ),
    _Rule(
        "month_day",
        re.compile(
            rf"\b(?P<month>{MONTH_ALT}\.?)\s(?P<d>[0-9]{{1,2}})(?:st|nd|rd|th)?"
            r"(?![0-9A-Za-z]|[:.,][0-9])"
        ),
        _render_month_day,
    ),
    _Rule(
        "day_month",
        re.compile(rf"(?<![0-9])(?P<d>[0-9]{{1,2}})(?:st|nd|rd|th)?(?=\s{MONTH_ALT}\b)"),
        _render_day_month,
    ),
    _Rule(
        "ordinal",
        re.compile(r"(?<![0-9])(?P<num>[0-9]+)(?:st|nd|rd|th|ST|ND|RD|TH)(?![A-Za-z])"),
        _render_ordinal,
    ),
    _Rule(
        "hash_number",
        re.compile(r"(?<![0-9A-Za-z&#])#(?P<num>[0-9]{1,4})(?![0-9])"),
        _render_hash_number,
    ),
    _Rule(
        "decade",
        re.compile(r"(?<![0-9])(?P<num>(?:1[0-9]|20)?[0-9]0)'?s(?![A-Za-z])"),
        _render_decade,
    ),
    _Rule(
        "quantity",
        re.compile(
            rf"(?P<sign>{_SIGN})?(?P<num>{_NUMBER})"
            rf"(?:(?:-|\s?[–—~～]\s?)(?P<sign2>[-−])?(?P<num2>{_NUMBER}))?"
            rf"(?:[ \u00a0\u202f]?(?P<unit>{UNIT_ALT}))?"
        ),
        _render_quantity,
    ),
)


def is_cjk(char: str) -> bool:
    code = ord(char)
    return (
        0x3400 <= code <= 0x4DBF  # CJK extension A
        or 0x4E00 <= code <= 0x9FFF  # CJK unified ideographs
        or 0xF900 <= code <= 0xFAFF  # compatibility ideographs
        or 0x3000 <= code <= 0x303F  # CJK punctuation: "，45%" belongs to a Chinese sentence
        or 0xFF00 <= code <= 0xFFEF  # full-width forms
    )


def _touches_cjk(text: str, start: int, end: int) -> bool:
    """A number touching a CJK character (spaces skipped) is read in Chinese."""
    if any(is_cjk(char) for char in text[start:end]):
        return True
    before = start - 1
    while before >= 0 and text[before].isspace():
        before -= 1
    after = end
    while after < len(text) and text[after].isspace():
        after += 1
    return (before >= 0 and is_cjk(text[before])) or (after < len(text) and is_cjk(text[after]))


def _pad(spoken: str, text: str, start: int, end: int) -> str:
    """Keep words apart from Latin letters they were glued to ("CO2" -> "CO two")."""
    if start > 0 and text[start - 1].isascii() and text[start - 1].isalnum():
        spoken = " " + spoken
    if end < len(text) and text[end].isascii() and text[end].isalnum():
        spoken += " "
    return spoken


def _rules_for(order: DateOrder) -> tuple[_Rule, ...]:
    dated: dict[str, Render] = {
        "date_dmy": functools.partial(_render_date_dmy, order=order),
        "slash": functools.partial(_render_slash, order=order),
    }
    return tuple(
        _Rule(rule.name, rule.pattern, dated.get(rule.name, rule.render)) for rule in _RULES
    )


_RULES_BY_ORDER: Final[dict[str, tuple[_Rule, ...]]] = {
    order: _rules_for(order) for order in ("dmy", "mdy")
}


def spell(
    text: str, reader: NumberReader, cjk: NumberReader, *, date_order: DateOrder = "dmy"
) -> str:
    """``text`` with every number, time, date, unit and amount spelled out by ``reader``, or by
    ``cjk`` where the number touches a CJK character."""
    rules = _RULES_BY_ORDER[date_order]
    text = _FULLWIDTH_DIGIT.sub(lambda m: chr(ord(m[0]) - 0xFEE0), text)
    pieces: list[str] = []
    pos = 0
    # Next match of each rule at or after pos; None once a rule has no match left.
    upcoming: list[re.Match[str] | None] = [rule.pattern.search(text) for rule in rules]
    while True:
        for index, rule in enumerate(rules):
            found = upcoming[index]
            if found is not None and found.start() < pos:
                upcoming[index] = rule.pattern.search(text, pos)
        candidates = sorted(
            ((found.start(), index) for index, found in enumerate(upcoming) if found is not None),
        )
        if not candidates:
            break
        for start, index in candidates:
            found = upcoming[index]
            assert found is not None
            span_reader = cjk if _touches_cjk(text, found.start(), found.end()) else reader
            spoken = rules[index].render(found, span_reader)
            if spoken is not None:
                if span_reader.pads_latin:
                    spoken = _pad(spoken, text, found.start(), found.end())
                pieces.append(text[pos:start])
                pieces.append(spoken)
                pos = found.end()
                break
        else:  # unreachable: the quantity rule reads any digit; still, always make progress
            start = candidates[0][0]
            pieces.append(text[pos : start + 1])
            pos = start + 1
    pieces.append(text[pos:])
    return "".join(pieces)
