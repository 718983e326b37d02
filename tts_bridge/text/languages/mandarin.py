"""Mandarin: how numbers are read ("cn2an", 两 where Mandarin says it), how much of a text is
Chinese (its Han characters), and what a Mandarin voice is given (numbers spelled out)."""

from __future__ import annotations

import re

import cn2an

from tts_bridge.text.numbers import DateOrder, is_year, spell
from tts_bridge.text.units import Currency, Unit

# cn2an.an2cn refuses integers of more than 16 digits: longer ones are read digit by digit.
_CN2AN_MAX_DIGITS = 16
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# Chinese measure words and units before which 2 is read 两.
_LIANG_NEXT = re.compile(
    r"\s?(?:个|位|台|盏|次|只|条|张|扇|把|层|间|辆|部|件|瓶|杯|本|块|份|种|天|周|星期|小时|分钟"
    r"|秒钟|点|公里|千米|米|公斤|千克|斤|升|倍|岁|名|人|项|首|遍|回|元|毛|年(?!级)|晚|顿|场|组|千|万|亿"
    r"|袋|桶|箱|盒|颗|粒|片|支|根|双|对|套|节|路)"
)
_YEAR_NEXT = re.compile(r"\s?年")
_LEADING_TWO = re.compile(r"^二(?=[千万亿])")
# A time already introduced by one of these needs no 上午/下午 from "am"/"pm".
_DAY_PERIOD_BEFORE = re.compile(r"(?:凌晨|早上|早晨|上午|中午|下午|傍晚|晚上|夜里|半夜)\s*$")


def _digits(digits: str) -> str:
    return str(cn2an.an2cn(digits, "direct"))


def _int(digits: str) -> str:
    value = digits.lstrip("0") or "0"
    if len(value) > _CN2AN_MAX_DIGITS:
        return _digits(digits)
    # cn2an writes 二千 and 二万; Mandarin says 两千, 两万, 两亿.
    return _LEADING_TWO.sub("两", str(cn2an.an2cn(value)))


def _clock_part(value: int) -> str:
    return "零" + _int(str(value)) if value < 10 else _int(str(value))


def _day_period(hour: int, ampm: str | None) -> str:
    """Chinese puts the part of the day before the time: "7:30 pm" is 晚上七点三十分."""
    if ampm == "a":
        return "凌晨" if hour == 12 or hour < 5 else "上午"
    if ampm == "p":
        return "中午" if hour == 12 else ("晚上" if hour >= 6 else "下午")
    return ""


class MandarinNumbers:
    """Numbers as written Chinese reads them: 七点三十分, 二零二六年, 百分之四十五."""

    pads_latin = False
    to = "到"
    plus = "加"
    dot = "点"
    all_the_time = "全天候"

    def digits(self, digits: str) -> str:
        return _digits(digits)

    def integer(self, digits: str) -> str:
        return _int(digits)

    def number(self, number: str) -> str:
        whole, _, fraction = number.replace(",", "").partition(".")
        words = _int(whole)
        return f"{words}点{_digits(fraction)}" if fraction else words

    def sign_word(self, sign: str | None) -> str:
        if not sign:
            return ""
        return "正" if sign == "+" else "负"

    def date(self, year: int, month: int, day: int | None) -> str:
        words = f"{_digits(str(year))}年{_int(str(month))}月"
        return words if day is None else f"{words}{_int(str(day))}日"

    def day_of_month(self, day: int, month: int) -> str:
        return f"{_int(str(month))}月{_int(str(day))}日"

    def fraction(self, numerator: int, denominator: int) -> str:
        return f"{_int(str(denominator))}分之{_int(str(numerator))}"

    def out_of(self, score: int, total: int) -> str:
        return self.fraction(score, total)

    def time(
        self, hour: int, minute: int, second: int | None, ampm: str | None, before: str
    ) -> str:
        said = _DAY_PERIOD_BEFORE.search(before)  # 晚上7pm: say it once
        period = "" if said else _day_period(hour, ampm)
        words = period + ("两" if hour == 2 else _int(str(hour))) + "点"
        if minute or second:
            words += _clock_part(minute) + "分"
        if second:
            words += _clock_part(second) + "秒"
        return words

    def money(self, sign: str | None, amount: str, currency: Currency) -> str:
        whole, _, fraction = amount.partition(".")
        fraction = fraction.rstrip("0")  # 三点五欧元: money is not read with trailing zeros
        number = f"{whole}.{fraction}" if fraction else whole
        return self.sign_word(sign) + self.number(number) + currency.zh

    def month_day(self, month: str, day: int) -> str:
        return f"{month} {_int(str(day))}日"

    def day_month(self, day: int, before: str) -> str | None:
        return None

    def ordinal(self, digits: str) -> str:
        return "第" + _int(digits)

    def hash_number(self, digits: str) -> str:
        return _int(digits) + "号"

    def decade(self, digits: str) -> str:
        year = digits if len(digits) == 4 else "19" + digits
        return _digits(year) + "年代"

    def with_unit(self, sign: str | None, number: str, unit: Unit) -> str:
        if unit.zh_prefix:
            return self.sign_word(sign) + unit.zh + self.number(number)
        words = "两" if number == "2" and unit.liang else self.number(number)
        if unit.kind == "temperature" and sign:
            return ("零上" if sign == "+" else "零下") + words + unit.zh
        return self.sign_word(sign) + words + unit.zh

    def unit_range(
        self, sign: str | None, first: str, sign2: str | None, second: str, unit: Unit
    ) -> str | None:
        if not (unit.zh_prefix or (unit.kind == "temperature" and sign)):
            return None
        # 百分之二十到百分之二十五, 零下五到零下三摄氏度: each end keeps its own marker.
        left = self.with_unit(sign, first, unit).removesuffix(unit.zh)
        return left + self.to + self.with_unit(sign2, second, unit)

    def said_as_digits(self, number: str, before: str) -> str | None:
        return None

    def special_number(self, number: str, before: str, text: str, end: int) -> str | None:
        if is_year(number) and _YEAR_NEXT.match(text, end):
            return _digits(number)
        if number == "2" and _LIANG_NEXT.match(text, end):
            return "两"
        return None

    def year_range(self, first: str, second: str, text: str, end: int) -> str | None:
        if _YEAR_NEXT.match(text, end):
            return f"{_digits(first)}到{_digits(second)}"
        return None


class Mandarin:
    """The Mandarin front end."""

    code = "zh"
    names = frozenset({"zh", "cmn", "chinese"})
    numbers = MandarinNumbers()

    @staticmethod
    def detect(text: str) -> int:
        # A Chinese character carries about as much speech as an English word (ChatTTS
        # compares them the same way).
        return len(_HAN.findall(text))

    def for_voice(self, text: str, *, date_order: DateOrder) -> str:
        return spell(text, self.numbers, self.numbers, date_order=date_order)


FRONT_END = Mandarin()
