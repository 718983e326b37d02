"""English: how numbers are read ("num2words"), how much of a text is English (its Latin
words), and what an English voice is given (:func:`tts_bridge.text.english.for_english_voice`)."""

from __future__ import annotations

import re
from typing import Final

from num2words import num2words

from tts_bridge.text.english import for_english_voice
from tts_bridge.text.numbers import (
    MONTH_ALT,
    MONTH_NAMES,
    DateOrder,
    has_leading_zero,
    is_year,
)
from tts_bridge.text.units import Currency, Unit

# num2words refuses numbers of 10**306 and more (and int() strings of more than 4300 digits):
# longer ones are read digit by digit.
_NUM2WORDS_MAX_DIGITS = 306
_LATIN_WORD = re.compile(r"[A-Za-z]+")

# Words after which a number of three or more digits is a phone number ("call 911").
_PHONE_CONTEXT = re.compile(
    r"\b(?:call|calls|calling|called|dial|dialing|ring|phone|number|hotline|tel\.?)"
    r"\s*(?:is\s+|was\s+|[:#=]\s*)?$",
    re.IGNORECASE,
)
# Emergency numbers are said digit by digit wherever they stand.
_EMERGENCY_NUMBERS = frozenset({"911"})
# Rooms, flats and zones of three or four digits are said in pairs or digits, with "oh" for a
# zero: "room two oh four", "flat twelve oh one"; one or two digits stay a number ("zone three").
_ROOM_CONTEXT = re.compile(
    r"\b(?:room|rm\.?|flat|apartment|apt\.?|suite|unit|zone|gate|platform|door|office|cabin|"
    r"ward|bay|locker|seat|cell)\s*(?:no\.?\s*|number\s+|#\s*)?$",
    re.IGNORECASE,
)
# A product written in capitals before its number: "RTX 3090" is "RTX thirty ninety".
_MODEL_CONTEXT = re.compile(r"(?<![A-Za-z])[A-Z]{2,}[ -]?$")
# Words after which a four-digit number is a year.
_YEAR_CONTEXT = re.compile(
    r"(?:\b(?i:in|since|until|till|of|from|before|after|during|year|circa)\s+"
    rf"|\b{MONTH_ALT}\.?\s+(?:[0-9]{{1,2}}(?:st|nd|rd|th)?,?\s+)?"
    r"|(?<![0-9])(?:1[0-9]|20)[0-9]{2}\s+(?i:to|and|or|through|until)\s+)$"
)
_THE_BEFORE = re.compile(r"\bthe\s+$", re.IGNORECASE)
_FRACTIONS: Final = {2: ("half", "halves"), 4: ("quarter", "quarters")}


def _digits(digits: str) -> str:
    return " ".join(str(num2words(int(d))) for d in digits)


def _int(digits: str) -> str:
    value = digits.lstrip("0") or "0"
    if len(value) > _NUM2WORDS_MAX_DIGITS:
        return _digits(digits)
    return str(num2words(int(value))).replace(",", "")


def _ordinal(digits: str) -> str:
    value = digits.lstrip("0") or "0"
    if len(value) > _NUM2WORDS_MAX_DIGITS:
        return _digits(digits)
    return str(num2words(int(value), to="ordinal")).replace(",", "")


def _year(value: int) -> str:
    return str(num2words(value, to="year")).replace(",", "")


def _pair(pair: str, last: bool) -> str:
    if pair == "00" and last:
        return "hundred"
    if pair.startswith("0"):
        return "oh " + _int(pair[1])
    return _int(pair)


def _pairs(digits: str) -> str:
    """Three or four digits as a room or a model number is said: "204" -> "two oh four",
    "1201" -> "twelve oh one", "3090" -> "thirty ninety", "300" -> "three hundred"."""
    if len(digits) not in (3, 4) or (len(digits) == 4 and digits.endswith("000")):
        return _int(digits)
    head, tail = digits[:-2], digits[-2:]
    return f"{_int(head)} {_pair(tail, last=True)}"


