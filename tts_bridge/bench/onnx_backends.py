"""ChatTTS on ONNX Runtime in the ChatTTS bench: the torch-free child, and an ONNX-only alias.

``tts-bridge bench --chattts`` (``tts_bridge.bench.chattts``) measures torch and ONNX alike; its
ONNX cases run here, in a fresh process that never imports torch (each row records whether
torch got imported), so the peak RSS is what a torch-free install pays. This module imports
onnxruntime, numpy and ``tokenizers`` only, and the torch-free parts of the project.

Run as a script, it is the combined bench restricted to the ONNX cases::

    python -m tts_bridge.bench.onnx_backends OUT_DIR [--tokens 200] [--batches 1 4] [--rounds 1]
        [--cases onnx-int8 onnx-int8-all]

Building and exporting the checkpoint (once, kept in OUT_DIR) needs the 'chattts' extra plus
onnx and onnxscript; the measurements need onnxruntime, numpy and tokenizers only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tts_bridge.bench.chattts_measure import (
    BENCH_TEXTS,
    FIRST_AUDIO_TEXT,
    ONNX_CASES,
    SPEED_LEVEL,
    WARMUP_TOKENS,
    result_row,
)
from tts_bridge.bench.util import patched, peak_rss_mb, rss_mb, time_first_chunk

if TYPE_CHECKING:
    from tts_bridge.engines.chattts.onnx_format import Precision


def measure_onnx(spec: dict[str, Any]) -> dict[str, Any]:
    """ONNX FP32, INT8 or INT4: load through ChatTTSOnnxEngine, time the loop, decoding, first
    audio."""
    if spec["case"] not in ONNX_CASES:
        raise ValueError(f"not an ONNX case: {spec['case']}")
    precision: Precision = spec["case"].removeprefix("onnx-")
    batch, tokens = int(spec["batch"]), int(spec["tokens"])
    loadavg_start = os.getloadavg()[0]
    started = time.perf_counter()
    importlib.import_module("onnxruntime")
    importlib.import_module("tokenizers")
    import_s = time.perf_counter() - started
    from tts_bridge.engines.chattts.onnx_early import EarlyStart
    from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
    from tts_bridge.engines.chattts.onnx_model import SamplingParams, code_prompt

    engine = ChatTTSOnnxEngine(
        Path(spec["export"]),
        precision=precision,
        threads=int(spec["threads"]),
        spinning=bool(spec.get("spinning", True)),
        early_start=EarlyStart(),  # synthesis.chattts_early_start: true; timed both ways below
    )
    started = time.perf_counter()
    engine.load()  # verifies every file's SHA-256 against the export's manifest
    load_s = time.perf_counter() - started
    # Where the peak comes from: a load-time transient would show as a peak above the RSS here.
    rss_loaded, peak_loaded = rss_mb(), peak_rss_mb()
    # As in the torch bench: the engine sizes each generation from the text, so the code loop is
    # driven on the loaded model with a fixed count; the speaker is the engine's default one
    # (sampled before the graphs loaded, as the engine does it).
    loaded = engine._loaded
    assert loaded is not None
    model, speaker = loaded.model, loaded.default_speaker
    texts = [BENCH_TEXTS[i % len(BENCH_TEXTS)] for i in range(batch)]
    prompts = [code_prompt(model.cleaner(t), SPEED_LEVEL, True) for t in texts]
    prompt = model.encode(prompts, speaker)
    warm = SamplingParams(min_new_token=WARMUP_TOKENS, max_new_token=WARMUP_TOKENS)
    for result in model.generate(prompt, warm, seed=0):
        model.decode(result.hiddens)

    # EOS blocked for every step: a fixed amount of work whatever the random weights say.
    params = SamplingParams(min_new_token=tokens, max_new_token=tokens)
    started = time.perf_counter()
    results = model.generate(prompt, params, seed=0)
    loop_s = time.perf_counter() - started
    peak_generated = peak_rss_mb()  # the KV cache at its longest, before the decode
    times = model.times
    if any(r.hiddens.shape[0] != tokens for r in results):
        raise RuntimeError(
            f"expected {tokens} codes per text, got {[len(r.codes) for r in results]}"
        )
    started = time.perf_counter()
    audio = [model.decode(r.hiddens) for r in results]
    decode_s = time.perf_counter() - started
    rss_in_use = rss_mb()
    first_audio = None
    at_first: dict[str, Any] = {}
    snr_by_context: dict[str, float] = {}
    codes = int(spec["first_audio_codes"])
    if codes:
        first_audio, at_first = first_audio_both_ways(engine, model, codes)
        snr_by_context = early_snr_by_context(model, results[0].hiddens)
    return result_row(
        spec,
        started_load=loadavg_start,
        import_s=import_s,
        load_s=load_s,
        loop_s=loop_s,
        decode_s=decode_s,
        audio_s=sum(a.size for a in audio) / 24_000,
        first_audio=first_audio,
        extra={
            "gpt_ms_per_step": round(1000 * times.gpt / times.steps, 2),
            "kv_mb_per_step_mean": round(kv_bytes_per_step(model, prompt, tokens) / 1e6, 1),
            "sampling_ms_per_step": round(1000 * times.sampling / times.steps, 2),
            "spinning": bool(spec.get("spinning", True)),
            "samples_per_text": int(audio[0].size),
            "rss_loaded_mb": round(rss_loaded, 1),
            "peak_rss_loaded_mb": round(peak_loaded, 1),
            "peak_rss_generated_mb": round(peak_generated, 1),
            "rss_in_use_mb": round(rss_in_use, 1),
            **({"first_audio_parts": at_first} if at_first else {}),
            **({"early_snr_by_context": snr_by_context} if snr_by_context else {}),
        },
    )


FIDELITY_TEXT = BENCH_TEXTS[1]


def measure_fidelity(spec: dict[str, Any]) -> dict[str, Any]:
    """How often a quantized GPT's logits pick FP32's code, teacher-forced on FP32's codes.

    Both GPT graphs run the same inputs step by step: the prompt, then at every step the codes
    FP32 picks greedily (EOS blocked), so one early difference does not send the two down
    different paths. Per step and codebook: top-1 agreement, and the largest logit difference.
    On random weights this is an indicator only (real logits are more peaked).
    """
    import numpy as np

    from tts_bridge.engines.chattts.onnx_format import precision_files, read_manifest
    from tts_bridge.engines.chattts.onnx_model import ChatTTSOnnxModel, code_prompt

    export, precision = Path(spec["export"]), str(spec["precision"])
    manifest = read_manifest(export)
    threads = int(spec["threads"])
    reference = ChatTTSOnnxModel(export, precision_files(manifest, "fp32"), threads=threads)
    tested = ChatTTSOnnxModel(export, precision_files(manifest, precision), threads=threads)
    prompt = reference.encode(
        [code_prompt(reference.cleaner(FIDELITY_TEXT), SPEED_LEVEL, True)], None
    )
    mask = prompt.attention_mask
    positions = np.cumsum(mask, axis=1) - 1
    embeds = prompt.embeds
    caches = reference.new_cache(1), tested.new_cache(1)
    agree, total, worst = 0, 0, 0.0
    for _ in range(int(spec["tokens"])):
        want, _hidden = reference.step(embeds, mask, positions, caches[0])
        got, _hidden = tested.step(embeds, mask, positions, caches[1])
        want, got = want[0, :, : reference.eos], got[0, :, : reference.eos]  # EOS blocked
        agree += int((want.argmax(axis=-1) == got.argmax(axis=-1)).sum())
        total += want.shape[0]
        worst = max(worst, float(np.abs(want - got).max()))
        codes = want.argmax(axis=-1)[None, :]
        embeds = reference.embed_codes(codes)[:, None, :]
        mask = np.concatenate([mask, np.ones((1, 1), dtype=np.int64)], axis=1)
        positions = mask.sum(axis=1, keepdims=True) - 1
    return {
        "case": f"onnx-{precision}",
        "tokens": int(spec["tokens"]),
        "top1_agreement": round(agree / total, 4),
        "max_abs_logit_diff": round(worst, 4),
    }


def measure_codec_fidelity(spec: dict[str, Any]) -> dict[str, Any]:
    """The INT8 decoder and Vocos (``int8-all``) against FP32's (``int8``) on the same hidden
    states: the waveform's SNR, one shot and streamed in the engine's pieces.

    The hidden states are one generation of the INT8 GPT (EOS blocked), shared by both
    variants, so only the decoders differ. On random weights an indicator only: ChatTTS's
    decoder starts with its residual branches scaled by 1e-6, so its own error hardly shows.
    """
    import numpy as np

    from tts_bridge.engines.chattts.onnx_engine import STREAM_CHUNK_CODES
    from tts_bridge.engines.chattts.onnx_format import precision_files, read_manifest
    from tts_bridge.engines.chattts.onnx_model import (
        ChatTTSOnnxModel,
        SamplingParams,
        code_prompt,
    )

    export, threads, tokens = Path(spec["export"]), int(spec["threads"]), int(spec["tokens"])
    manifest = read_manifest(export)
    reference = ChatTTSOnnxModel(export, precision_files(manifest, "int8"), threads=threads)
    tested = ChatTTSOnnxModel(export, precision_files(manifest, "int8-all"), threads=threads)
    prompt = reference.encode(
        [code_prompt(reference.cleaner(FIDELITY_TEXT), SPEED_LEVEL, True)], None
    )
    params = SamplingParams(min_new_token=tokens, max_new_token=tokens)
    (result,) = reference.generate(prompt, params, seed=0)
    want, got = reference.decode(result.hiddens), tested.decode(result.hiddens)
    decoder, pieces, count = tested.stream_decoder(), [], 0
    for size in STREAM_CHUNK_CODES:
        if count + size >= tokens:
            break
        count += size
        pieces.append(decoder.push(result.hiddens[:count]))
    pieces.append(decoder.push(result.hiddens, final=True))
    streamed = np.concatenate(pieces)

    def snr_db(ref: Any, other: Any) -> float:
        noise = float(np.sum((ref.astype(np.float64) - other) ** 2))
        return round(10 * float(np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise)), 1)

    return {
        "case": "onnx-int8-all",
        "tokens": tokens,
        "snr_db": snr_db(want, got),
        "streamed_snr_db": snr_db(want, streamed),
        "max_abs_diff": round(float(np.abs(want - got).max()), 5),
    }


FIRST_AUDIO_ROUNDS = 2
"""Each way of starting a stream is timed this often, interleaved; the fastest is kept."""
SNR_CONTEXTS = (1, 2, 4, 6, 8, 12, 16, 24)
"""Right-hand contexts (codes) at which the first piece's deviation is measured."""


