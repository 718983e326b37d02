"""A job's audio from the worker thread that renders it to an asyncio loop, part by part.

A network door's event loop must never synthesize: it submits the job with `AsyncDelivery.serve`
as the worker's task and reads `next_event()` as each sentence (or streamed piece of one) is
ready. When the client goes away the door calls `abandon()`; the worker then stops at its next
part instead of rendering audio nobody will hear.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

from tts_bridge.speech.pipeline import Pipeline, SpeechError, SpeechJob
from tts_bridge.speech.synthesis import AudioPart, Rendering, RequestError

_LOGGER = logging.getLogger(__name__)


class AbandonedError(RequestError):
    """Raised into a rendering whose client has gone, to end it on its worker thread.

    A RequestError, so that the pipeline reports it as a refused request (quietly) rather than
    as an engine failure."""

    def __init__(self) -> None:
        super().__init__("client_gone", "the client closed the connection")


@dataclass(frozen=True)
class Finished:
    """The last event of a job: its whole rendering."""

    rendering: Rendering


class AsyncDelivery:
    """One job's parts, then `Finished` (or a SpeechError raised by `next_event`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pipeline: Pipeline) -> None:
        self._loop = loop
        self._pipeline = pipeline
        self._abandoned = threading.Event()
        self._events: asyncio.Queue[AudioPart | Finished | SpeechError] = asyncio.Queue()

    def abandon(self) -> None:
        self._abandoned.set()

    async def next_event(self) -> AudioPart | Finished:
        """The next part, or `Finished`; raises the job's SpeechError."""
        event = await self._events.get()
        if isinstance(event, SpeechError):
            raise event
        return event

    def _post(self, event: AudioPart | Finished | SpeechError) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server stopped
            self._abandoned.set()

    def _on_part(self, part: AudioPart) -> None:
        if self._abandoned.is_set():
            raise AbandonedError()
        self._post(part)

    def serve(self, job: SpeechJob) -> None:
        """Render the job (on a worker thread), posting its parts to the loop."""
        if self._abandoned.is_set():
            return
        try:
            rendering = self._pipeline.render(job, on_part=self._on_part)
        except SpeechError as exc:
            if not self._abandoned.is_set():
                self._post(exc)
            return
        except Exception as exc:
            if self._abandoned.is_set():
                _LOGGER.debug("Job %s abandoned: %s", job.id, type(exc).__name__)
                return
            _LOGGER.exception("Job %s failed", job.id)
            self._post(SpeechError("synthesis_failed", f"internal error: {type(exc).__name__}"))
            return
        self._post(Finished(rendering))