class EnglishNumbers:
    """Numbers as English speakers in a home say them (num2words's British "and" kept)."""

    pads_latin = True
    to = " to "
    plus = "plus "
    dot = " dot "
    all_the_time = "twenty-four seven"

    def digits(self, digits: str) -> str:
        return _digits(digits)

    def integer(self, digits: str) -> str:
        return _int(digits)

    def number(self, number: str) -> str:
        whole, _, fraction = number.replace(",", "").partition(".")
        words = _int(whole)
        return f"{words} point {_digits(fraction)}" if fraction else words

    def sign_word(self, sign: str | None) -> str:
        if not sign:
            return ""
        return "plus " if sign == "+" else "minus "

    def date(self, year: int, month: int, day: int | None) -> str:
        if day is None:
            return f"{MONTH_NAMES[month - 1]} {_year(year)}"
        return f"{MONTH_NAMES[month - 1]} {_ordinal(str(day))}, {_year(year)}"

    def day_of_month(self, day: int, month: int) -> str:
        return f"{MONTH_NAMES[month - 1]} {_ordinal(str(day))}"

    def fraction(self, numerator: int, denominator: int) -> str:
        names = _FRACTIONS.get(denominator)
        if names is None:
            ordinal = _ordinal(str(denominator))
            names = (ordinal, ordinal + "s")
        return f"{_int(str(numerator))} {names[0 if numerator == 1 else 1]}"

    def out_of(self, score: int, total: int) -> str:
        return f"{_int(str(score))} out of {_int(str(total))}"

    def time(
        self, hour: int, minute: int, second: int | None, ampm: str | None, before: str
    ) -> str:
        suffix = f" {ampm} m" if ampm else ""
        if hour in (0, 24) and minute == 0 and not second and not ampm:
            return "midnight"
        # A 24-hour time is said the 12-hour way, as people in a home say it: "23:00" is
        # "eleven p m" (not the military "twenty-three hundred"); "00:15" is "twelve fifteen
        # a m".
        if hour == 0:
            hour, suffix = 12, " a m"
        elif 12 < hour < 24 and not ampm:
            hour, suffix = hour - 12, " p m"
        hour_words = _int(str(hour))
        if minute == 0:
            words = hour_words if suffix else f"{hour_words} o'clock"
        elif minute < 10:
            words = f"{hour_words} oh {_int(str(minute))}"
        else:
            words = f"{hour_words} {_int(str(minute))}"
        if second:
            unit = "second" if second == 1 else "seconds"
            words += f" and {_int(str(second))} {unit}"
        return words + suffix

    def money(self, sign: str | None, amount: str, currency: Currency) -> str:
        whole, _, fraction = amount.partition(".")
        words = self.sign_word(sign)
        if currency.en_minor is None or len(fraction) > 2:
            return f"{words}{self.number(amount)} {currency.en_major[1]}"
        major = whole.lstrip("0")  # the amount may be longer than int() accepts
        minor = int(fraction.ljust(2, "0")) if fraction else 0
        parts = []
        if major or not minor:
            parts.append(f"{_int(whole)} {currency.en_major[0 if major == '1' else 1]}")
        if minor:
            parts.append(f"{_int(str(minor))} {currency.en_minor[0 if minor == 1 else 1]}")
        return words + " and ".join(parts)

    def month_day(self, month: str, day: int) -> str:
        return f"{month} {_ordinal(str(day))}"

    def day_month(self, day: int, before: str) -> str | None:
        the = "" if _THE_BEFORE.search(before) else "the "
        return f"{the}{_ordinal(str(day))} of"

    def ordinal(self, digits: str) -> str:
        return _ordinal(digits)

    def hash_number(self, digits: str) -> str:
        return "number " + _int(digits)

    def decade(self, digits: str) -> str:
        words = _year(int(digits)) if len(digits) == 4 else _int(digits)
        return words[:-1] + "ies" if words.endswith("y") else words + "s"

    def with_unit(self, sign: str | None, number: str, unit: Unit) -> str:
        singular = number == "1"
        return f"{self.sign_word(sign)}{self.number(number)} {unit.en[0 if singular else 1]}"

    def unit_range(
        self, sign: str | None, first: str, sign2: str | None, second: str, unit: Unit
    ) -> str | None:
        return None

    def said_as_digits(self, number: str, before: str) -> str | None:
        if number in _EMERGENCY_NUMBERS or (len(number) >= 3 and _PHONE_CONTEXT.search(before)):
            return _digits(number)
        pairs = len(number) in (3, 4) and not has_leading_zero(number)
        if pairs and (_ROOM_CONTEXT.search(before) or _MODEL_CONTEXT.search(before)):
            return _pairs(number)
        return None

    def special_number(self, number: str, before: str, text: str, end: int) -> str | None:
        if is_year(number) and _YEAR_CONTEXT.search(before):
            return _year(int(number))
        return None

    def year_range(self, first: str, second: str, text: str, end: int) -> str | None:
        if all(1900 <= int(n) <= 2099 for n in (first, second)):
            return f"{_year(int(first))} to {_year(int(second))}"
        return None


class English:
    """The English front end."""

    code = "en"
    names = frozenset({"en", "english"})
    numbers = EnglishNumbers()

    @staticmethod
    def detect(text: str) -> int:
        return len(_LATIN_WORD.findall(text))

    @staticmethod
    def for_voice(text: str, *, date_order: DateOrder) -> str:
        return for_english_voice(text, date_order=date_order)


FRONT_END = English()
