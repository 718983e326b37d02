"""Background work for idle time: quality upgrades, pre-render requests, phrases, learned ones.

Every task is one sentence in one voice, rendered through the Synthesizer (so it lands in the
cache). Sources, first to last:
1. pre-render requests (`bridge/request/prerender`, in memory, bounded);
2. upgrades: sentences a live request got from the fast tier; the quality version is rendered
   and cached under its own key, after which lookups for the voice hit quality. Kept in a
   persistent index beside the cache, so a restart does not forget them;
3. the phrases (configured `phrases` / `phrases_file`, and those added at run time, see
   phrase_list.py) for the default voice;
4. learned sentences: asked at least `learn_min_count` times within `learn_window_s`.

Batching: for an engine with `synthesize_batch` (ChatTTS ONNX), the first sentence waiting takes
up to `idle_batch_size - 1` uncached sentences of the same voice from the same source along, and
they are rendered in one call (several texts in one code loop use the cores better than one).
A batch holds at most `BATCH_MAX_AUDIO_S` of expected speech; a longer sentence is rendered
alone, as before.

Interruption: a task whose engine stops for live work (`SynthesisInterruptedError`, see
`tts_bridge.engines.base.interruptible`) leaves its sentences queued; the next idle moment
renders them again from the start (a batch whole, which is another reason to keep it short).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tts_bridge.config import Settings
from tts_bridge.engines.base import BatchEngine, SynthesisInterruptedError, SynthesisOptions
from tts_bridge.engines.registry import UnknownVoiceError, Voice
from tts_bridge.speech.phrase_list import PhraseList
from tts_bridge.speech.synthesis import RequestError, Synthesizer, prepare_text
from tts_bridge.textlog import short, size

_LOGGER = logging.getLogger(__name__)

Kind = Literal["prerender", "upgrade", "phrase", "learned"]

BATCH_MAX_AUDIO_S = 10.0
"""Expected speech in one idle batch, in total (ChatTTS's estimate: 0.4 s per English word,
0.26 s per Chinese character, slower speeds longer). Live work interrupts a batch within a
step, but the batch then starts over: the bound keeps the work that can be lost small."""
BATCH_WINDOW = 8
"""How far (times the batch size) down the queue batch-mates are looked for."""


@dataclass(frozen=True)
class IdleItem:
    voice: str
    sentence: str
    kind: Kind


def read_phrases(settings: Settings) -> list[str]:
    """Phrases from the config list and the phrases file (one per line, '#' comments)."""
    phrases = list(settings.phrases)
    if settings.phrases_file is not None:
        path = Path(settings.phrases_file).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            _LOGGER.error("Cannot read phrases_file %s: %s", path, exc)
            lines = []
        phrases += [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    return phrases


class IdleWork:
    """Feeds the scheduler's idle thread one sentence at a time (thread-safe)."""

    def __init__(
        self, settings: Settings, synth: Synthesizer, phrases: PhraseList | None = None
    ) -> None:
        """`phrases`: the list to render ahead (by default the configured phrases, with
        run-time ones kept in memory only)."""
        self._settings = settings
        self._synth = synth
        self._lock = threading.Lock()
        self._requested: deque[IdleItem] = deque()
        if phrases is None:
            phrases = PhraseList(read_phrases(settings), None)
        self.phrase_list = phrases
        self._phrases: deque[IdleItem] = deque(
            self._items(self.phrase_list.all(), settings.default_voice, "phrase")
        )
        self._seen: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._learned: deque[IdleItem] = deque()
        self.done: dict[Kind, int] = {"prerender": 0, "upgrade": 0, "phrase": 0, "learned": 0}
        self.interrupted = 0
        """Background tasks stopped because live work arrived (their sentences stay queued)."""
        self._alone: set[tuple[str, str]] = set()  # failed in a batch: retried on their own

    def _items(self, texts: Iterable[str], voice: str, kind: Kind) -> list[IdleItem]:
        items: list[IdleItem] = []
        limit = self._settings.limits.max_text_chars
        for text in texts:
            try:
                items += [IdleItem(voice, s, kind) for s in prepare_text(text, limit)]
            except RequestError as exc:
                _LOGGER.warning("Skipping a phrase (%s): %s", size(text), exc)
                _LOGGER.debug("The phrase skipped: %s", short(text))
        return items

    # producers

    def request_prerender(self, texts: list[str], voice: str | None) -> int:
        """Queue phrases for pre-rendering; returns how many sentences were queued."""
        name = self._synth.engines.voice(voice).name  # raises UnknownVoiceError
        items = self._items(texts, name, "prerender")
        with self._lock:
            room = self._settings.scheduler.max_background - len(self._requested)
            if len(items) > room:
                raise RequestError("busy", f"only {max(room, 0)} more sentences can be queued")
            self._requested.extend(items)
        return len(items)

    def add_phrase(self, phrase: str) -> int:
        """Queue a phrase just added to the list, for the default voice; how many sentences."""
        items = self._items([phrase], self._synth.engines.default_voice, "phrase")
        with self._lock:
            self._phrases.extend(items)
        return len(items)

    def note_fast_answer(self, quality_voice: str, sentences: list[str]) -> None:
        """A live request was answered by the fast tier: render it in quality later."""
        upgrades = self._synth.cache.upgrades
        for n, sentence in enumerate(sentences):
            if len(upgrades) >= self._settings.scheduler.max_background:
                _LOGGER.warning(
                    "Upgrade list full; %d sentence(s) stay on the fast tier", len(sentences) - n
                )
                _LOGGER.debug("Not upgraded: %s", short(sentence))
                return
            upgrades[f"{quality_voice}\x00{sentence}"] = time.time()

    def note_request(self, voice: str, sentences: list[str]) -> None:
        """Count live sentences; a frequent one becomes a learned phrase."""
        cfg = self._settings.scheduler
        now = time.monotonic()
        with self._lock:
            for sentence in sentences:
                key = (voice, sentence)
                times = self._seen.pop(key, None) or deque()
                times.append(now)
                while times and now - times[0] > cfg.learn_window_s:
                    times.popleft()
                self._seen[key] = times  # most recent last
                if len(times) == cfg.learn_min_count:
                    self._learned.append(IdleItem(voice, sentence, "learned"))
                    _LOGGER.info(
                        "Learned a phrase for %s: %s, %d requests",
                        voice,
                        size(sentence),
                        len(times),
                    )
                    _LOGGER.debug("Learned phrase %s", short(sentence))
            while len(self._seen) > cfg.learn_max_sentences:
                self._seen.popitem(last=False)

    def pending(self) -> int:
        with self._lock:
            return (
                len(self._requested)
                + len(self._phrases)
                + len(self._learned)
                + len(self._synth.cache.upgrades)
            )

    # consumer (the scheduler's idle thread)

    def next_task(self) -> Callable[[], None] | None:
        while True:
            item = self._next_item()
            if item is None:
                return None
            try:
                voice = self._synth.engines.voice(item.voice)
            except UnknownVoiceError:
                self._finish(item)
                continue  # a voice removed from the config since
            options = self._synth.options_for(voice)
            if self._synth.is_cached(voice, item.sentence, options):
                self._finish(item)
                continue
            mates = self._batch_mates(item, voice, options)
            if mates:
                return lambda items=[item, *mates]: self._render_batch(items)  # type: ignore[misc]
            return lambda item=item: self._render(item)  # type: ignore[misc]

    def _batch_mates(
        self, item: IdleItem, voice: Voice, options: SynthesisOptions
    ) -> list[IdleItem]:
        """Uncached sentences of the same voice and source to render with `item`, if any."""
        size = self._settings.scheduler.idle_batch_size
        engine = voice.engine
        if size <= 1 or not isinstance(engine, BatchEngine):
            return []

        def seconds(sentence: str) -> float:
            return engine.speech_seconds(engine.prepare_text(sentence), options)

        with self._lock:
            if (item.voice, item.sentence) in self._alone:
                return []
            window = self._window(item.kind, size * BATCH_WINDOW)
            window = [i for i in window if (i.voice, i.sentence) not in self._alone]
        room = BATCH_MAX_AUDIO_S - seconds(item.sentence)
        mates: list[IdleItem] = []
        taken = {item.sentence}
        for other in window:
            if len(mates) == size - 1 or room <= 0:
                break
            if other.voice != item.voice or other.sentence in taken:
                continue
            need = seconds(other.sentence)
            if need > room or self._synth.is_cached(voice, other.sentence, options):
                continue
            mates.append(other)
            taken.add(other.sentence)
            room -= need
        return mates

    def _window(self, kind: Kind, count: int) -> list[IdleItem]:
        """The first `count` items waiting in the source `kind` comes from (under the lock)."""
        if kind == "upgrade":
            keys = itertools.islice(iter(self._synth.cache.upgrades), count)
            return [IdleItem(*_split_upgrade(key), "upgrade") for key in keys]
        return list(itertools.islice(self._queue(kind), count))

    def _queue(self, kind: Kind) -> deque[IdleItem]:
        return {
            "prerender": self._requested,
            "phrase": self._phrases,
            "learned": self._learned,
        }[kind]

    def _next_item(self) -> IdleItem | None:
        with self._lock:
            if self._requested:
                return self._requested[0]
            upgrades = self._synth.cache.upgrades
            if len(upgrades):
                return IdleItem(*_split_upgrade(next(iter(upgrades))), "upgrade")
            if self._phrases:
                return self._phrases[0]
            if self._learned:
                return self._learned[0]
        return None

    def _finish(self, item: IdleItem) -> None:
        with self._lock:
            self._alone.discard((item.voice, item.sentence))
            if item.kind == "upgrade":
                self._synth.cache.upgrades.pop(f"{item.voice}\x00{item.sentence}", None)
                return
            queue = self._queue(item.kind)
            if queue and queue[0] == item:
                queue.popleft()
            elif item in queue:  # a batch-mate from further down the queue
                queue.remove(item)

    def _render(self, item: IdleItem) -> None:
        voice = self._synth.engines.voice(item.voice)
        started = time.perf_counter()
        try:
            self._synth.sentence(voice, 0, item.sentence, self._synth.options_for(voice), True)
        except SynthesisInterruptedError:
            self._gave_way(1, started)
            return  # still queued: rendered again at the next idle moment
        except Exception as exc:  # one bad sentence must not stall the idle queue
            _LOGGER.warning(
                "Idle %s of a sentence (%s) in %s failed: %s",
                item.kind,
                size(item.sentence),
                voice.name,
                exc,
            )
            _LOGGER.debug("Idle %s failed on %s", item.kind, short(item.sentence))
            self._finish(item)
            return
        # Off the queue before it counts as done: the health report never shows an item both
        # done and pending.
        self._finish(item)
        self.done[item.kind] += 1
        _LOGGER.info(
            "Idle: %s of a sentence (%s) in %s", item.kind, size(item.sentence), voice.name
        )
        _LOGGER.debug("Idle: %s %s in %s", item.kind, short(item.sentence), voice.name)

    def _gave_way(self, sentences: int, started: float) -> None:
        self.interrupted += 1
        _LOGGER.info(
            "Idle: gave way to live work after %.1f s (%d sentence(s) stay queued)",
            time.perf_counter() - started,
            sentences,
        )

    def _render_batch(self, items: list[IdleItem]) -> None:
        """Several sentences of one voice in one `synthesize_batch` call (see the module doc)."""
        started = time.perf_counter()
        try:
            voice = self._synth.engines.voice(items[0].voice)
            options = self._synth.options_for(voice)
            self._synth.sentences_batch(voice, [item.sentence for item in items], options)
        except SynthesisInterruptedError:
            self._gave_way(len(items), started)
            return  # still queued (the ones cached before the interruption are skipped later)
        except Exception as exc:  # not one item's fault for certain: each is retried alone
            _LOGGER.warning(
                "Idle batch of %d failed (%s); rendering them one at a time", len(items), exc
            )
            with self._lock:
                self._alone.update((item.voice, item.sentence) for item in items)
            return
        _LOGGER.info(
            "Idle: %s batch of %d in %s in %.1f s",
            items[0].kind,
            len(items),
            voice.name,
            time.perf_counter() - started,
        )
        _LOGGER.debug("Idle batch: %s", " | ".join(short(item.sentence) for item in items))
        for item in items:
            self._finish(item)
            self.done[item.kind] += 1


def _split_upgrade(key: str) -> tuple[str, str]:
    voice, _, sentence = key.partition("\x00")
    return voice, sentence
