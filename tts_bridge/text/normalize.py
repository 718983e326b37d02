"""Spell out numbers for speech, in English and Chinese, so no digit reaches the TTS engine.

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

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import cn2an
from num2words import num2words

_LOGGER = logging.getLogger(__name__)

Lang = Literal["en", "zh"]
SUPPORTED_LANGUAGES: Final = ("en", "zh")

# cn2an.an2cn refuses integers of more than 16 digits, num2words numbers of 10**306 and more
# (and int() refuses strings of more than 4300 digits): longer ones are read digit by digit.
_CN2AN_MAX_DIGITS = 16
_NUM2WORDS_MAX_DIGITS = 306
# Integers written without separators from this length on are codes or ids, not quantities.
_DIGIT_STRING_MIN_LEN = 5

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_WORD = re.compile(r"[A-Za-z]+")
_FULLWIDTH_DIGIT = re.compile(r"[０-９]")

_MONTHS: Final = (
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
_MONTH_ALT = (
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


@dataclass(frozen=True)
class _Currency:
    en_major: tuple[str, str]
    """English name, singular and plural."""
    en_minor: tuple[str, str] | None
    """Name of the hundredth (singular, plural); None reads the amount as a decimal."""
    zh: str


_EURO = _Currency(("euro", "euros"), ("cent", "cents"), "欧元")
_DOLLAR = _Currency(("dollar", "dollars"), ("cent", "cents"), "美元")
_POUND = _Currency(("pound", "pounds"), ("penny", "pence"), "英镑")
_YUAN = _Currency(("yuan", "yuan"), None, "元")


def _currency_for(symbol: str) -> _Currency:
    if symbol in ("€", "EUR"):
        return _EURO
    if symbol in ("£", "GBP"):
        return _POUND
    if symbol in ("¥", "￥", "CNY", "RMB"):
        return _YUAN
    return _DOLLAR


UnitKind = Literal["plain", "percent", "temperature", "money"]


@dataclass(frozen=True)
class _Unit:
    pattern: str
    kind: UnitKind
    en: tuple[str, str]
    """English reading, singular and plural."""
    zh: str
    zh_prefix: bool = False
    """The Chinese reading goes before the number (百分之, 百万分之)."""
    liang: bool = True
    """Chinese reads 2 as 两 before this unit."""


# Longer units first: the alternation takes the first that fits ("km/h" before "km" before "m").
_UNITS: Final = (
    _Unit("%|％", "percent", ("percent", "percent"), "百分之", zh_prefix=True),
    _Unit("°[ ]?C|℃", "temperature", ("degree Celsius", "degrees Celsius"), "摄氏度"),
    _Unit("°[ ]?F|℉", "temperature", ("degree Fahrenheit", "degrees Fahrenheit"), "华氏度"),
    _Unit("°", "temperature", ("degree", "degrees"), "度"),
    _Unit("度", "temperature", ("degree", "degrees"), "度"),
    _Unit("€|EUR", "money", ("euro", "euros"), "欧元"),
    _Unit("£|GBP", "money", ("pound", "pounds"), "英镑"),
    _Unit("USD", "money", ("dollar", "dollars"), "美元"),
    _Unit("CNY|RMB", "money", ("yuan", "yuan"), "元"),
    _Unit("km/h|kmh|kph", "plain", ("kilometer per hour", "kilometers per hour"), "公里每小时"),
    _Unit("m/s", "plain", ("meter per second", "meters per second"), "米每秒"),
    _Unit("mph", "plain", ("mile per hour", "miles per hour"), "英里每小时"),
    _Unit(
        "[µμu]g/m[³3]",
        "plain",
        ("microgram per cubic meter", "micrograms per cubic meter"),
        "微克每立方米",
    ),
    _Unit("kWh|kwh|KWh|KWH", "plain", ("kilowatt hour", "kilowatt hours"), "千瓦时"),
    _Unit("MWh", "plain", ("megawatt hour", "megawatt hours"), "兆瓦时"),
    _Unit("mAh", "plain", ("milliamp hour", "milliamp hours"), "毫安时"),
    _Unit("Wh", "plain", ("watt hour", "watt hours"), "瓦时"),
    _Unit("kW", "plain", ("kilowatt", "kilowatts"), "千瓦"),
    _Unit("MW", "plain", ("megawatt", "megawatts"), "兆瓦"),
    _Unit("W", "plain", ("watt", "watts"), "瓦"),
    _Unit("mA", "plain", ("milliamp", "milliamps"), "毫安"),
    _Unit("A", "plain", ("amp", "amps"), "安"),
    _Unit("kV", "plain", ("kilovolt", "kilovolts"), "千伏"),
    _Unit("V", "plain", ("volt", "volts"), "伏"),
    _Unit("kHz", "plain", ("kilohertz", "kilohertz"), "千赫兹"),
    _Unit("Hz", "plain", ("hertz", "hertz"), "赫兹"),
    # Chinese weather reports say 一千零一十三百帕; 两百帕 would sound like 200 Pa.
    _Unit("hPa", "plain", ("hectopascal", "hectopascals"), "百帕", liang=False),
    _Unit("kPa", "plain", ("kilopascal", "kilopascals"), "千帕"),
    _Unit("Pa", "plain", ("pascal", "pascals"), "帕"),
    _Unit("mbar", "plain", ("millibar", "millibars"), "毫巴"),
    _Unit("bar", "plain", ("bar", "bar"), "巴"),
    _Unit("m²", "plain", ("square meter", "square meters"), "平方米"),
    _Unit("m³", "plain", ("cubic meter", "cubic meters"), "立方米"),
    _Unit("km", "plain", ("kilometer", "kilometers"), "公里"),
    _Unit("cm", "plain", ("centimeter", "centimeters"), "厘米"),
    _Unit("mm", "plain", ("millimeter", "millimeters"), "毫米"),
    _Unit("kg", "plain", ("kilogram", "kilograms"), "公斤"),
    _Unit("mg", "plain", ("milligram", "milligrams"), "毫克"),
    _Unit("ml|mL", "plain", ("milliliter", "milliliters"), "毫升"),
    _Unit("lux|lx", "plain", ("lux", "lux"), "勒克斯"),
    _Unit("ppm", "plain", ("part per million", "parts per million"), "百万分之", zh_prefix=True),
    _Unit("ppb", "plain", ("part per billion", "parts per billion"), "十亿分之", zh_prefix=True),
    _Unit("dB", "plain", ("decibel", "decibels"), "分贝"),
    _Unit("ms", "plain", ("millisecond", "milliseconds"), "毫秒"),
    _Unit("min|mins", "plain", ("minute", "minutes"), "分钟"),
    _Unit("hr|hrs", "plain", ("hour", "hours"), "小时"),
    _Unit("sec|secs", "plain", ("second", "seconds"), "秒"),
    _Unit("m", "plain", ("meter", "meters"), "米"),
    _Unit("g", "plain", ("gram", "grams"), "克"),
    _Unit("l|L", "plain", ("liter", "liters"), "升"),
    _Unit("h", "plain", ("hour", "hours"), "小时"),
    _Unit("s", "plain", ("second", "seconds"), "秒"),
)


def _unit_regex(unit: _Unit) -> str:
    # A unit written in letters must end the word: "5 m" is meters, "5 minutes" is not.
    if unit.pattern[-1].isascii() and unit.pattern[-1].isalpha():
        return f"(?:{unit.pattern})(?![A-Za-z])"
    return f"(?:{unit.pattern})"


_UNIT_MATCHERS: Final = tuple((re.compile(_unit_regex(u)), u) for u in _UNITS)
_UNIT_ALT = "|".join(_unit_regex(u) for u in _UNITS)

# Words after which a number is a code to read digit by digit.
_EN_CODE_CONTEXT = re.compile(
    r"\b(?:code|pin|passcode|password|otp|extension|ext\.?)\s*(?:is\s+|was\s+|[:#=]\s*)?$",
    re.IGNORECASE,
)
# Words after which a number of three or more digits is a phone number ("call 911").
_EN_PHONE_CONTEXT = re.compile(
    r"\b(?:call|calls|calling|called|dial|dialing|ring|phone|number|hotline|tel\.?)"
    r"\s*(?:is\s+|was\s+|[:#=]\s*)?$",
    re.IGNORECASE,
)
# Emergency numbers are said digit by digit wherever they stand.
_EMERGENCY_NUMBERS = frozenset({"911"})
# Rooms, flats and zones of three or four digits are said in pairs or digits, with "oh" for a
# zero: "room two oh four", "flat twelve oh one"; one or two digits stay a number ("zone three").
_EN_ROOM_CONTEXT = re.compile(
    r"\b(?:room|rm\.?|flat|apartment|apt\.?|suite|unit|zone|gate|platform|door|office|cabin|"
    r"ward|bay|locker|seat|cell)\s*(?:no\.?\s*|number\s+|#\s*)?$",
    re.IGNORECASE,
)
# A product written in capitals before its number: "RTX 3090" is "RTX thirty ninety".
_EN_MODEL_CONTEXT = re.compile(r"(?<![A-Za-z])[A-Z]{2,}[ -]?$")
_ZH_CODE_CONTEXT = re.compile(
    r"(?:验证码|密码|取件码|取货码|提货码|编号|工号|尾号|号码|电话|手机号?|房间号|门牌号|车牌号?)"
    r"\s*(?:是|为|[:：])?\s*$"
)
# Words after which a four-digit number is a year.
_EN_YEAR_CONTEXT = re.compile(
    r"(?:\b(?i:in|since|until|till|of|from|before|after|during|year|circa)\s+"
    rf"|\b{_MONTH_ALT}\.?\s+(?:[0-9]{{1,2}}(?:st|nd|rd|th)?,?\s+)?"
    r"|(?<![0-9])(?:1[0-9]|20)[0-9]{2}\s+(?i:to|and|or|through|until)\s+)$"
)
# Chinese measure words and units before which 2 is read 两.
_ZH_LIANG_NEXT = re.compile(
    r"\s?(?:个|位|台|盏|次|只|条|张|扇|把|层|间|辆|部|件|瓶|杯|本|块|份|种|天|周|星期|小时|分钟"
    r"|秒钟|点|公里|千米|米|公斤|千克|斤|升|倍|岁|名|人|项|首|遍|回|元|毛|年(?!级)|晚|顿|场|组|千|万|亿"
    r"|袋|桶|箱|盒|颗|粒|片|支|根|双|对|套|节|路)"
)
_ZH_YEAR_NEXT = re.compile(r"\s?年")
_ZH_LEADING_TWO = re.compile(r"^二(?=[千万亿])")
# A time already introduced by one of these needs no 上午/下午 from "am"/"pm".
_ZH_DAY_PERIOD_BEFORE = re.compile(r"(?:凌晨|早上|早晨|上午|中午|下午|傍晚|晚上|夜里|半夜)\s*$")
_THE_BEFORE = re.compile(r"\bthe\s+$", re.IGNORECASE)


def _is_cjk(char: str) -> bool:
    code = ord(char)
    return (
        0x3400 <= code <= 0x4DBF  # CJK extension A
        or 0x4E00 <= code <= 0x9FFF  # CJK unified ideographs
        or 0xF900 <= code <= 0xFAFF  # compatibility ideographs
        or 0x3000 <= code <= 0x303F  # CJK punctuation: "，45%" belongs to a Chinese sentence
        or 0xFF00 <= code <= 0xFFEF  # full-width forms
    )


def detect_language(text: str) -> Lang:
    """Return "zh" when CJK characters outnumber Latin words in ``text``, else "en".

    Words are compared with characters, as ChatTTS does, because a Chinese character carries about
    as much speech as an English word.
    """
    return "zh" if len(_HAN.findall(text)) > len(_LATIN_WORD.findall(text)) else "en"


def _resolve_lang(lang: str | None) -> Lang | None:
    if lang is None:
        return None
    tag = lang.strip().lower().replace("_", "-")
    if tag in ("", "auto"):
        return None
    primary = tag.split("-", 1)[0]
    if primary in ("zh", "cmn", "chinese"):
        return "zh"
    if primary in ("en", "english"):
        return "en"
    raise ValueError(f"unsupported language {lang!r}: expected 'en', 'zh' or None")


# --- words for numbers -------------------------------------------------------------------------


def _en_digits(digits: str) -> str:
    return " ".join(str(num2words(int(d))) for d in digits)


def _zh_digits(digits: str) -> str:
    return str(cn2an.an2cn(digits, "direct"))


def _digits(digits: str, lang: Lang) -> str:
    return _en_digits(digits) if lang == "en" else _zh_digits(digits)


def _en_int(digits: str) -> str:
    value = digits.lstrip("0") or "0"
    if len(value) > _NUM2WORDS_MAX_DIGITS:
        return _en_digits(digits)
    return str(num2words(int(value))).replace(",", "")


def _zh_int(digits: str) -> str:
    value = digits.lstrip("0") or "0"
    if len(value) > _CN2AN_MAX_DIGITS:
        return _zh_digits(digits)
    # cn2an writes 二千 and 二万; Mandarin says 两千, 两万, 两亿.
    return _ZH_LEADING_TWO.sub("两", str(cn2an.an2cn(value)))


def _number(number: str, lang: Lang) -> str:
    """Words for an unsigned number such as "1,250" or "21.50"; every written decimal is read."""
    whole, _, fraction = number.replace(",", "").partition(".")
    if lang == "en":
        words = _en_int(whole)
        return f"{words} point {_en_digits(fraction)}" if fraction else words
    words = _zh_int(whole)
    return f"{words}点{_zh_digits(fraction)}" if fraction else words


def _sign_word(sign: str | None, lang: Lang) -> str:
    if not sign:
        return ""
    if lang == "en":
        return "plus " if sign == "+" else "minus "
    return "正" if sign == "+" else "负"


def _signed(sign: str | None, number: str, lang: Lang) -> str:
    return _sign_word(sign, lang) + _number(number, lang)


def _en_ordinal(digits: str) -> str:
    value = digits.lstrip("0") or "0"
    if len(value) > _NUM2WORDS_MAX_DIGITS:
        return _en_digits(digits)
    return str(num2words(int(value), to="ordinal")).replace(",", "")


def _en_year(value: int) -> str:
    return str(num2words(value, to="year")).replace(",", "")


def _has_leading_zero(number: str) -> bool:
    whole = number.partition(".")[0]
    return len(whole) > 1 and whole.startswith("0")


def _is_digit_string(number: str) -> bool:
    """A code or id rather than a quantity: leading zero, or a long run without separators."""
    if "." in number or "," in number:
        return False
    return _has_leading_zero(number) or len(number) >= _DIGIT_STRING_MIN_LEN


def _is_year(number: str) -> bool:
    return len(number) == 4 and number.isdigit() and 1000 <= int(number) <= 2999


# --- rules -------------------------------------------------------------------------------------

Render = Callable[[re.Match[str], Lang], str | None]
"""Spoken text for a match, or None when the match is not what the rule reads after all."""


def _render_intl_phone(match: re.Match[str], lang: Lang) -> str:
    groups = re.findall(r"[0-9]+", match[0])
    plus = "plus " if lang == "en" else "加"
    return plus + " ".join(_digits(group, lang) for group in groups)


def _render_digit_groups(match: re.Match[str], lang: Lang) -> str:
    return " ".join(_digits(group, lang) for group in re.findall(r"[0-9]+", match[0]))


def _render_dotted(match: re.Match[str], lang: Lang) -> str:
    dot = " dot " if lang == "en" else "点"
    return dot.join(_digits(group, lang) for group in match[0].split("."))


def _date(year: int, month: int, day: int | None, lang: Lang) -> str | None:
    if not 1 <= month <= 12 or (day is not None and not 1 <= day <= 31):
        return None
    if lang == "en":
        if day is None:
            return f"{_MONTHS[month - 1]} {_en_year(year)}"
        return f"{_MONTHS[month - 1]} {_en_ordinal(str(day))}, {_en_year(year)}"
    words = f"{_zh_digits(str(year))}年{_zh_int(str(month))}月"
    return words if day is None else f"{words}{_zh_int(str(day))}日"


def _render_date_ymd(match: re.Match[str], lang: Lang) -> str | None:
    return _date(int(match["y"]), int(match["m"]), int(match["d"]), lang)


DateOrder = Literal["dmy", "mdy"]
"""How a numeric date without a year-first form is read: "1/12" is 1 December (dmy) or
January 12th (mdy). The other order is taken when it is the only valid one ("12/24")."""


def _day_month(first: int, second: int, order: DateOrder) -> tuple[int, int] | None:
    day, month = (first, second) if order == "dmy" else (second, first)
    if not (1 <= month <= 12 and 1 <= day <= 31):
        day, month = month, day
    return (day, month) if 1 <= month <= 12 and 1 <= day <= 31 else None


def _render_date_dmy(match: re.Match[str], lang: Lang, order: DateOrder = "dmy") -> str | None:
    found = _day_month(int(match["a"]), int(match["b"]), order)
    return None if found is None else _date(int(match["y"]), found[1], found[0], lang)


_EN_FRACTIONS: Final = {2: ("half", "halves"), 4: ("quarter", "quarters")}
# A slash read as a fraction before these words ("3/4 of the tank").
_FRACTION_NEXT = re.compile(
    r"\s+(?:of|full|empty|cups?|tanks?|teaspoons?|tablespoons?)\b|\s?(?:满|的|杯|箱)"
)
_OUT_OF_NEXT = re.compile(r"\s*(?:stars?|points?|marks?)\b")


def _fraction(numerator: int, denominator: int, lang: Lang) -> str:
    if lang == "zh":
        return f"{_zh_int(str(denominator))}分之{_zh_int(str(numerator))}"
    names = _EN_FRACTIONS.get(denominator)
    if names is None:
        ordinal = _en_ordinal(str(denominator))
        names = (ordinal, ordinal + "s")
    return f"{_en_int(str(numerator))} {names[0 if numerator == 1 else 1]}"


def _render_slash(match: re.Match[str], lang: Lang, order: DateOrder = "dmy") -> str | None:
    """ "12/24" is a date (in ``order``), "3/4 of" a fraction, "8/10" a score, "24/7" all the
    time; a slash is never read out."""
    first, second = int(match["a"]), int(match["b"])
    text, end = match.string, match.end()
    if (first, second) == (24, 7):
        return "twenty-four seven" if lang == "en" else "全天候"
    if 0 < first < second <= 10 and _FRACTION_NEXT.match(text, end):
        return _fraction(first, second, lang)
    found = None if _OUT_OF_NEXT.match(text, end) else _day_month(first, second, order)
    if found is None:
        if lang == "zh":
            return f"{_zh_int(str(second))}分之{_zh_int(str(first))}"
        return f"{_en_int(str(first))} out of {_en_int(str(second))}"
    day, month = found
    if lang == "zh":
        return f"{_zh_int(str(month))}月{_zh_int(str(day))}日"
    return f"{_MONTHS[month - 1]} {_en_ordinal(str(day))}"


def _render_year_month(match: re.Match[str], lang: Lang) -> str | None:
    return _date(int(match["y"]), int(match["m"]), None, lang)


def _en_time(hour: int, minute: int, second: int | None, ampm: str | None) -> str:
    suffix = f" {ampm} m" if ampm else ""
    if hour in (0, 24) and minute == 0 and not second and not ampm:
        return "midnight"
    # A 24-hour time is said the 12-hour way, as people in a home say it: "23:00" is "eleven
    # p m" (not the military "twenty-three hundred"); "00:15" is "twelve fifteen a m".
    if hour == 0:
        hour, suffix = 12, " a m"
    elif 12 < hour < 24 and not ampm:
        hour, suffix = hour - 12, " p m"
    hour_words = _en_int(str(hour))
    if minute == 0:
        words = hour_words if suffix else f"{hour_words} o'clock"
    elif minute < 10:
        words = f"{hour_words} oh {_en_int(str(minute))}"
    else:
        words = f"{hour_words} {_en_int(str(minute))}"
    if second:
        unit = "second" if second == 1 else "seconds"
        words += f" and {_en_int(str(second))} {unit}"
    return words + suffix


def _zh_clock_part(value: int) -> str:
    return "零" + _zh_int(str(value)) if value < 10 else _zh_int(str(value))


def _zh_day_period(hour: int, ampm: str | None) -> str:
    """Chinese puts the part of the day before the time: "7:30 pm" is 晚上七点三十分."""
    if ampm == "a":
        return "凌晨" if hour == 12 or hour < 5 else "上午"
    if ampm == "p":
        return "中午" if hour == 12 else ("晚上" if hour >= 6 else "下午")
    return ""


def _zh_time(hour: int, minute: int, second: int | None, period: str) -> str:
    words = period + ("两" if hour == 2 else _zh_int(str(hour))) + "点"
    if minute or second:
        words += _zh_clock_part(minute) + "分"
    if second:
        words += _zh_clock_part(second) + "秒"
    return words


def _time(match: re.Match[str], lang: Lang, prefix: str = "") -> str | None:
    hour = int(match[prefix + "h"])
    minute = int(match[prefix + "mi"] or 0)
    second = int(match[prefix + "s"]) if match[prefix + "s"] else None
    ampm = match[prefix + "ap"].lower() if match[prefix + "ap"] else None
    if hour > 24 or (ampm and hour > 12):
        return None
    if lang == "en":
        return _en_time(hour, minute, second, ampm)
    said = _ZH_DAY_PERIOD_BEFORE.search(match.string, 0, match.start())  # 晚上7pm: say it once
    return _zh_time(hour, minute, second, "" if said else _zh_day_period(hour, ampm))


def _render_time(match: re.Match[str], lang: Lang) -> str | None:
    return _time(match, lang)


def _render_time_range(match: re.Match[str], lang: Lang) -> str | None:
    start, end = _time(match, lang, "t1"), _time(match, lang, "t2")
    if start is None or end is None:
        return None
    return f"{start} to {end}" if lang == "en" else f"{start}到{end}"


def _render_hour_ampm(match: re.Match[str], lang: Lang) -> str | None:
    if not 1 <= int(match["h"]) <= 12:
        return None
    return _time(match, lang)


def _render_money(match: re.Match[str], lang: Lang) -> str:
    return _money(match["sign"], match["num"], _currency_for(match["cur"]), lang)


def _money(sign: str | None, amount: str, currency: _Currency, lang: Lang) -> str:
    # A comma followed by one or two digits at the end is a decimal comma ("3,50 €").
    if re.search(r",[0-9]{1,2}$", amount) and "." not in amount:
        amount = amount.replace(",", ".")
    amount = amount.replace(",", "")
    whole, _, fraction = amount.partition(".")
    if lang == "zh":
        fraction = fraction.rstrip("0")  # 三点五欧元: money is not read with trailing zeros
        number = f"{whole}.{fraction}" if fraction else whole
        return _sign_word(sign, lang) + _number(number, lang) + currency.zh
    words = _sign_word(sign, lang)
    if currency.en_minor is None or len(fraction) > 2:
        return f"{words}{_number(amount, lang)} {currency.en_major[1]}"
    major = whole.lstrip("0")  # the amount may be longer than int() accepts
    minor = int(fraction.ljust(2, "0")) if fraction else 0
    parts = []
    if major or not minor:
        parts.append(f"{_en_int(whole)} {currency.en_major[0 if major == '1' else 1]}")
    if minor:
        parts.append(f"{_en_int(str(minor))} {currency.en_minor[0 if minor == 1 else 1]}")
    return words + " and ".join(parts)


def _render_month_day(match: re.Match[str], lang: Lang) -> str | None:
    day = int(match["d"])
    if not 1 <= day <= 31:
        return None
    if lang == "zh":
        return f"{match['month']} {_zh_int(str(day))}日"
    return f"{match['month']} {_en_ordinal(str(day))}"


def _render_day_month(match: re.Match[str], lang: Lang) -> str | None:
    day = int(match["d"])
    if lang == "zh" or not 1 <= day <= 31:
        return None
    the = "" if _THE_BEFORE.search(match.string, 0, match.start()) else "the "
    return f"{the}{_en_ordinal(str(day))} of"


def _render_ordinal(match: re.Match[str], lang: Lang) -> str:
    if lang == "zh":
        return "第" + _zh_int(match["num"])
    return _en_ordinal(match["num"])


def _render_hash_number(match: re.Match[str], lang: Lang) -> str:
    # ChatTTS drops "#", and "#3" is said "number three" / 三号 anyway.
    if lang == "zh":
        return _zh_int(match["num"]) + "号"
    return "number " + _en_int(match["num"])


_DECADE_BEFORE = re.compile(r"\b(?i:the|early|mid|late|her|his|their|my|your|our)[ -]$")


def _render_decade(match: re.Match[str], lang: Lang) -> str | None:
    digits = match["num"]
    # "the 90s" is a decade, "wait 30s" thirty seconds.
    if len(digits) == 2 and not _DECADE_BEFORE.search(match.string, 0, match.start()):
        return None
    if lang == "zh":
        year = digits if len(digits) == 4 else "19" + digits
        return _zh_digits(year) + "年代"
    words = _en_year(int(digits)) if len(digits) == 4 else _en_int(digits)
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _find_unit(text: str) -> _Unit:
    for matcher, unit in _UNIT_MATCHERS:
        if matcher.fullmatch(text):
            return unit
    raise LookupError(text)  # unreachable: the unit was matched by the same patterns


def _render_quantity(match: re.Match[str], lang: Lang) -> str:
    sign, number, unit_text = match["sign"], match["num"], match["unit"]
    unit = _find_unit(unit_text) if unit_text else None
    if match["num2"]:
        return _range(match, unit, lang)
    if unit is None:
        return _bare_number(match, lang)
    if unit.kind == "money":
        return _money(sign, number, _currency_for(unit_text), lang)
    return _with_unit(sign, number, unit, lang)


def _with_unit(sign: str | None, number: str, unit: _Unit, lang: Lang) -> str:
    if lang == "en":
        singular = number == "1"
        return f"{_signed(sign, number, lang)} {unit.en[0 if singular else 1]}"
    if unit.zh_prefix:
        return _sign_word(sign, lang) + unit.zh + _number(number, lang)
    words = "两" if number == "2" and unit.liang else _number(number, lang)
    if unit.kind == "temperature" and sign:
        return ("零上" if sign == "+" else "零下") + words + unit.zh
    return _sign_word(sign, lang) + words + unit.zh


def _en_pair(pair: str, last: bool) -> str:
    if pair == "00" and last:
        return "hundred"
    if pair.startswith("0"):
        return "oh " + _en_int(pair[1])
    return _en_int(pair)


def _en_pairs(digits: str) -> str:
    """Three or four digits as a room or a model number is said: "204" -> "two oh four",
    "1201" -> "twelve oh one", "3090" -> "thirty ninety", "300" -> "three hundred"."""
    if len(digits) not in (3, 4) or (len(digits) == 4 and digits.endswith("000")):
        return _en_int(digits)
    head, tail = digits[:-2], digits[-2:]
    return f"{_en_int(head)} {_en_pair(tail, last=True)}"


def _said_as_digits(number: str, before: str, lang: Lang) -> str | None:
    """A code, phone, emergency, room or model number as people say it, from the words before
    it; None for a quantity."""
    if _EN_CODE_CONTEXT.search(before) or _ZH_CODE_CONTEXT.search(before):
        return _digits(number, lang)
    if lang != "en":
        return None
    if number in _EMERGENCY_NUMBERS or (len(number) >= 3 and _EN_PHONE_CONTEXT.search(before)):
        return _en_digits(number)
    pairs = len(number) in (3, 4) and not _has_leading_zero(number)
    if pairs and (_EN_ROOM_CONTEXT.search(before) or _EN_MODEL_CONTEXT.search(before)):
        return _en_pairs(number)
    return None


def _bare_number(match: re.Match[str], lang: Lang) -> str:
    sign, number = match["sign"], match["num"]
    text, start, end = match.string, match.start(), match.end()
    if not sign and "," not in number and "." not in number:
        before = text[max(0, start - 40) : start]
        said = _said_as_digits(number, before, lang)
        if said is not None:
            return said
        if _is_year(number):
            if lang == "en" and _EN_YEAR_CONTEXT.search(before):
                return _en_year(int(number))
            if lang == "zh" and _ZH_YEAR_NEXT.match(text, end):
                return _zh_digits(number)
        if lang == "zh" and number == "2" and _ZH_LIANG_NEXT.match(text, end):
            return "两"
    if _is_digit_string(number):
        return _sign_word(sign, lang) + _digits(number, lang)
    return _signed(sign, number, lang)


def _year_range(match: re.Match[str], lang: Lang) -> str | None:
    first, second = match["num"], match["num2"]
    if not (_is_year(first) and _is_year(second)):
        return None
    if lang == "en" and all(1900 <= int(n) <= 2099 for n in (first, second)):
        return f"{_en_year(int(first))} to {_en_year(int(second))}"
    if lang == "zh" and _ZH_YEAR_NEXT.match(match.string, match.end()):
        return f"{_zh_digits(first)}到{_zh_digits(second)}"
    return None


def _range(match: re.Match[str], unit: _Unit | None, lang: Lang) -> str:
    sign, first, sign2, second = match["sign"], match["num"], match["sign2"], match["num2"]
    phone = unit is None and not sign and not sign2 and len(first) == 3 and len(second) == 4
    if phone or _has_leading_zero(first) or _has_leading_zero(second):  # "06-1234", "555-1234"
        return " ".join(
            _digits(n, lang) if n.isdigit() else _number(n, lang) for n in (first, second)
        )
    to = " to " if lang == "en" else "到"
    if unit is None:
        years = None if sign or sign2 else _year_range(match, lang)
        return years or _signed(sign, first, lang) + to + _signed(sign2, second, lang)
    if unit.kind == "money":
        currency = _currency_for(match["unit"])
        return _signed(sign, first, lang) + to + _money(sign2, second, currency, lang)
    if lang == "zh" and (unit.zh_prefix or (unit.kind == "temperature" and sign)):
        # 百分之二十到百分之二十五, 零下五到零下三摄氏度: each end keeps its own marker.
        left = _with_unit(sign, first, unit, lang).removesuffix(unit.zh)
        return left + to + _with_unit(sign2, second, unit, lang)
    return _signed(sign, first, lang) + to + _with_unit(sign2, second, unit, lang)


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
            rf"\b(?P<month>{_MONTH_ALT}\.?)\s(?P<d>[0-9]{{1,2}})(?:st|nd|rd|th)?"
            r"(?![0-9A-Za-z]|[:.,][0-9])"
        ),
        _render_month_day,
    ),
    _Rule(
        "day_month",
        re.compile(rf"(?<![0-9])(?P<d>[0-9]{{1,2}})(?:st|nd|rd|th)?(?=\s{_MONTH_ALT}\b)"),
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
            rf"(?:[ \u00a0\u202f]?(?P<unit>{_UNIT_ALT}))?"
        ),
        _render_quantity,
    ),
)


def _span_lang(text: str, start: int, end: int, default: Lang) -> Lang:
    """Chinese for a number touching a CJK character (spaces skipped), else ``default``."""
    if any(_is_cjk(char) for char in text[start:end]):
        return "zh"
    before = start - 1
    while before >= 0 and text[before].isspace():
        before -= 1
    after = end
    while after < len(text) and text[after].isspace():
        after += 1
    if (before >= 0 and _is_cjk(text[before])) or (after < len(text) and _is_cjk(text[after])):
        return "zh"
    return default


def _pad(spoken: str, text: str, start: int, end: int) -> str:
    """Keep English words apart from Latin letters they were glued to ("CO2" -> "CO two")."""
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


def normalize(text: str, lang: str | None = None, *, date_order: DateOrder = "dmy") -> str:
    """Return ``text`` with every number, time, date, unit and amount spelled out in words.

    ``lang`` ("en", "zh", a tag such as "zh-CN", or None to detect) is the reading for numbers that
    do not touch CJK characters; numbers next to CJK characters are always read in Chinese.
    ``date_order`` reads numeric dates such as "1/12" or "01/12/2026" day first (1 December) or
    month first (January 12th). Raises ValueError for a language other than English or Chinese.
    """
    rules = _RULES_BY_ORDER[date_order]
    default = _resolve_lang(lang) or detect_language(text)
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
            span_lang = _span_lang(text, found.start(), found.end(), default)
            spoken = rules[index].render(found, span_lang)
            if spoken is not None:
                if span_lang == "en":
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
    result = "".join(pieces)
    if result != text:
        _LOGGER.debug("normalized %r -> %r (%s)", text[:80], result[:80], default)
    return result
