"""Batched rendering: several sentences of one voice into the cache in one engine call, for
background work (idle upgrades and pre-rendering), looked up and stored as live rendering does.
"""

from __future__ import annotations

import logging
import time

from tts_bridge.audio import codec
from tts_bridge.engines.base import BatchEngine, EngineError, SynthesisOptions
from tts_bridge.engines.registry import Voice
from tts_bridge.speech.rendering import Renderer, SentenceAudio

_LOGGER = logging.getLogger(__name__)


def render_batch(
    renderer: Renderer, voice: Voice, texts: list[str], options: SynthesisOptions
) -> list[SentenceAudio]:
    """Several sentences of one voice into the cache, the uncached ones synthesized in one
    `synthesize_batch` call when the engine is a `BatchEngine` (background work; `index`
    is the position in `texts`).

    Each is looked up and stored exactly as `sentence` does (same key, same PCM, counted
    in `stats`). A sentence the engine cannot take in one generation, and every sentence
    of an engine that does not batch, goes through `sentence` alone, after the batch.
    ChatTTS seeds a batch as a whole, so a sentence's audio depends on its batch-mates: a
    valid rendering for its key, not the one `sentence` would have made.
    The estimator is not taught from a batch: it predicts a live request, which runs alone,
    and a batch's time per character is several times lower.
    """
    engine = voice.engine
    batching = engine if isinstance(engine, BatchEngine) else None
    results: dict[int, SentenceAudio] = {}
    together: list[tuple[int, str]] = []  # (index, the text of its one generation)
    alone: list[int] = []
    for index, text in enumerate(texts):
        hit = renderer.cache.get(renderer.front.key(voice, text, options))
        if hit is not None and hit.sample_rate == engine.sample_rate:
            results[index] = SentenceAudio(index, text, hit.pcm, cached=True)
            continue
        if batching is None:
            alone.append(index)
            continue
        # Split as the engine's own `synthesize` splits what `sentence` gives it.
        pieces = batching.generations(
            batching.prepare_text(renderer.front.text(engine, text)), options
        )
        if len(pieces) > 1:
            alone.append(index)
        else:
            together.append((index, pieces[0] if pieces else ""))
    if together:
        assert batching is not None
        if renderer.metrics is not None:
            renderer.metrics.idle_batch(len(together))
        renderer.ensure_loaded(engine)
        started = time.perf_counter()
        try:
            clips = batching.synthesize_batch([p for _, p in together], voice.speaker, options)
        except EngineError:
            raise
        except Exception as exc:  # an engine bug must fail this work, not the bridge
            _LOGGER.exception("Engine %s failed", engine.identity)
            raise EngineError(f"{engine.name} failed: {type(exc).__name__}") from exc
        elapsed = time.perf_counter() - started
        pcms = [
            renderer.normalized(voice, codec.to_pcm16(clip)) if clip.size else codec.silence(1, 0)
            for clip in clips
        ]
        renderer.stats.add(engine.identity, elapsed, sum(p.size for p in pcms) / engine.sample_rate)
        for (index, _), pcm in zip(together, pcms, strict=True):
            if pcm.size:
                key = renderer.front.key(voice, texts[index], options)
                renderer.cache.put(key, pcm, voice.tier, engine.identity)
            results[index] = SentenceAudio(index, texts[index], pcm, cached=False)
    for index in alone:
        results[index] = renderer.sentence(voice, index, texts[index], options, True)
    return [results[index] for index in range(len(texts))]