def first_audio_both_ways(
    engine: Any, model: Any, codes: int
) -> tuple[dict[str, float], dict[str, Any]]:
    """The first streamed audio of ``FIRST_AUDIO_TEXT`` with the engine's early start and
    without it (exact pieces only), interleaved; the early start's figures, and both ways'
    parts: where the time went (``times_at_first_chunk``) and, for the early start, the
    deviation of its approximate samples from the exact audio of the same codes."""
    from tts_bridge.engines.chattts.common import ChatTTSOptions

    early = engine.early_start
    best: dict[bool, tuple[dict[str, float], dict[str, Any]]] = {}
    with onnx_fixed_codes(codes):
        for _ in range(FIRST_AUDIO_ROUNDS):
            for on in (True, False):
                engine.early_start = early if on else None
                parts: dict[str, Any] = {}

                def stream(parts: dict[str, Any] = parts) -> Iterator[Any]:
                    # What a "stream": true request gets: audio while the codes are generated.
                    chunks = engine.synthesize_stream(FIRST_AUDIO_TEXT, None, ChatTTSOptions())
                    return times_at_first_chunk(chunks, model, parts)

                timed = time_first_chunk(stream)
                parts["rest_ms"] = round(
                    timed["first_ms"] - parts["prefill_ms"] - parts["codes_ms"], 1
                )
                report = engine.last_early_start
                if on and report is not None:
                    parts["approximate_ms"] = round(1000 * report.approximate / 24_000, 1)
                    parts["previews"] = report.previews
                    parts["snr_db"] = None if report.snr_db is None else round(report.snr_db, 1)
                if on not in best or timed["first_ms"] < best[on][0]["first_ms"]:
                    best[on] = (timed, parts)
    engine.early_start = early
    (first, early_parts), (exact, exact_parts) = best[True], best[False]
    parts = {**early_parts, "exact_ms": round(exact["first_ms"], 1)}
    parts.update({f"exact_{key}": value for key, value in exact_parts.items()})
    return first, parts


