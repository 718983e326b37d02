"""The units and currencies the number rules know, with their English and Chinese names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal


@dataclass(frozen=True)
class Currency:
    en_major: tuple[str, str]
    """English name, singular and plural."""
    en_minor: tuple[str, str] | None
    """Name of the hundredth (singular, plural); None reads the amount as a decimal."""
    zh: str


_EURO = Currency(("euro", "euros"), ("cent", "cents"), "欧元")
_DOLLAR = Currency(("dollar", "dollars"), ("cent", "cents"), "美元")
_POUND = Currency(("pound", "pounds"), ("penny", "pence"), "英镑")
_YUAN = Currency(("yuan", "yuan"), None, "元")


def currency_for(symbol: str) -> Currency:
    if symbol in ("€", "EUR"):
        return _EURO
    if symbol in ("£", "GBP"):
        return _POUND
    if symbol in ("¥", "￥", "CNY", "RMB"):
        return _YUAN
    return _DOLLAR


UnitKind = Literal["plain", "percent", "temperature", "money"]


@dataclass(frozen=True)
class Unit:
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
    Unit("%|％", "percent", ("percent", "percent"), "百分之", zh_prefix=True),
    Unit("°[ ]?C|℃", "temperature", ("degree Celsius", "degrees Celsius"), "摄氏度"),
    Unit("°[ ]?F|℉", "temperature", ("degree Fahrenheit", "degrees Fahrenheit"), "华氏度"),
    Unit("°", "temperature", ("degree", "degrees"), "度"),
    Unit("度", "temperature", ("degree", "degrees"), "度"),
    Unit("€|EUR", "money", ("euro", "euros"), "欧元"),
    Unit("£|GBP", "money", ("pound", "pounds"), "英镑"),
    Unit("USD", "money", ("dollar", "dollars"), "美元"),
    Unit("CNY|RMB", "money", ("yuan", "yuan"), "元"),
    Unit("km/h|kmh|kph", "plain", ("kilometer per hour", "kilometers per hour"), "公里每小时"),
    Unit("m/s", "plain", ("meter per second", "meters per second"), "米每秒"),
    Unit("mph", "plain", ("mile per hour", "miles per hour"), "英里每小时"),
    Unit(
        "[µμu]g/m[³3]",
        "plain",
        ("microgram per cubic meter", "micrograms per cubic meter"),
        "微克每立方米",
    ),
    Unit("kWh|kwh|KWh|KWH", "plain", ("kilowatt hour", "kilowatt hours"), "千瓦时"),
    Unit("MWh", "plain", ("megawatt hour", "megawatt hours"), "兆瓦时"),
    Unit("mAh", "plain", ("milliamp hour", "milliamp hours"), "毫安时"),
    Unit("Wh", "plain", ("watt hour", "watt hours"), "瓦时"),
    Unit("kW", "plain", ("kilowatt", "kilowatts"), "千瓦"),
    Unit("MW", "plain", ("megawatt", "megawatts"), "兆瓦"),
    Unit("W", "plain", ("watt", "watts"), "瓦"),
    Unit("mA", "plain", ("milliamp", "milliamps"), "毫安"),
    Unit("A", "plain", ("amp", "amps"), "安"),
    Unit("kV", "plain", ("kilovolt", "kilovolts"), "千伏"),
    Unit("V", "plain", ("volt", "volts"), "伏"),
    Unit("kHz", "plain", ("kilohertz", "kilohertz"), "千赫兹"),
    Unit("Hz", "plain", ("hertz", "hertz"), "赫兹"),
    # Chinese weather reports say 一千零一十三百帕; 两百帕 would sound like 200 Pa.
    Unit("hPa", "plain", ("hectopascal", "hectopascals"), "百帕", liang=False),
    Unit("kPa", "plain", ("kilopascal", "kilopascals"), "千帕"),
    Unit("Pa", "plain", ("pascal", "pascals"), "帕"),
    Unit("mbar", "plain", ("millibar", "millibars"), "毫巴"),
    Unit("bar", "plain", ("bar", "bar"), "巴"),
    Unit("m²", "plain", ("square meter", "square meters"), "平方米"),
    Unit("m³", "plain", ("cubic meter", "cubic meters"), "立方米"),
    Unit("km", "plain", ("kilometer", "kilometers"), "公里"),
    Unit("cm", "plain", ("centimeter", "centimeters"), "厘米"),
    Unit("mm", "plain", ("millimeter", "millimeters"), "毫米"),
    Unit("kg", "plain", ("kilogram", "kilograms"), "公斤"),
    Unit("mg", "plain", ("milligram", "milligrams"), "毫克"),
    Unit("ml|mL", "plain", ("milliliter", "milliliters"), "毫升"),
    Unit("lux|lx", "plain", ("lux", "lux"), "勒克斯"),
    Unit("ppm", "plain", ("part per million", "parts per million"), "百万分之", zh_prefix=True),
    Unit("ppb", "plain", ("part per billion", "parts per billion"), "十亿分之", zh_prefix=True),
    Unit("dB", "plain", ("decibel", "decibels"), "分贝"),
    Unit("ms", "plain", ("millisecond", "milliseconds"), "毫秒"),
    Unit("min|mins", "plain", ("minute", "minutes"), "分钟"),
    Unit("hr|hrs", "plain", ("hour", "hours"), "小时"),
    Unit("sec|secs", "plain", ("second", "seconds"), "秒"),
    Unit("m", "plain", ("meter", "meters"), "米"),
    Unit("g", "plain", ("gram", "grams"), "克"),
    Unit("l|L", "plain", ("liter", "liters"), "升"),
    Unit("h", "plain", ("hour", "hours"), "小时"),
    Unit("s", "plain", ("second", "seconds"), "秒"),
)


def _unit_regex(unit: Unit) -> str:
    # A unit written in letters must end the word: "5 m" is meters, "5 minutes" is not.
    if unit.pattern[-1].isascii() and unit.pattern[-1].isalpha():
        return f"(?:{unit.pattern})(?![A-Za-z])"
    return f"(?:{unit.pattern})"


_UNIT_MATCHERS: Final = tuple((re.compile(_unit_regex(u)), u) for u in _UNITS)
UNIT_ALT = "|".join(_unit_regex(u) for u in _UNITS)


def find_unit(text: str) -> Unit:
    for matcher, unit in _UNIT_MATCHERS:
        if matcher.fullmatch(text):
            return unit
    raise LookupError(text)  # unreachable: the unit was matched by the same patterns
