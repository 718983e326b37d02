"""A long sentence streamed clause by clause, for an engine without a stream of its own.

The first clause is made alone, so the audio starts soon; then as many of the next together as
the machine makes (at its speed on this sentence so far) in half the time the audio already sent
still plays (`audio.pacing`). Every join is a clause said without the sentence around it, which
costs some intelligibility (Kokoro's tones at a clause's start above all), so a fast machine
makes the rest at once, and only a slow one joins more. The silence at each join is trimmed to
a comma's pause and the edges faded, so the joins neither gap nor click.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence

import numpy as np

from tts_bridge.audio.pacing import PlayClock, take_within
from tts_bridge.engines.base import FloatAudio
from tts_bridge.text.sentences import join_clauses, speech_units

JOIN_PAUSE_S = 0.08
"""At most this much of a clause's silence is kept at a join (each side): a comma's pause."""
_FADE_S = 0.003
_SILENT = 1e-3


def by_clause(
    clauses: Sequence[str],
    sample_rate: int,
    say: Callable[[str], FloatAudio | None],
    clock: Callable[[], float] = time.perf_counter,
) -> Generator[FloatAudio, None, None]:
    """The sentence `clauses` make, in pieces as a streaming engine yields them (each followed
    by an empty chunk when more will follow); `say` makes a piece's audio (None: nothing in it
    to say)."""
    units = [speech_units(c) for c in clauses]
    playing = PlayClock(clock)
    spent_s, made_units, done = 0.0, 0, 0
    while done < len(clauses):
        count = 1
        if done:
            per_unit_s = spent_s / max(made_units, 1)
            count = take_within([u * per_unit_s for u in units[done:]], playing.budget_s())
        first, last = done == 0, done + count == len(clauses)
        began = clock()
        audio = say(join_clauses(clauses[done : done + count]))
        spent_s += clock() - began
        made_units += sum(units[done : done + count])
        done += count
        if audio is None:
            continue
        out = join_edges(audio, sample_rate, start=not first, end=not last)
        yield out
        playing.sent(out.size / sample_rate)
        if not last:
            yield np.zeros(0, dtype=np.float32)


def join_edges(audio: FloatAudio, sample_rate: int, *, start: bool, end: bool) -> FloatAudio:
    """A clause's audio ready to be joined to its neighbours: at a join (`start`: its
    beginning, `end`: its end) its silence cut to JOIN_PAUSE_S and a short fade, so that
    clauses follow each other like the words of one sentence, without a gap or a click."""
    if audio.size == 0 or not (start or end):
        return audio
    loud = np.flatnonzero(np.abs(audio) > _SILENT)
    if loud.size == 0:
        return audio
    keep = int(JOIN_PAUSE_S * sample_rate)
    first = max(int(loud[0]) - keep, 0) if start else 0
    last = min(int(loud[-1]) + 1 + keep, audio.size) if end else audio.size
    out = np.array(audio[first:last], dtype=np.float32)
    fade = min(int(_FADE_S * sample_rate), out.size // 2)
    if fade:
        ramp = np.linspace(0.0, 1.0, fade, dtype=np.float32)
        if start:
            out[:fade] *= ramp
        if end:
            out[-fade:] *= ramp[::-1]
    return out
