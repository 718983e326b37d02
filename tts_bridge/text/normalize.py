"""Spell out numbers for speech, in English and Chinese, so no digit reaches the TTS engine.

The rules are shared (:mod:`tts_bridge.text.numbers`); the words are each language's
(:mod:`tts_bridge.text.language` finds its front end).

ChatTTS deletes every character outside CJK, Latin letters and a little punctuation before it
synthesizes, so "21 degrees" would be spoken as "degrees". :func:`normalize` rewrites numbers,
times, dates, temperatures, percentages, money and units as words and leaves the rest of the text
as it was. Number words come from ``num2words`` (English) and ``cn2an`` (Chinese).

Which language a number is read in is decided per number: a number next to a CJK character (spaces
ignored, a CJK unit such as 度 included) is read in Chinese; any other number in ``lang``, or, when
``lang`` is None, in the text's dominant script (:func:`detect_language`).

Readings (English / Chinese):

- integers: "1,250" -> "one thousand two hundred and fifty" / "一千二百五十" (num2words's British
  "and" is kept, its commas are dropped because they would make the voice pause);
- decimals keep every written digit: "21.50" -> "twenty-one point five zero" / "二十一点五零";
- negatives: "-3" -> "minus three" / "负三"; temperatures below zero in Chinese: "零下五摄氏度";
- digit strings are read digit by digit: a leading zero ("0612"), five or more digits without
  thousands separators ("12000"; write "12,000" for a quantity), a number after a word such as
  "code", "PIN" or 验证码, phone numbers ("+31 6 1234", "555-123-4567"), IP and version numbers
  ("192.168.1.1" -> "one nine two dot one six eight dot one dot one"); a number with a unit or a
  currency is always a quantity;
- percentages: "45%" -> "forty-five percent" / "百分之四十五";
- temperatures: "21.5°C" -> "twenty-one point five degrees Celsius" / "二十一点五摄氏度",
  "70°F" -> "... degrees Fahrenheit" / "七十华氏度", "21.5度" -> "二十一点五度";
- times are read the 12-hour way in English, as people say them: "07:30" -> "seven thirty",
  "19:05" -> "seven oh five p m", "7:00" -> "seven o'clock", "23:00" -> "eleven p m" (never
  "twenty-three hundred"), "00:00" -> "midnight", "00:15" -> "twelve fifteen a m", "7:30 pm" ->
  "seven thirty p m"; Chinese as written: "七点三十分", "十九点零五分", "七点", "两点" (2 o'clock),
  "7:30 pm" -> "晚上七点三十分";
- dates, whatever the input order, are read "November thirtieth, twenty twenty-six" /
  "二零二六年十一月三十日". Accepted: ISO "2026-11-30" (also with / or .), "2026-11" (a month),
  and day-first "30/11/2026" (also with - or .); a day-first date is read month-first only when
  that is the only valid reading ("11/30/2026"). "30 November" -> "the thirtieth of November",
  "November 30" -> "November thirtieth";
- years: a four-digit number after "in", "since", "until", "from", a month name, ... is read as a
  year: "in 2026" -> "in twenty twenty-six"; Chinese "2026年" -> "二零二六年"; "1990s" ->
  "nineteen nineties";
- ordinals: "3rd" -> "third" / "第三"; "#3" -> "number three" / "三号";
- ranges: "10-15" -> "ten to fifteen" / "十到十五", "20-25%" -> "twenty to twenty-five percent" /
  "百分之二十到百分之二十五";
- units: "5 km" -> "five kilometers" / "五公里", "1 kWh" -> "one kilowatt hour" / "一千瓦时";
  Chinese reads 2 before a measure word or unit as 两 ("2个" -> "两个", "2 km" -> "两公里");
- money: "$9.99" -> "nine dollars and ninety-nine cents" / "九点九九美元",
  "€3.50" -> "three euros and fifty cents" / "三点五欧元"; "¥" is read as yuan / 元;
- "a.m." / "pm" after a time are read as letters, "a m" / "p m".

A number read in English right next to a Latin letter gets a space ("CO2" -> "CO two").
Full-width digits (０-９) are read like ASCII digits. The output contains no ASCII digit.
"""

from __future__ import annotations

import logging
from typing import Final, Literal

from tts_bridge.text import language
from tts_bridge.text.numbers import DateOrder, spell

__all__ = ["SUPPORTED_LANGUAGES", "DateOrder", "Lang", "detect_language", "normalize"]

_LOGGER = logging.getLogger(__name__)

Lang = Literal["en", "zh"]
"""The languages that come with the bridge."""
SUPPORTED_LANGUAGES: Final = ("en", "zh")
_CJK = "zh"
"""The language of a number that touches a CJK character."""


def detect_language(text: str) -> str:
    """The code of the language most of ``text`` is in: "zh" when Han characters outnumber
    Latin words, else "en" (and a registered language when it has more).

    Words are compared with characters, as ChatTTS does, because a Chinese character carries about
    as much speech as an English word.
    """
    return language.detect(text).code


def normalize(text: str, lang: str | None = None, *, date_order: DateOrder = "dmy") -> str:
    """Return ``text`` with every number, time, date, unit and amount spelled out in words.

    ``lang`` ("en", "zh", a tag such as "zh-CN", or None to detect) is the reading for numbers that
    do not touch CJK characters; numbers next to CJK characters are always read in Chinese.
    ``date_order`` reads numeric dates such as "1/12" or "01/12/2026" day first (1 December) or
    month first (January 12th). Raises ValueError for a language without a front end.
    """
    front_end = language.resolve(lang) or language.detect(text)
    cjk = language.get(_CJK) or front_end
    result = spell(text, front_end.numbers, cjk.numbers, date_order=date_order)
    if result != text:
        _LOGGER.debug("normalized %r -> %r (%s)", text[:80], result[:80], front_end.code)
    return result
