"""Silence around the audio one target gets, for speakers that wake late (the first syllable
lost) or cut the end: applied to the rendering a door delivers, never to what the cache keeps."""

from __future__ import annotations

import dataclasses

import numpy as np

from tts_bridge.audio import codec
from tts_bridge.speech.synthesis import Rendering


def padded(rendering: Rendering, lead_in_ms: int, lead_out_ms: int) -> Rendering:
    """`rendering` with `lead_in_ms` of silence before and `lead_out_ms` after (a new
    Rendering: the one given, which may be the cache's, is not changed)."""
    if not lead_in_ms and not lead_out_ms:
        return rendering
    rate = rendering.sample_rate
    pcm = np.concatenate(
        [codec.silence(rate, lead_in_ms), rendering.pcm, codec.silence(rate, lead_out_ms)]
    ).astype("<i2")
    return dataclasses.replace(
        rendering,
        pcm=pcm,
        wav=codec.encode_wav(pcm, rate),
        duration_ms=codec.duration_ms(pcm.size, rate),
    )