def early_snr_by_context(model: Any, hiddens: Any) -> dict[str, float]:
    """The first piece's deviation (SNR in dB against the one-shot decode of the same codes)
    as a function of its right-hand context: a fresh stream's preview after ``codes`` +
    context codes, over the ``codes`` codes the first piece covers."""
    from tts_bridge.engines.chattts.onnx_early import SAMPLES_PER_CODE, EarlyStart, snr_db

    exact = model.decode(hiddens)
    span = EarlyStart().codes * SAMPLES_PER_CODE
    out: dict[str, float] = {}
    for context in SNR_CONTEXTS:
        preview = model.stream_decoder().preview(hiddens[: EarlyStart().codes + context])
        out[str(context)] = round(snr_db(preview[:span], exact[:span]), 1)
    return out


def times_at_first_chunk(chunks: Iterator[Any], model: Any, into: dict[str, Any]) -> Iterator[Any]:
    """Pass ``chunks`` through; at the first audio, note where its time went into ``into``:
    the prefill step, the codes made so far (GPT steps after the prefill, and sampling), the
    rest (text preparation, the prompt, the first piece's decode) is ``first_ms`` less these.
    At the end, ``stalls_ms``: how long a listener playing each piece as it came (24 kHz)
    would have waited for the next one."""
    playback_ends: float | None = None
    stalls = 0.0
    for chunk in chunks:
        if len(chunk):
            now = time.perf_counter()
            if playback_ends is None:
                times = model.times  # live: the engine's generation in progress
                into.update(
                    prefill_ms=round(1000 * times.prefill, 1),
                    codes=times.steps,
                    codes_ms=round(1000 * (times.gpt - times.prefill + times.sampling), 1),
                )
                playback_ends = now
            stalls += max(0.0, now - playback_ends)
            playback_ends = max(playback_ends, now) + len(chunk) / 24_000
        yield chunk
    into["stalls_ms"] = round(1000 * stalls, 1)


