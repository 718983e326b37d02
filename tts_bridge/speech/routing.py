"""Tier routing: estimate when the quality tier would finish a live request and pick a tier.

Costs are seconds of compute per character of text, learned per engine from real runs (an
exponentially weighted mean) and seeded with each engine kind's declared figure
(``EngineSpec.seed_seconds_per_char``), so the first request already routes sensibly.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Literal

from tts_bridge.engines import catalog
from tts_bridge.engines.base import Tier
from tts_bridge.engines.registry import Voice
from tts_bridge.speech.request import SpeechRequest

_LOGGER = logging.getLogger(__name__)

DEFAULT_SECONDS_PER_CHAR = 0.01
"""The seed of an engine whose kind is not registered."""
_ALPHA = 0.2  # weight of the newest observation in the running mean

Reason = Literal[
    "forced", "cached", "within_budget", "over_budget", "no_fast_voice", "language", "hysteresis"
]


def seed_seconds_per_char(engine_name: str) -> float | None:
    """The declared cost of an engine kind before any measurement; None if it is unknown."""
    spec = catalog.find(engine_name)
    return spec.seed_seconds_per_char if spec is not None else None


class CostEstimator:
    """Running seconds-per-character estimate per engine identity (thread-safe)."""

    def __init__(self, known: dict[str, float] | None = None) -> None:
        self._lock = threading.Lock()
        self._per_char: dict[str, float] = dict(known or {})
        self._samples: dict[str, int] = {}

    def seconds(self, engine_name: str, identity: str, chars: int) -> float:
        with self._lock:
            rate = self._per_char.get(identity)
        if rate is None:
            rate = seed_seconds_per_char(engine_name)
        if rate is None:
            rate = DEFAULT_SECONDS_PER_CHAR
        return rate * chars

    def observe(self, engine_name: str, identity: str, chars: int, seconds: float) -> None:
        if chars <= 0 or seconds <= 0:
            return
        observed = seconds / chars
        with self._lock:
            old = self._per_char.get(identity)
            if old is None:
                old = seed_seconds_per_char(engine_name)
            if old is None:
                old = observed
            self._per_char[identity] = (1 - _ALPHA) * old + _ALPHA * observed
            self._samples[identity] = self._samples.get(identity, 0) + 1

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._per_char)


@dataclass(frozen=True)
class Route:
    """Which voice answers a request, and why."""

    voice: Voice
    tier: Tier
    reason: Reason
    estimate_s: float
    """Estimated time until the quality tier would have finished this request."""


class TierRouter:
    """Chooses quality or fast for each live request; remembers its mode for hysteresis."""

    def __init__(self, budget_ms: int, hysteresis: float) -> None:
        self._budget_s = budget_ms / 1000
        self._hysteresis = hysteresis
        self._fast_mode = False
        self._lock = threading.Lock()

    @property
    def fast_mode(self) -> bool:
        return self._fast_mode

    def choose(  # noqa: PLR0911 - one return per routing rule reads clearest
        self,
        quality: Voice,
        fast: Voice | None,
        request: SpeechRequest,
        *,
        language: str | None,
        uncached_cost_s: float,
        backlog_s: float,
    ) -> Route:
        """`uncached_cost_s`: the quality tier's work for this text (cached sentences cost ~0);
        `request` may force a tier or bring its own latency budget."""
        forced, budget_ms = request.tier, request.budget_ms
        estimate = backlog_s + uncached_cost_s
        if forced == "fast" and fast is not None:
            return Route(fast, "fast", "forced", estimate)
        if forced is not None:
            return Route(quality, "quality", "forced", estimate)
        if uncached_cost_s == 0:
            return Route(quality, "quality", "cached", estimate)
        if fast is None:
            return Route(quality, "quality", "no_fast_voice", estimate)
        if language is not None and language not in fast.engine.languages:
            return Route(quality, "quality", "language", estimate)
        budget = self._budget_s if budget_ms is None else budget_ms / 1000
        with self._lock:
            if estimate > budget:
                if not self._fast_mode:
                    _LOGGER.info("Quality tier busy (%.1f s > %.1f s): fast tier", estimate, budget)
                self._fast_mode = True
                return Route(fast, "fast", "over_budget", estimate)
            if self._fast_mode and estimate > budget * self._hysteresis:
                return Route(fast, "fast", "hysteresis", estimate)
            if self._fast_mode:
                _LOGGER.info("Quality tier has room again (%.1f s): quality tier", estimate)
            self._fast_mode = False
        return Route(quality, "quality", "within_budget", estimate)
