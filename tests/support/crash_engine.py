"""A test-only engine that kills the process it runs in on a magic text (never registered by the
bridge itself: `crash_bridge` imports this module before the bridge starts).

- a sentence containing ``POISON`` sleeps a moment (so that the requests sent behind it are
  journaled meanwhile) and then sends the process SIGKILL: a request that kills the bridge
  every time its synthesis starts (the out-of-memory killer, say);
- a sentence containing ``HANG`` logs that it started and never ends (a kill between the start
  of synthesis and its first audio);
- anything else is a short beep, made in ``CRASH_ENGINE_SECONDS`` (default 0) of wall time, so
  that kills at random moments can land in a synthesis.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tts_bridge.engines import catalog
from tts_bridge.engines.base import FloatAudio, SynthesisOptions
from tts_bridge.engines.catalog import EngineContext, EngineSpec

_LOGGER = logging.getLogger(__name__)

KIND = "crashtest"
RATE = 16000
POISON = "POISON"
HANG = "HANG"
POISON_DELAY_S = 0.5
HANG_LOG = "crash test engine: hanging in synthesis"


class CrashEngine:
    name = KIND
    languages = frozenset({"en"})
    sample_rate = RATE
    identity = f"{KIND}:1"

    def __init__(self) -> None:
        self.loaded = False
        self._seconds = float(os.environ.get("CRASH_ENGINE_SECONDS", "0"))

    def load(self) -> None:
        self.loaded = True

    def unload(self) -> None:
        self.loaded = False

    @staticmethod
    def prepare_text(text: str) -> str:
        return text

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        if POISON in text:
            time.sleep(POISON_DELAY_S)
            os.kill(os.getpid(), signal.SIGKILL)
        if HANG in text:
            _LOGGER.warning("%s: %r", HANG_LOG, text)
            while True:
                time.sleep(60)
        time.sleep(self._seconds)
        t = np.arange(int(RATE * 0.01 * len(text)), dtype=np.float32) / RATE
        yield (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def _build(context: EngineContext) -> CrashEngine:
    return CrashEngine()


def register() -> EngineSpec:
    """Add the kind to the catalog: only in the bridge subprocess (crash_bridge), so the test
    process that imports this module for its constants keeps the catalog it shares with other
    tests."""
    return catalog.register(
        EngineSpec(
            kind=KIND,
            build=_build,
            tier="quality",
            seed_seconds_per_char=0.001,
            languages=frozenset({"en"}),
            bundled_model=lambda: Path(__file__),
            check_files=None,
        )
    )
