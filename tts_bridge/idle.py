"""Background work for idle time: quality upgrades, pre-render requests, phrases, learned ones.

Every task is one sentence in one voice, rendered through the Synthesizer (so it lands in the
cache). Sources, first to last:
1. pre-render requests (`bridge/request/prerender`, in memory, bounded);
2. upgrades: sentences a live request got from the fast tier; the quality version is rendered
   and cached under its own key, after which lookups for the voice hit quality. Kept in a
   persistent index beside the cache, so a restart does not forget them;
3. configured `phrases` / `phrases_file` for the default voice;
4. learned sentences: asked at least `learn_min_count` times within `learn_window_s`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tts_bridge.config import Settings
from tts_bridge.engines.registry import UnknownVoiceError
from tts_bridge.synthesis import RequestError, Synthesizer, prepare_text
from tts_bridge.textlog import short

_LOGGER = logging.getLogger(__name__)

Kind = Literal["prerender", "upgrade", "phrase", "learned"]


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

    def __init__(self, settings: Settings, synth: Synthesizer) -> None:
        self._settings = settings
        self._synth = synth
        self._lock = threading.Lock()
        self._requested: deque[IdleItem] = deque()
        self._phrases: deque[IdleItem] = deque(
            self._items(read_phrases(settings), settings.default_voice, "phrase")
        )
        self._seen: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._learned: deque[IdleItem] = deque()
        self.done: dict[Kind, int] = {"prerender": 0, "upgrade": 0, "phrase": 0, "learned": 0}

    def _items(self, texts: Iterable[str], voice: str, kind: Kind) -> list[IdleItem]:
        items: list[IdleItem] = []
        limit = self._settings.limits.max_text_chars
        for text in texts:
            try:
                items += [IdleItem(voice, s, kind) for s in prepare_text(text, limit)]
            except RequestError as exc:
                _LOGGER.warning("Skipping phrase %s: %s", short(text), exc)
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

    def note_fast_answer(self, quality_voice: str, sentences: list[str]) -> None:
        """A live request was answered by the fast tier: render it in quality later."""
        upgrades = self._synth.cache.upgrades
        for sentence in sentences:
            if len(upgrades) >= self._settings.scheduler.max_background:
                _LOGGER.warning("Upgrade list full; %s stays on the fast tier", short(sentence))
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
                    _LOGGER.info("Learned phrase %s (%d requests)", short(sentence), len(times))
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
            if self._synth.is_cached(voice, item.sentence):
                self._finish(item)
                continue
            return lambda item=item: self._render(item)  # type: ignore[misc]

    def _next_item(self) -> IdleItem | None:
        with self._lock:
            if self._requested:
                return self._requested[0]
            upgrades = self._synth.cache.upgrades
            if len(upgrades):
                voice, _, sentence = next(iter(upgrades)).partition("\x00")
                return IdleItem(voice, sentence, "upgrade")
            if self._phrases:
                return self._phrases[0]
            if self._learned:
                return self._learned[0]
        return None

    def _finish(self, item: IdleItem) -> None:
        with self._lock:
            if item.kind == "upgrade":
                self._synth.cache.upgrades.pop(f"{item.voice}\x00{item.sentence}", None)
                return
            queue = {
                "prerender": self._requested,
                "phrase": self._phrases,
                "learned": self._learned,
            }[item.kind]
            if queue and queue[0] == item:
                queue.popleft()

    def _render(self, item: IdleItem) -> None:
        voice = self._synth.engines.voice(item.voice)
        try:
            self._synth.sentence(voice, 0, item.sentence, self._synth.options_for(voice), True)
            self.done[item.kind] += 1
            _LOGGER.info("Idle: %s %s in %s", item.kind, short(item.sentence), voice.name)
        except Exception as exc:  # one bad sentence must not stall the idle queue
            _LOGGER.warning("Idle %s of %s failed: %s", item.kind, short(item.sentence), exc)
        finally:
            self._finish(item)
