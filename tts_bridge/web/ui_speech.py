"""The web UI's Speak: a request through the same pipeline and checks as ``POST /api/speak``,
answered with where its audio is and how it was made (voice per sentence, tier, cached,
latency) for the page to play, show and offer for download.

The audio goes into the server's audio store and the page gets its URL relative to the page
(``audio/<token>.wav``), so it plays under Home Assistant's ingress prefix too. The request's
text is never logged here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from tts_bridge.audio.formats import AudioFormat
from tts_bridge.speech.async_delivery import AsyncDelivery, Finished
from tts_bridge.speech.pipeline import Pipeline, SpeechError
from tts_bridge.speech.request import Announcement
from tts_bridge.speech.synthesis import Rendering
from tts_bridge.web.server import AudioServer
from tts_bridge.web.speech_api import ApiRequestError, parse_speak
from tts_bridge.wire import new_id

_LOGGER = logging.getLogger(__name__)

DOOR = "web"
"""This page's name in the pipeline's accounting (queue share, metrics, activity)."""
_WAV = AudioFormat("wav")
_SPEAK_FIELDS = ("text", "voice", "tier", "priority", "speed")


def parse_chime(fields: Mapping[str, Any]) -> Announcement | None:
    """The form's chime: absent or "default" = the voice's own (a preset's), "none" = none."""
    chime = fields.get("chime")
    if chime is None or chime == "default":
        return None
    if not isinstance(chime, str):
        raise ApiRequestError("invalid_request", "'chime' must be a chime's name", "chime")
    return Announcement(chime="" if chime == "none" else chime)


async def speak(
    request: web.Request, pipeline: Pipeline, server: AudioServer, fields: Mapping[str, Any]
) -> dict[str, Any]:
    """Render the form's text; raises ApiRequestError or SpeechError (with its code)."""
    received = time.monotonic()
    parsed = parse_speak({k: v for k, v in fields.items() if k in _SPEAK_FIELDS and v != ""})
    chime = parse_chime(fields)
    speech = dataclasses.replace(
        parsed,
        id=new_id(),
        target=DOOR,
        door=DOOR,
        peer=request.remote,
        received=received,
        chime=chime.chime if chime is not None else None,
    )
    job = pipeline.prepare(speech)
    loop = asyncio.get_running_loop()
    delivery = AsyncDelivery(loop, pipeline)
    admission = pipeline.submit(job, delivery.serve)
    if not admission:
        raise SpeechError("busy", admission.message)
    try:
        while not isinstance(event := await delivery.next_event(), Finished):
            pass
    finally:
        delivery.abandon()
    rendering: Rendering = event.rendering
    published = await loop.run_in_executor(
        None, server.publish, rendering.pcm, rendering.sample_rate, _WAV
    )
    latency_ms = round((time.monotonic() - received) * 1000, 1)
    pipeline.count_answer(rendering.tier, latency_ms, door=DOOR, voice=rendering.voice)
    return {
        "audio": f"audio/{published.token}.{published.format.extension}",
        "voice": rendering.voice,
        "sentence_voices": list(rendering.sentence_voices)
        or [rendering.voice] * rendering.sentences,
        "tier": rendering.tier,
        "engine": rendering.engine,
        "cached": rendering.cached,
        "cached_sentences": rendering.cached_sentences,
        "sentences": rendering.sentences,
        "latency_ms": latency_ms,
        "duration_ms": rendering.duration_ms,
        "sample_rate": rendering.sample_rate,
    }