def kv_bytes_per_step(model: Any, prompt: Any, tokens: int) -> float:
    """The KV cache a step reads, averaged over a generation of ``tokens`` codes (FP32)."""
    batch, prompt_len = prompt.input_ids.shape
    per_position = 2 * model.num_layers * model.num_heads * model.head_dim * 4 * batch
    return float(per_position * (prompt_len + (tokens - 1) / 2))


@contextlib.contextmanager
def onnx_fixed_codes(codes: int) -> Iterator[None]:
    """Make ChatTTSOnnxEngine's generations exactly ``codes`` long (EOS blocked until then).

    The engine sizes each generation with ``max_new_tokens`` and builds its ``SamplingParams``
    in the module; both are replaced while this is active.
    """
    from tts_bridge.engines.chattts import onnx_engine
    from tts_bridge.engines.chattts.onnx_model import SamplingParams

    def fixed(*args: Any, **kwargs: Any) -> Any:
        kwargs["min_new_token"] = kwargs["max_new_token"] = codes
        return SamplingParams(*args, **kwargs)

    with (
        patched(onnx_engine, "max_new_tokens", lambda _seconds: codes),
        patched(onnx_engine, "SamplingParams", fixed),
    ):
        yield


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"] and len(args) == 2:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        print(json.dumps(measure_onnx(json.loads(args[1]))))
        return 0
    if args[:1] == ["--codec-fidelity"] and len(args) == 2:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        print(json.dumps(measure_codec_fidelity(json.loads(args[1]))))
        return 0
    if args[:1] == ["--fidelity"] and len(args) == 2:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        print(json.dumps(measure_fidelity(json.loads(args[1]))))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m tts_bridge.bench.onnx_backends",
        description="the ChatTTS bench (tts-bridge bench --chattts), ONNX cases only",
    )
    parser.add_argument("out", type=Path, help="work folder (checkpoint, onnx, results.json)")
    parser.add_argument("--tokens", type=int, default=200, help="codes per text")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (best kept)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--cases", nargs="+", choices=ONNX_CASES, default=list(ONNX_CASES), help="ONNX cases to run"
    )
    parser.add_argument(
        "--spinning",
        choices=("on", "off"),
        default="on",
        help="onnxruntime's spinning worker threads (off on a host busy with other work)",
    )
    options = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from tts_bridge.bench.chattts import run_chattts_bench

    run_chattts_bench(
        options.out,
        options.tokens,
        options.batches,
        rounds=options.rounds,
        cases=tuple(case for case in ONNX_CASES if case in options.cases),
        threads=options.threads,
        spinning=options.spinning == "on",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
