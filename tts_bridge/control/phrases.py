"""The phrases the bridge renders ahead (``phrases``, ``phrases_file`` and those added at run
time), which voice and tier already hold each in the sentence cache, and a phrase's audio
removed from the cache."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tts_bridge.control.errors import ControlError
from tts_bridge.speech.phrase_list import PhraseError
from tts_bridge.speech.pipeline import Pipeline, SpeechError
from tts_bridge.speech.request import SpeechRequest

_LOGGER = logging.getLogger(__name__)

_DOOR = "control"
"""The door named in the plans made here (nothing is queued or counted)."""


def phrase_status(pipeline: Pipeline, extra: list[str] | None = None) -> list[dict[str, Any]]:
    """Each phrase of the list (and `extra` ones), with its `source` ("configuration" or
    "runtime"): for the default voice and its fast voice, whether every sentence of it is in the
    cache."""
    engines = pipeline.synthesizer.engines
    default = engines.default_voice
    catalog = {v.name: v for v in pipeline.voices().voices}
    holders = [(default, catalog[default].tier if default in catalog else "quality")]
    fast = catalog[default].fast_voice if default in catalog else None
    if fast and fast in catalog:
        holders.append((fast, catalog[fast].tier))
    listed = pipeline.idle.phrase_list.entries()
    sources = dict(listed)
    rows = []
    for phrase in dict.fromkeys([*(p for p, _ in listed), *(extra or [])]):
        cached = []
        for voice, tier in holders:
            try:
                plan = pipeline.check(SpeechRequest(text=phrase, voice=voice, door=_DOOR))
            except SpeechError:
                continue
            synth = pipeline.synthesizer
            if all(synth.is_cached(plan.voice, s, plan.options) for s in plan.sentences):
                cached.append({"voice": voice, "tier": tier})
        rows.append({"phrase": phrase, "source": sources.get(phrase, "other"), "cached": cached})
    return rows


def _phrase(args: Mapping[str, Any]) -> Any:
    phrase = args.get("phrase", args.get("value"))
    if not isinstance(phrase, str):
        raise ControlError("invalid_request", 'give the phrase (plain text or {"phrase": ...})')
    return phrase


def add_phrase(pipeline: Pipeline, args: Mapping[str, Any]) -> dict[str, Any]:
    """Add a phrase to the list (kept in the state folder) and queue it for idle time."""
    idle = pipeline.idle
    try:
        phrase, new, saved = idle.phrase_list.add(_phrase(args))
    except PhraseError as exc:
        raise ControlError("invalid_request", str(exc)) from None
    queued = idle.add_phrase(phrase) if new else 0
    if queued:
        pipeline.scheduler.wake_background()
    _LOGGER.info("Phrase added (%d sentence(s) to render ahead)", queued)
    return {"phrase": phrase, "added": new, "queued_sentences": queued, "saved": saved}


def remove_phrase(pipeline: Pipeline, args: Mapping[str, Any]) -> dict[str, Any]:
    """Take a phrase added at run time off the list (its audio stays in the cache)."""
    try:
        phrase, saved = pipeline.idle.phrase_list.remove(_phrase(args))
    except PhraseError as exc:
        raise ControlError("invalid_request", str(exc)) from None
    _LOGGER.info("Phrase removed from the list")
    return {"removed": phrase, "saved": saved}


def uncache_phrase(pipeline: Pipeline, args: Mapping[str, Any]) -> dict[str, Any]:
    """Remove a phrase's sentences from the cache, in every voice that holds them (its next
    request, or the next idle moment for a listed phrase, renders it again)."""
    phrase = _phrase(args)
    synth = pipeline.synthesizer
    removed = 0
    for voice in synth.engines:
        try:
            plan = pipeline.check(SpeechRequest(text=phrase, voice=voice.name, door=_DOOR))
        except SpeechError:
            continue  # a voice that cannot say it holds none of it
        removed += sum(synth.forget(plan.voice, s, plan.options) for s in plan.sentences)
    _LOGGER.info("Cache: %d sentence(s) of a phrase removed", removed)
    return {"removed_sentences": removed}
