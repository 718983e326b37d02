"""One progress display for a whole ``models download``: every file's bytes on one bar, and the
steps after the download (verify, export, quantize, voice) as lines above it.

On a terminal that is a tqdm bar; otherwise (a log file, a pipe, CI) there is no bar, only a
line per finished file and per step, so logs stay readable.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm


class Progress:
    """The display; ``file_bar`` is what ``huggingface_hub`` calls as its ``tqdm_class``."""

    def __init__(self, total_bytes: int, stream: TextIO | None = None, *, quiet: bool = False):
        self._stream = stream or sys.stderr
        self.quiet = quiet
        """Nothing shown (a small side download such as a voice list)."""
        self.tty = not quiet and self._stream.isatty()
        self._lock = threading.Lock()
        self._bar: tqdm[Any] | None = None
        if self.tty:
            self._bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                file=self._stream,
                dynamic_ncols=True,
                leave=True,
            )

    def step(self, text: str) -> None:
        """A line above the bar (or alone, off a terminal)."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.write(text, file=self._stream)
        else:
            print(text, file=self._stream, flush=True)

    def advance(self, n: int) -> None:
        """Bytes already on disk count as done (a resumed download)."""
        with self._lock:
            if self._bar is not None and n:
                self._bar.update(n)

    def file_bar(self, **kwargs: Any) -> _FileBar:
        """A per-file bar that adds its bytes to the one display (huggingface_hub's API)."""
        return _FileBar(self, str(kwargs.get("desc") or ""), int(kwargs.get("initial") or 0))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class _FileBar:
    """The tqdm subset ``huggingface_hub.http_get`` uses: a context manager with update()."""

    def __init__(self, progress: Progress, desc: str, initial: int) -> None:
        self._progress = progress
        self._desc = desc
        self.n = initial
        progress.advance(initial)

    def update(self, n: int | float = 1) -> None:
        # Negative after a server ignored a Range request and the file starts over.
        self.n += int(n)
        self._progress.advance(int(n))

    def __enter__(self) -> _FileBar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        pass
