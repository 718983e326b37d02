"""Slow tests first: run in parallel (``pytest -n``), the long end-to-end and model tests then
start while there is still short work to share out, instead of one of them finishing last on a
single worker while the others are idle. ``script/test`` pairs this with ``--maxschedchunk 1``,
so each worker takes the next test when it is free (longest first is the classic greedy plan).

The order changes no result: every test makes its own set-up (tests/support); only the session's
tiny models are shared, and they are built on first use whatever the order.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests marked ``slow`` to the front, each group keeping its collected order."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
