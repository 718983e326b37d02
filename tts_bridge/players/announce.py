"""An answer handed to its target's Home Assistant media players, the same from every door: the
order `Players` plays (the answer's URL and its length as the target gets it), and for a door
that has not delivered the audio itself (the HTTP API with a ``target``) the delivery too —
the target's lead-in and lead-out, its format behind a URL — with the answer's fields and each
player's outcome awaited on the door's event loop."""

from __future__ import annotations

import asyncio
import re
from typing import Any, cast

from tts_bridge.audio.formats import AudioFormat, Container
from tts_bridge.players.service import Outcomes, Players, PlayOrder
from tts_bridge.speech.delivery import AudioDelivery, Delivered
from tts_bridge.speech.request import SpeechRequest
from tts_bridge.speech.synthesis import Rendering

TARGET_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""A target's name, as in <base>/say/<target>."""


def play_order(
    request_id: str | int, target: str, delivered: Delivered, duration_ms: int, priority: str
) -> PlayOrder:
    """What the players get of an answer: its URL (None: no audio server) and its length as
    delivered (lead-in and lead-out included)."""
    url = delivered.published.url if delivered.published is not None else None
    return PlayOrder(request_id, target, url, duration_ms, priority)


class Announcer:
    """Delivery to a target and its media players for a door without a topic of its own."""

    def __init__(self, delivery: AudioDelivery, players: Players | None) -> None:
        self._delivery = delivery
        self._players = players

    async def answer(self, request: SpeechRequest, rendering: Rendering) -> dict[str, Any]:
        """Deliver `rendering` as `request.target` gets it and play it on the target's media
        players, if it has any; the answer's fields (with `players`: each player's outcome, as
        in a say answer). Raises DeliveryError when the target's audio cannot be made."""
        loop = asyncio.get_running_loop()
        target = request.target
        rendering = self._delivery.with_lead(target, rendering)
        # The format asked for, else the target's (else http.format), as for a say.
        asked = AudioFormat(cast(Container, request.format)) if request.format else None
        how = self._delivery.for_target(target, asked)
        # Off the loop: encoding is CPU work, and the store writes files.
        delivered = await loop.run_in_executor(None, self._delivery.deliver, how, rendering)
        data: dict[str, Any] = {
            "target": target,
            "tier": rendering.tier,
            "engine": rendering.engine,
            "voice": rendering.voice,
            "cached": rendering.cached,
            "priority": request.priority,
            "sentences": rendering.sentences,
            "cached_sentences": rendering.cached_sentences,
            "duration_ms": rendering.duration_ms,
            **delivered.answer_fields(),
        }
        if self._players is not None and self._players.plays(target):
            outcome: asyncio.Future[Outcomes] = loop.create_future()

            def done(outcomes: Outcomes) -> None:  # on the players' answer thread
                loop.call_soon_threadsafe(_settle, outcome, outcomes)

            order = play_order(
                request.id, target, delivered, rendering.duration_ms, request.priority
            )
            self._players.play(order, done)
            data["players"] = await outcome
        return data


def _settle(future: asyncio.Future[Outcomes], outcomes: Outcomes) -> None:
    if not future.done():  # a client that left cancelled it
        future.set_result(outcomes)
