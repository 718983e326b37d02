"""A hook that runs once per request, on the rendering thread, right before an engine starts.

A door that must know when a request's synthesis begins (the MQTT journal counts an attempt
then, so that a request that kills the process is found at the next start) sets the hook around
its render with `on_engine_start`; the synthesizer calls `engine_starting()` before it loads or
runs an engine for a sentence the cache did not have. A request answered from the cache alone
never calls it. A context variable rather than an argument: the render path passes no request
handle down to the sentence, and each worker thread renders one request at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar


class _Once:
    def __init__(self, hook: Callable[[], None]) -> None:
        self._hook: Callable[[], None] | None = hook

    def __call__(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook()


_HOOK: ContextVar[_Once | None] = ContextVar("engine_start_hook", default=None)


@contextlib.contextmanager
def on_engine_start(hook: Callable[[], None] | None) -> Iterator[None]:
    """Within this block, `hook` runs before the first engine starts on this thread's request
    (at most once; None: nothing runs)."""
    token = _HOOK.set(_Once(hook) if hook is not None else None)
    try:
        yield
    finally:
        _HOOK.reset(token)


def engine_starting() -> None:
    """Called by the synthesizer right before an engine loads or runs for a sentence."""
    hook = _HOOK.get()
    if hook is not None:
        hook()
