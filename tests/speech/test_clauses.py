"""Long sentences rendered clause by clause for the doors that stream: the split, the join, and
the sentence cached whole under its own key (real voices, real cache)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tts_bridge.config import Settings, load_settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.clauses import JOIN_PAUSE_S, by_clause, join_edges
from tts_bridge.speech.rendering import AudioPart
from tts_bridge.speech.request import SpeechRequest
from tts_bridge.speech.synthesis import Synthesizer
from tts_bridge.text.sentences import join_clauses, speech_units, split_clauses

LONG = (
    "When you leave the house this morning, please remember that the kitchen window is "
    "still open, the heating is on in the living room, and the dog has not been fed yet."
)
CHINESE = "今天下午三点，客厅的窗户还开着，暖气也没有关，请记得在出门之前检查一下所有的门窗。"


def test_a_long_sentence_is_cut_after_its_commas() -> None:
    clauses = split_clauses(LONG)
    assert clauses == [
        "When you leave the house this morning,",
        "please remember that the kitchen window is still open,",
        "the heating is on in the living room,",
        "and the dog has not been fed yet.",
    ]
    assert " ".join(clauses) == LONG


def test_chinese_clauses_end_at_full_width_commas() -> None:
    clauses = split_clauses(CHINESE)
    assert len(clauses) >= 2
    assert all(c.endswith(("，", "、", "；", "。")) for c in clauses)
    assert "".join(clauses) == CHINESE


def test_short_sentences_numbers_and_short_clauses_stay_together() -> None:
    assert split_clauses("The front door has been open for five minutes.") == [
        "The front door has been open for five minutes."
    ]
    clauses = split_clauses(
        "Yes, it costs 1,000 euros, and that is a lot of money for such a small and simple thing.",
        min_units=16,
    )
    assert clauses[0] == "Yes, it costs 1,000 euros,"  # "Yes," alone is too short; 1,000 whole
    assert len(clauses) == 2


def test_a_join_keeps_a_comma_s_pause_and_starts_and_ends_at_zero() -> None:
    rate = 22050
    tone = 0.5 * np.sin(np.linspace(0, 400 * np.pi, rate)).astype(np.float32)
    silence = np.zeros(rate // 2, dtype=np.float32)
    clause = np.concatenate([silence, tone, silence])
    joined = join_edges(clause, rate, start=True, end=True)
    assert joined.size <= tone.size + 2 * int(JOIN_PAUSE_S * rate) + 2
    assert joined[0] == 0.0 and joined[-1] == 0.0
    # The sentence's own start and end are left as the engine made them.
    assert np.array_equal(join_edges(clause, rate, start=False, end=False), clause)


class _Machine:
    """A voice on a machine of a given speed, on a clock the test moves: saying a text takes
    `per_unit_s` per speech unit and makes 60 ms of audio per unit."""

    def __init__(self, per_unit_s: float) -> None:
        self.now = 0.0
        self.per_unit_s = per_unit_s
        self.said: list[str] = []

    def clock(self) -> float:
        return self.now

    def say(self, text: str) -> np.ndarray[Any, np.dtype[np.float32]]:
        self.said.append(text)
        self.now += speech_units(text) * self.per_unit_s
        return np.full(int(speech_units(text) * 0.06 * RATE), 0.5, dtype=np.float32)


RATE = 1000


@pytest.mark.parametrize(
    ("per_unit_s", "pieces"),
    [
        (0.001, [1, 3]),  # fast: the first clause, then the rest at once
        (0.025, [1, 1, 2]),  # slower: each piece within half of what is left to play
        (0.5, [1, 1, 1, 1]),  # slower than speech: one clause at a time
    ],
)
def test_the_first_clause_goes_alone_then_as_many_as_are_made_in_time(
    per_unit_s: float, pieces: list[int]
) -> None:
    clauses = split_clauses(LONG)
    machine = _Machine(per_unit_s)
    chunks = list(by_clause(clauses, RATE, machine.say, machine.clock))
    counts, done = [], 0
    for text in machine.said:  # how many clauses each piece said
        count = next(
            n for n in range(1, len(clauses) + 1) if join_clauses(clauses[done : done + n]) == text
        )
        counts.append(count)
        done += count
    assert counts == pieces and done == len(clauses)
    # Each piece is followed by an empty chunk, but the last.
    assert [c.size == 0 for c in chunks] == [False, True] * (len(pieces) - 1) + [False]


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp: Path = tmp_path_factory.mktemp("clauses")
    return load_settings(
        None, {"cache": {"dir": str(tmp / "cache")}, "synthesis": {"onnx_threads": 1}}, environ={}
    )


@pytest.fixture(scope="module")
def synth(settings: Settings) -> Synthesizer:
    return Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))


def test_a_streamed_long_sentence_goes_by_clause_and_is_cached_whole(synth: Synthesizer) -> None:
    # hibari has no stream of its own (Piper decodes its sentences in windows instead).
    # Warm: a first run's own costs would make the voice look slower than it is.
    synth.render("The voice is warm.", "heart", use_cache=False)
    plan = synth.plan(SpeechRequest(text=LONG, voice="heart"))
    assert not synth.renderer.is_cached(plan.voice, LONG)
    parts: list[AudioPart] = []
    streamed = synth.render_plan(plan, plan.voice, on_part=parts.append, streaming=True)
    # The first clause alone; hibari makes the rest long before the first has played.
    assert len(parts) == 2
    assert [p.last for p in parts] == [False] * (len(parts) - 1) + [True]
    joined = np.concatenate([p.pcm for p in parts])
    assert np.array_equal(joined, streamed.pcm)  # the parts are the answer, sample for sample
    # The sentence is in the cache under its usual key: a repeat is one hit, the same audio.
    assert synth.renderer.is_cached(plan.voice, LONG)
    again = synth.render_plan(plan, plan.voice)
    assert again.cached and np.array_equal(again.pcm, streamed.pcm)
    # No click at the joins: no jump between samples larger than the speech itself makes.
    steps = np.abs(np.diff(streamed.pcm.astype(np.int32)))
    bounds = np.cumsum([p.pcm.size for p in parts])[:-1]
    assert all(steps[b - 2 : b + 2].max() <= np.percentile(steps, 99.9) for b in bounds)


def test_without_a_streaming_door_the_sentence_is_rendered_whole(synth: Synthesizer) -> None:
    text = LONG.replace("dog", "cat")
    plan = synth.plan(SpeechRequest(text=text, voice="joe"))
    parts: list[AudioPart] = []
    synth.render_plan(plan, plan.voice, on_part=parts.append)
    assert len(parts) == 1


def test_with_clauses_off_a_streamed_long_sentence_is_rendered_whole(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp: Path = tmp_path_factory.mktemp("whole")
    settings = load_settings(
        None,
        {
            "cache": {"dir": str(tmp / "cache")},
            "synthesis": {"onnx_threads": 1, "stream_clauses": False},
        },
        environ={},
    )
    synth = Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))
    plan = synth.plan(SpeechRequest(text=LONG, voice="heart"))
    parts: list[AudioPart] = []
    synth.render_plan(plan, plan.voice, on_part=parts.append, streaming=True)
    assert len(parts) == 1 and parts[0].last


def test_only_a_sentence_the_listener_would_wait_for_is_made_in_pieces(synth: Synthesizer) -> None:
    # The first sentence is made in pieces (it starts the audio); the second is made whole
    # while the first, several seconds long, still plays: fewer joins, less work.
    text = f"{LONG} {LONG.replace('dog', 'cat')}"
    synth.render("The voice is warm.", "heart", use_cache=False)
    plan = synth.plan(SpeechRequest(text=text, voice="heart", use_cache=False))
    assert len(plan.sentences) == 2
    parts: list[AudioPart] = []
    synth.render_plan(plan, plan.voice, use_cache=False, on_part=parts.append, streaming=True)
    per_sentence = [sum(p.sentence == n for p in parts) for n in (0, 1)]
    assert per_sentence == [2, 1]
