"""Each test takes the log handlers its commands added with it.

A test that runs a command in process (`tts-bridge ...` through cli.main) configures logging
with a handler on the sys.stderr pytest has swapped in for that test; left on the root logger, a
worker thread of an earlier test that logs later writes into the closed stream and prints
"--- Logging error ---" tracebacks over the run's output."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    # Only the plain stream handlers a command added: pytest's own capture handlers (subclasses)
    # come and go with each test phase and are pytest's to remove.
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler and handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)
