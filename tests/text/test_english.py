"""What an English-only voice is given: every number, unit, abbreviation and Han name as words."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tts_bridge.text.english import for_english_voice

# The announcements the default voices misread when given raw text, and their readings.
CASES = [
    # units with and without a number
    ("It is 21.5°C outside.", "It is twenty-one point five degrees Celsius outside."),
    ("Solar made 14.2 kWh today.", "Solar made fourteen point two kilowatt hours today."),
    ("Gusts of 65 km/h tonight.", "Gusts of sixty-five kilometers per hour tonight."),
    ("12 mm of rain expected.", "twelve millimeters of rain expected."),
    ("The oven draws 2100 W.", "The oven draws two thousand one hundred watts."),
    ("The price per kWh is 31 cents.", "The price per kilowatt hour is thirty-one cents."),
    ("Power is 0.35 €/kWh now.", "Power is thirty-five cents per kilowatt hour now."),
    ("kWh used today: 9", "kilowatt hours used today: nine"),
    ("Set the unit to °F.", "Set the unit to degrees Fahrenheit."),
    # money
    ("Milk costs $3.50.", "Milk costs three dollars and fifty cents."),
    ("The parcel fee is €12.", "The parcel fee is twelve euros."),
    # dates, weekdays, times
    ("Bins go out on 2026-12-01.", "Bins go out on December first, twenty twenty-six."),
    ("Party on Mon 12/24.", "Party on Monday December twenty-fourth."),
    ("Lights off at 23:00.", "Lights off at eleven p m."),
    # phone, rooms
    ("In an emergency, call 911.", "In an emergency, call nine one one."),
    ("Room 204 is still open.", "Room two oh four is still open."),
    # abbreviations: titles, streets, words; a final dot stays
    ("Dr. Miller is at the door.", "Doctor Miller is at the door."),
    ("Mr. and Mrs. Smith are here.", "Mister and Missus Smith are here."),
    ("Prof. Lee, Gen. Grant and Capt. Hook", "Professor Lee, General Grant and Captain Hook"),
    ("St. Mary's bells ring at 12:00.", "Saint Mary's bells ring at twelve o'clock."),
    ("The parcel is at 10 Baker St.", "The parcel is at ten Baker Street."),
    ("Oak Ave. is closed.", "Oak Avenue is closed."),
    ("approx. 5 min left", "approximately five minutes left"),
    ("Close a window, e.g. the kitchen one.", "Close a window, for example the kitchen one."),
    ("Arsenal vs. Chelsea starts at 20:00.", "Arsenal versus Chelsea starts at eight p m."),
    ("See Fig. 3 and parcel No. 5.", "See figure three and parcel number five."),
    ("Switch to heat/cool.", "Switch to heat or cool."),
    # Chinese inside an English sentence: pinyin, a name's surname apart
    ("Call from 王小明 at 7:30 pm.", "Call from Wang Xiaoming at seven thirty p m."),
    ("Turn on the 客厅 light.", "Turn on the Ke Ting light."),
    ("王小明，your taxi is here", "Wang Xiaoming, your taxi is here"),
    # untouched, or read as words
    ("The washing machine has finished.", "The washing machine has finished."),
    ("See https://example.com/page1 for details.", "See https://example.com/page1 for details."),
    ("Mail help@example.org today.", "Mail help@example.org today."),
    ("The RTX 3090 is busy.", "The RTX thirty ninety is busy."),
    ("The Dr said so.", "The Dr said so."),
]


@pytest.mark.parametrize(("text", "spoken"), CASES)
def test_for_english_voice(text: str, spoken: str) -> None:
    assert for_english_voice(text) == spoken


def test_month_first_dates() -> None:
    assert for_english_voice("Due 1/12.", date_order="mdy") == "Due January twelfth."
    assert for_english_voice("Due 1/12.") == "Due December first."


def test_unchanged_text_is_the_same_string() -> None:
    # The cache key of a sentence the front end leaves alone must not change.
    text = "The front door is open."
    assert for_english_voice(text) is text


@given(
    st.text(
        alphabet="0123456789,.:/-%€$£°CkWhmsp王小明 Dr.St.vsa",
        max_size=60,
    )
)
def test_nothing_left_to_spell(text: str) -> None:
    assert not re.search(r"[0-9\u4e00-\u9fff]", for_english_voice(text))
