"""Numbers, times, dates and units are spelled out in English and Chinese before synthesis."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tts_bridge.text.normalize import DateOrder, detect_language, normalize

ASCII_DIGIT = re.compile(r"[0-9]")

ENGLISH = [
    # temperatures
    ("The living room is 21.5 °C.", "The living room is twenty-one point five degrees Celsius."),
    ("Outside it is -3 °C.", "Outside it is minus three degrees Celsius."),
    ("Freezer at -18°C", "Freezer at minus eighteen degrees Celsius"),
    ("The oven is at 180°C", "The oven is at one hundred and eighty degrees Celsius"),
    ("The pool is 70°F.", "The pool is seventy degrees Fahrenheit."),
    ("It is 1 °C outside", "It is one degree Celsius outside"),
    ("Trend: 21.50 °C", "Trend: twenty-one point five zero degrees Celsius"),
    ("Set the thermostat to 21", "Set the thermostat to twenty-one"),
    ("Keep the bedroom at 18-20°C", "Keep the bedroom at eighteen to twenty degrees Celsius"),
    # percentages
    ("Battery at 15%", "Battery at fifteen percent"),
    ("Humidity is 45%.", "Humidity is forty-five percent."),
    ("The phone battery is at 0.5%", "The phone battery is at zero point five percent"),
    ("Keep humidity at 40-60%", "Keep humidity at forty to sixty percent"),
    # times
    ("Washing machine finished at 7:30 pm", "Washing machine finished at seven thirty p m"),
    ("Wake-up alarm at 07:30", "Wake-up alarm at seven thirty"),
    ("The bus leaves at 19:05.", "The bus leaves at seven oh five p m."),
    ("Dinner at 19:00", "Dinner at seven p m"),
    ("School starts at 8:00", "School starts at eight o'clock"),
    ("Lights off at 00:00", "Lights off at midnight"),
    ("Backup ran at 00:15", "Backup ran at twelve fifteen a m"),
    ("Bins out at 6:45 a.m. tomorrow", "Bins out at six forty-five a m tomorrow"),
    ("Quiet hours start at 10 PM.", "Quiet hours start at ten p m."),
    ("Heating runs 06:00-08:30", "Heating runs six o'clock to eight thirty"),
    # dates and years
    ("Trash day is 2026-11-30", "Trash day is November thirtieth, twenty twenty-six"),
    ("Appointment on 30/11/2026", "Appointment on November thirtieth, twenty twenty-six"),
    ("Invoice due 11/30/2026", "Invoice due November thirtieth, twenty twenty-six"),
    ("Meeting on November 30th", "Meeting on November thirtieth"),
    ("Birthday on 30 November", "Birthday on the thirtieth of November"),
    ("The house was built in 1998.", "The house was built in nineteen ninety-eight."),
    ("Contract ends in 2026", "Contract ends in twenty twenty-six"),
    ("Music from the 1990s", "Music from the nineteen nineties"),
    # digit strings
    (
        "Call 0612345678 when ready",
        "Call zero six one two three four five six seven eight when ready",
    ),
    ("Call +31 6 12345678", "Call plus three one six one two three four five six seven eight"),
    ("Your code is 4821", "Your code is four eight two one"),
    ("Package 12345 has arrived", "Package one two three four five has arrived"),
    ("Router IP is 192.168.1.1", "Router IP is one nine two dot one six eight dot one dot one"),
    # energy and electricity
    (
        "Solar produced 1,250 kWh this year",
        "Solar produced one thousand two hundred and fifty kilowatt hours this year",
    ),
    ("Consumption today: 12.4 kWh", "Consumption today: twelve point four kilowatt hours"),
    ("The dryer draws 2500 W", "The dryer draws two thousand five hundred watts"),
    ("Solar output 3.5 kW", "Solar output three point five kilowatts"),
    ("Grid voltage 230 V", "Grid voltage two hundred and thirty volts"),
    ("The charger delivers 16 A", "The charger delivers sixteen amps"),
    # weather, distance, weight, air
    ("Wind speed 25 km/h", "Wind speed twenty-five kilometers per hour"),
    ("The car is 5 km away", "The car is five kilometers away"),
    ("Rain today: 12 mm", "Rain today: twelve millimeters"),
    ("Expect 10-15 cm of snow", "Expect ten to fifteen centimeters of snow"),
    ("Snow depth 1 cm", "Snow depth one centimeter"),
    ("The robot is 2 m from the dock", "The robot is two meters from the dock"),
    ("Bathroom scale: 72.5 kg", "Bathroom scale: seventy-two point five kilograms"),
    ("Pressure is 1013 hPa", "Pressure is one thousand and thirteen hectopascals"),
    ("Light level 300 lux, desk 50 lx", "Light level three hundred lux, desk fifty lux"),
    ("CO2 at 800 ppm, open a window", "CO two at eight hundred parts per million, open a window"),
    ("PM2.5 is 12 µg/m³", "PM two point five is twelve micrograms per cubic meter"),
    ("Noise level 45 dB", "Noise level forty-five decibels"),
    # money
    ("The refill costs €3.50", "The refill costs three euros and fifty cents"),
    ("Your order total is $9.99.", "Your order total is nine dollars and ninety-nine cents."),
    ("Electricity costs €0.35 per unit", "Electricity costs thirty-five cents per unit"),
    ("The bill is 3,50 €", "The bill is three euros and fifty cents"),
    ("That is £1.01", "That is one pound and one penny"),
    ("Budget: $1,250", "Budget: one thousand two hundred and fifty dollars"),
    # ordinals, ranges, durations, plain numbers
    ("This is your 3rd reminder", "This is your third reminder"),
    ("The lift is on the 21st floor", "The lift is on the twenty-first floor"),
    ("Parcel #3 arrived", "Parcel number three arrived"),
    ("10-15 minutes left", "ten to fifteen minutes left"),
    ("The window has been open for 2 h", "The window has been open for two hours"),
    ("The laundry needs 45 min more", "The laundry needs forty-five minutes more"),
    ("Reading 3 of 10", "Reading three of ten"),
    ("1,000,000 steps!", "one million steps!"),
    ("Parking level -1", "Parking level minus one"),
    # times: a 24-hour time is said the 12-hour way
    ("The heating goes off at 23:00.", "The heating goes off at eleven p m."),
    ("Quiet from 22:30", "Quiet from ten thirty p m"),
    ("Lunch at 12:30", "Lunch at twelve thirty"),
    # slashes: a date, a fraction, a score, all the time; never "slash"
    ("Presents on 12/24", "Presents on December twenty-fourth"),
    ("The tank is 3/4 full", "The tank is three quarters full"),
    ("Rated 8/10 stars", "Rated eight out of ten stars"),
    ("Monitoring runs 24/7", "Monitoring runs twenty-four seven"),
    # phone, emergency, room and model numbers
    ("In an emergency call 911", "In an emergency call nine one one"),
    ("Dial 112 for help", "Dial one one two for help"),
    ("Call 555-1234 now", "Call five five five one two three four now"),
    ("Room 204 is unlocked", "Room two oh four is unlocked"),
    ("Flat 1201 has a parcel", "Flat twelve oh one has a parcel"),
    ("Zone 3 is armed", "Zone three is armed"),
    ("The RTX 3090 is at 80°C", "The RTX thirty ninety is at eighty degrees Celsius"),
    # durations, large numbers, negative ranges
    ("Rinse for 30 s", "Rinse for thirty seconds"),
    ("Wait 30s", "Wait thirty seconds"),
    ("The timer has 90 sec left", "The timer has ninety seconds left"),
    ("Music from the 90s", "Music from the nineties"),
    ("Latency 250 ms", "Latency two hundred and fifty milliseconds"),
    ("Population 2,500,000", "Population two million five hundred thousand"),
    ("Tonight -5-0 °C", "Tonight minus five to zero degrees Celsius"),
    ("Rain: 5-7 mm", "Rain: five to seven millimeters"),
    ("Fill 10 l of water", "Fill ten liters of water"),
    ("It costs ¥500", "It costs five hundred yuan"),
    ("That is £2.05", "That is two pounds and five pence"),
    ("Speed 30 mph", "Speed thirty miles per hour"),
    # untouched
    ("Visit example.com today", "Visit example.com today"),
]

CHINESE = [
    # temperatures
    ("客厅温度21.5度，湿度45%。", "客厅温度二十一点五度，湿度百分之四十五。"),
    ("-5℃", "零下五摄氏度"),
    ("室外温度-3℃，注意保暖。", "室外温度零下三摄氏度，注意保暖。"),
    ("卧室温度22°C", "卧室温度二十二摄氏度"),
    ("泳池水温70°F", "泳池水温七十华氏度"),
    ("冰箱冷冻室-18度", "冰箱冷冻室零下十八度"),
    ("夜间温度-2℃", "夜间温度零下两摄氏度"),
    ("空调设定26度", "空调设定二十六度"),
    ("卧室保持18-20℃", "卧室保持十八到二十摄氏度"),
    # percentages
    ("电量剩余15%", "电量剩余百分之十五"),
    ("电池电量0.5%", "电池电量百分之零点五"),
    ("湿度保持在40-60%", "湿度保持在百分之四十到百分之六十"),
    # times
    ("明天7:30叫醒我", "明天七点三十分叫醒我"),
    ("现在是19:05", "现在是十九点零五分"),
    ("会议在14:00开始", "会议在十四点开始"),
    ("下午2:30取快递", "下午两点三十分取快递"),
    ("闹钟设在06:05", "闹钟设在六点零五分"),
    ("洗衣机将在8:15 pm完成", "洗衣机将在晚上八点十五分完成"),
    ("晚上7pm关灯", "晚上七点关灯"),
    ("0:00自动备份", "零点自动备份"),
    ("10:30-11:00开会", "十点三十分到十一点开会"),
    # dates and years
    ("2026年11月30日有雨", "二零二六年十一月三十日有雨"),
    ("垃圾清运日期2026-11-30", "垃圾清运日期二零二六年十一月三十日"),
    ("保修到2026年", "保修到二零二六年"),
    # digit strings
    ("验证码 4821", "验证码 四八二一"),
    ("您的验证码是4821，五分钟内有效", "您的验证码是四八二一，五分钟内有效"),
    ("快递员电话13812345678", "快递员电话一三八一二三四五六七八"),
    ("取件码0612", "取件码零六一二"),
    ("路由器地址192.168.1.1", "路由器地址一九二点一六八点一点一"),
    # energy and electricity
    ("总用电量1,250千瓦时", "总用电量一千二百五十千瓦时"),
    ("今日用电12.4kWh", "今日用电十二点四千瓦时"),
    ("空调功率2500W", "空调功率两千五百瓦"),
    ("光伏发电3.5kW", "光伏发电三点五千瓦"),
    ("电压230V", "电压二百三十伏"),
    ("充电电流16A", "充电电流十六安"),
    # weather, distance, weight, air
    ("风速25km/h", "风速二十五公里每小时"),
    ("距离家5km", "距离家五公里"),
    ("降雨量12mm", "降雨量十二毫米"),
    ("积雪1cm", "积雪一厘米"),
    ("预计降雪10-15cm", "预计降雪十到十五厘米"),
    ("扫地机器人距离充电座2m", "扫地机器人距离充电座两米"),
    ("体重72.5kg", "体重七十二点五公斤"),
    ("气压1013hPa", "气压一千零一十三百帕"),
    ("光照300lux", "光照三百勒克斯"),
    ("二氧化碳浓度800ppm", "二氧化碳浓度百万分之八百"),
    ("PM2.5浓度12µg/m³", "PM二点五浓度十二微克每立方米"),
    ("噪音45dB", "噪音四十五分贝"),
    # money
    ("电费€0.35每度", "电费零点三五欧元每度"),
    ("本月电费¥256.80", "本月电费二百五十六点八元"),
    ("订单金额$9.99", "订单金额九点九九美元"),
    # ordinals, counts, ranges, plain numbers
    ("这是第3次提醒", "这是第三次提醒"),
    ("这是3rd提醒", "这是第三提醒"),
    ("客厅有2个灯没关", "客厅有两个灯没关"),
    ("窗户已经开了2小时", "窗户已经开了两小时"),
    ("洗衣还需要45分钟", "洗衣还需要四十五分钟"),
    ("今天走了12,000步", "今天走了一万二千步"),
    ("楼层-1", "楼层负一"),
    ("2楼卫生间的灯开着", "二楼卫生间的灯开着"),
    ("温度２１度", "温度二十一度"),
    ("等待30s", "等待三十秒"),
    ("圣诞节是12/24", "圣诞节是十二月二十四日"),
    ("水箱还有3/4满", "水箱还有四分之三满"),
    ("房间号204", "房间号二零四"),
    ("价格£2.05", "价格二点零五英镑"),
    ("速度30mph", "速度三十英里每小时"),
    ("延迟250ms", "延迟二百五十毫秒"),
    ("水1 l", "水一升"),
]

MIXED = [
    # (text, lang, expected): a number touching CJK is Chinese; others follow lang or the majority
    (
        "Living room 温度21.5度, humidity 45%",
        None,
        "Living room 温度二十一点五度, humidity forty-five percent",
    ),
    ("客厅 temperature is 21 degrees", None, "客厅 temperature is twenty-one degrees"),
    ("打开 Philips Hue 灯，亮度 80%", None, "打开 Philips Hue 灯，亮度 百分之八十"),
    ("电视音量 set to 25", None, "电视音量 set to 二十五"),
    ("Kitchen 厨房 22°C", None, "Kitchen 厨房 二十二摄氏度"),
    ("温度21度 and 30%", "en", "温度二十一度 and thirty percent"),
    ("Battery at 15%", "zh", "Battery at 百分之十五"),
    ("明天7:30 wake me up", "en", "明天七点三十分 wake me up"),
    ("Alarm at 7:30，明天见", "en", "Alarm at 七点三十分，明天见"),
]


@pytest.mark.parametrize(("text", "expected"), ENGLISH)
def test_english(text: str, expected: str) -> None:
    assert normalize(text, "en") == expected
    assert normalize(text) == expected  # English text is detected as English


@pytest.mark.parametrize(("text", "expected"), CHINESE)
def test_chinese(text: str, expected: str) -> None:
    assert normalize(text, "zh") == expected
    if re.search(r"[\u4e00-\u9fff]", text):  # every number here touches CJK: lang is moot
        assert normalize(text) == expected
        assert normalize(text, "en") == expected


@pytest.mark.parametrize(
    ("text", "order", "expected"),
    [
        ("Bins out on 1/12", "dmy", "Bins out on December first"),
        ("Bins out on 1/12", "mdy", "Bins out on January twelfth"),
        ("Due 01/12/2026", "dmy", "Due December first, twenty twenty-six"),
        ("Due 01/12/2026", "mdy", "Due January twelfth, twenty twenty-six"),
        # only one order is a valid date: taken whatever the setting
        ("Presents on 12/24", "dmy", "Presents on December twenty-fourth"),
        ("Presents on 24/12", "mdy", "Presents on December twenty-fourth"),
        ("Invoice due 11/30/2026", "dmy", "Invoice due November thirtieth, twenty twenty-six"),
    ],
)
def test_date_order(text: str, order: DateOrder, expected: str) -> None:
    assert normalize(text, "en", date_order=order) == expected


@pytest.mark.parametrize(("text", "lang", "expected"), MIXED)
def test_mixed(text: str, lang: str | None, expected: str) -> None:
    assert normalize(text, lang) == expected


def test_tables_are_large_enough() -> None:
    assert len(ENGLISH) >= 40
    assert len(CHINESE) >= 40


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("今天天气很好", "zh"),
        ("Hello world", "en"),
        ("", "en"),
        ("12345", "en"),
        ("客厅 light", "zh"),
        ("Turn on the 客厅 light", "en"),
    ],
)
def test_detect_language(text: str, expected: str) -> None:
    assert detect_language(text) == expected


@pytest.mark.parametrize(("lang", "expected"), [("zh-CN", "百分之五"), ("en_US", "five percent")])
def test_language_tags(lang: str, expected: str) -> None:
    assert normalize("5%", lang) == expected
    assert normalize("5%", "auto") == "five percent"


def test_unsupported_language_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported language 'de'"):
        normalize("5%", "de")


TEMPLATES = (
    "Value {} now",
    "The sensor reads {}.",
    "{}% battery",
    "{} kWh today",
    "{} °C outside",
    "Pay ${}",
    "at {}",
    "温度{}度",
    "电量{}%",
    "第{}名",
    "共{}个",
    "价格€{}",
)


@given(st.integers(min_value=-(10**40), max_value=10**40), st.sampled_from(TEMPLATES))
def test_any_integer_is_spelled_out(value: int, template: str) -> None:
    text = template.format(value)
    for lang in (None, "en", "zh"):
        assert not ASCII_DIGIT.search(normalize(text, lang))


@given(
    st.decimals(
        allow_nan=False, allow_infinity=False, places=4, min_value=-(10**9), max_value=10**9
    ),
    st.sampled_from(TEMPLATES),
)
def test_any_decimal_is_spelled_out(value: Decimal, template: str) -> None:
    text = template.format(format(value, "f"))
    for lang in (None, "en", "zh"):
        assert not ASCII_DIGIT.search(normalize(text, lang))


@given(st.text())
def test_any_text_loses_its_digits_and_never_raises(text: str) -> None:
    for lang in (None, "en", "zh"):
        assert not ASCII_DIGIT.search(normalize(text, lang))


@given(st.text(alphabet=st.characters(exclude_characters="0123456789０１２３４５６７８９")))
def test_text_without_digits_is_unchanged(text: str) -> None:
    assert normalize(text) == text


@given(st.text(alphabet="0123456789,.:/-+~–%€$#° CkWhmapstNov年度个第点：", max_size=80))
def test_number_dense_text_loses_its_digits(text: str) -> None:
    for lang in (None, "en", "zh"):
        assert not ASCII_DIGIT.search(normalize(text, lang))


@pytest.mark.parametrize(
    "text",
    [
        "1" * 5000 + " kWh",  # int() refuses more than 4300 digits
        ",".join(["123"] * 2000),
        "$" + "1" * 5000,
        "0" * 5000 + "5.5",
        "7" * 400 + " W",  # num2words overflows at 10**306
        "0.0-00",  # a range with a leading zero and a decimal, found by hypothesis
    ],
)
def test_odd_and_huge_numbers_never_raise(text: str) -> None:
    for lang in ("en", "zh"):
        assert not ASCII_DIGIT.search(normalize(text, lang))
