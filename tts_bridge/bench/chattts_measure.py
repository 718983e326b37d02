"""What runs in the ChatTTS bench's child processes: one case measured, or the checkpoint and
its ONNX export prepared (``python -m tts_bridge.bench.chattts_measure checkpoint|export|measure``).

The case names, texts and token counts live here because both child modules (this one for torch,
``tts_bridge.bench.onnx_backends`` for ONNX Runtime) measure with them and build the same row.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from tts_bridge.bench.checkpoint import random_checkpoint
from tts_bridge.bench.util import patched, peak_rss_mb, rss_mb, time_first_chunk
from tts_bridge.engines.chattts.common import (
    SAMPLE_RATE,
    SAMPLES_PER_TOKEN,
    TOKENS_PER_SECOND,
    expected_seconds,
)
from tts_bridge.engines.chattts.torch_engine import SPK_STAT_FILE, _release_freed_heap
from tts_bridge.engines.manifests import expected_hashes

MODEL_NAME = "chattts-bench"
PRECISIONS = ("fp32", "int8")
TORCH_CASES = ("torch-fp32", "torch-int8")
ONNX_CASES = ("onnx-fp32", "onnx-int8", "onnx-int8-all", "onnx-int4")
QUANTIZED_CASES = ("onnx-int8", "onnx-int4")
"""Their GPT logits are compared with FP32's (top-1 agreement) in a child of their own
(int8-all runs int8's GPT; its own difference is the decoder's, in ``codec_fidelity``)."""
PEAK_RSS_CASES = ("onnx-int8", "onnx-int8-all")
"""The cases held to the peak RSS targets: the INT8 GPT with FP32 or INT8 decoders."""
CASES = (*TORCH_CASES, *ONNX_CASES)
WARMUP_TOKENS = 4

# Texts of similar length so a batch pads little; the 4th is Chinese like many real requests.
BENCH_TEXTS = (
    "the washing machine has finished.",
    "the front door has been open for five minutes.",
    "dinner is ready, please come to the kitchen.",
    "客厅温度二十一点五度，湿度百分之四十五。",
)
FIRST_AUDIO_TEXT = "The front door is open."
"""The one-sentence announcement whose first streamed audio is timed."""
SPEED_LEVEL = 5
"""[speed_5], ChatTTS's default and the engines' at speed 1.0."""


def default_first_audio_codes(text: str = FIRST_AUDIO_TEXT) -> int:
    """The engine's own length estimate of ``text`` in codes (106 for the announcement)."""
    return math.ceil(expected_seconds(text, SPEED_LEVEL) * TOKENS_PER_SECOND)


# -- one case (runs in a child process) ----------------------------------------------------------


def result_row(
    spec: dict[str, Any],
    *,
    started_load: float,
    import_s: float,
    load_s: float,
    loop_s: float,
    decode_s: float,
    audio_s: float,
    first_audio: dict[str, float] | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """One child's figures, the same fields for every case (both child modules build it)."""
    tokens, batch = int(spec["tokens"]), int(spec["batch"])
    row: dict[str, Any] = {
        "case": spec["case"],
        "batch": batch,
        "threads": spec["threads"],
        "tokens_per_text": tokens,
        "import_s": round(import_s, 2),
        "load_s": round(load_s, 2),
        # One step makes one code for every text in the batch; sampling is included.
        "ms_per_step": round(1000 * loop_s / tokens, 2),
        "tokens_per_s": round(batch * tokens / loop_s, 1),
        "loop_s": round(loop_s, 3),
        "decode_s": round(decode_s, 3),
        "audio_s": round(audio_s, 2),
        "loop_rtf": round(loop_s / audio_s, 3),
        "decode_rtf": round(decode_s / audio_s, 4),
        "rtf": round((loop_s + decode_s) / audio_s, 3),
        **extra,
    }
    if first_audio is not None:
        codes = int(spec["first_audio_codes"])
        # The forced count must have held (a little audio may be dropped as silence).
        expected = (2 * codes - 1) * SAMPLES_PER_TOKEN // 2
        if first_audio["total_samples"] < 0.8 * expected:
            raise RuntimeError(
                f"{spec['case']}: {first_audio['total_samples']} samples for {codes} forced "
                f"codes (about {expected} expected): the fixed code count did not hold"
            )
        row.update(
            {
                "first_audio_text": FIRST_AUDIO_TEXT,
                "first_audio_codes": codes,
                "first_audio_ms": round(first_audio["first_ms"], 1),
                "first_chunk_audio_s": round(first_audio["first_samples"] / SAMPLE_RATE, 2),
                "sentence_ms": round(first_audio["total_ms"], 1),
                "sentence_audio_s": round(first_audio["total_samples"] / SAMPLE_RATE, 2),
                "sentence_chunks": first_audio["chunks"],
            }
        )
    row.update(
        {
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "torch_imported": "torch" in sys.modules,
            "loadavg_start": round(started_load, 2),
            "loadavg_end": round(os.getloadavg()[0], 2),
        }
    )
    return row


def measure_torch(spec: dict[str, Any]) -> dict[str, Any]:
    """torch FP32 or INT8: load through ChatTTSEngine, time the loop, decoding, first audio."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tts_bridge.engines.chattts.common import ChatTTSOptions
    from tts_bridge.engines.chattts.torch_engine import ChatTTSEngine

    precision = spec["case"].removeprefix("torch-")
    if precision not in PRECISIONS:
        raise ValueError(f"not a torch case: {spec['case']}")
    batch, tokens = int(spec["batch"]), int(spec["tokens"])
    loadavg_start = os.getloadavg()[0]
    started = time.perf_counter()
    # Importing torch, transformers and ChatTTS is a cost of its own (the bridge pays it on the
    # first ChatTTS request); timed apart so load_s is the model itself.
    importlib.import_module("ChatTTS")
    import_s = time.perf_counter() - started
    engine = ChatTTSEngine(
        Path(spec["checkpoint"]),
        expected_sha256=expected_hashes(MODEL_NAME, Path(spec["models_dir"])),
        threads=int(spec["threads"]),
    )
    started = time.perf_counter()
    engine.load()  # verifies every file's SHA-256, as the bridge does
    load_s = time.perf_counter() - started
    rss_loaded = rss_mb()
    # The engine has no public way to fix the token count (it sizes each generation from the
    # text), so the bench drives the loaded Chat object with ChatTTS's own parameters.
    loaded = engine._loaded
    assert loaded is not None
    chat = loaded.chat
    # Every fixed-length run ends "incomplete" at max_new_token by design; not worth a warning.
    logging.getLogger("tts_bridge.engines.chattts.torch_engine.chattts").setLevel(logging.ERROR)

    quantize_s = 0.0
    quantized_linears = 0
    if precision == "int8":
        import torch

        started = time.perf_counter()
        # torch.ao.quantization carries no annotations; the call is the documented API.
        torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            chat.gpt.gpt, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
        )
        quantize_s = time.perf_counter() - started
        quantized_linears = sum(
            type(m).__module__.startswith("torch.ao.nn.quantized.dynamic")
            for m in chat.gpt.gpt.modules()
        )
        # Hand the heap freed by the swap back to the OS (as the engine does on unload). The
        # FP32 weights themselves stay mapped from model.safetensors (clean file pages that
        # the kernel can reclaim, but RSS counts them) while any GPT tensor still uses it.
        gc.collect()
        _release_freed_heap()
    rss_ready = rss_mb()

    speaker = loaded.default_speaker
    texts = [
        chat.normalizer(BENCH_TEXTS[i % len(BENCH_TEXTS)], True, True, None) for i in range(batch)
    ]
    _generate(chat, texts, speaker, WARMUP_TOKENS)
    loop_s, decode_s, _generated, samples = _generate(chat, texts, speaker, tokens)
    # transformers memory-maps the GPT weights: they become resident as the first generation
    # touches them, so the RSS of a model in use is read after the run, not after loading.
    rss_in_use = rss_mb()
    first_audio = None
    codes = int(spec["first_audio_codes"])
    if codes:
        with _torch_fixed_codes(chat, codes):
            first_audio = time_first_chunk(
                lambda: engine.synthesize(FIRST_AUDIO_TEXT, None, ChatTTSOptions())
            )
    return result_row(
        spec,
        started_load=loadavg_start,
        import_s=import_s,
        load_s=load_s,
        loop_s=loop_s,
        decode_s=decode_s,
        audio_s=samples * batch / SAMPLE_RATE,
        first_audio=first_audio,
        extra={
            "quantize_s": round(quantize_s, 2),
            "quantized_linears": quantized_linears,
            "samples_per_text": samples,
            "rss_loaded_mb": round(rss_loaded, 1),
            "rss_ready_mb": round(rss_ready, 1),
            "rss_in_use_mb": round(rss_in_use, 1),
        },
    )


@contextlib.contextmanager
def _torch_fixed_codes(chat: Any, codes: int) -> Iterator[None]:
    """Make ChatTTSEngine's next generations exactly ``codes`` long (EOS blocked until then)."""
    original = chat.InferCodeParams

    def fixed(**kwargs: Any) -> Any:
        kwargs["min_new_token"] = kwargs["max_new_token"] = codes
        return original(**kwargs)

    with patched(chat, "InferCodeParams", fixed):
        yield


def _generate(
    chat: Any, texts: list[str], speaker: str, tokens: int
) -> tuple[float, float, int, int]:
    """One batch through the GPT and then the decoder + Vocos, the two halves of Chat._infer.

    Returns (code loop seconds, decode seconds, tokens generated, samples per text).
    """
    params = chat.InferCodeParams(
        prompt=f"[speed_{SPEED_LEVEL}]",
        spk_emb=speaker,
        temperature=0.3,
        top_P=0.7,
        top_K=20,
        max_new_token=tokens,
        min_new_token=tokens,  # EOS is masked until here: exactly `tokens` per text
        show_tqdm=False,
        manual_seed=0,
    )
    started = time.perf_counter()
    result = next(chat._infer_code(texts, False, chat.device, True, params))
    loop_s = time.perf_counter() - started
    generated = sum(int(h.shape[0]) for h in result.hiddens)
    started = time.perf_counter()
    wavs = chat._decode_to_wavs(result.hiddens, True)
    decode_s = time.perf_counter() - started
    result.destroy()
    if generated != tokens * len(texts):
        raise RuntimeError(f"expected {tokens} tokens per text, the GPT made {generated} in all")
    return loop_s, decode_s, generated, int(wavs.shape[-1])


def _child_main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result: dict[str, Any]
    if argv[:1] == ["checkpoint"] and len(argv) == 4:
        checkpoint = Path(argv[1])
        writer = random_checkpoint()
        result = {"built": False}
        # spk_stat.json is written last: its presence means a complete checkpoint.
        if not (checkpoint / SPK_STAT_FILE).is_file():
            started = time.perf_counter()
            official = writer.OFFICIAL
            # 0: the official size.
            size = replace(
                official,
                hidden_size=int(argv[2]) or official.hidden_size,
                num_layers=int(argv[3]) or official.num_layers,
            )
            writer.write_random_checkpoint(checkpoint, size)
            result = {"built": True, "build_s": round(time.perf_counter() - started, 1)}
        result["official_sections"] = writer.official_sections(checkpoint)
    elif argv[:1] == ["export"] and len(argv) == 4:
        from tts_bridge.engines.chattts.onnx_format import MANIFEST_FILE, read_manifest
        from tts_bridge.engines.chattts.quantize import (
            quantize_int4,
            quantize_int8_all,
            quantize_onnx,
        )

        checkpoint, export = Path(argv[1]), Path(argv[2])
        started = time.perf_counter()
        if not (export / MANIFEST_FILE).is_file():
            from tts_bridge.engines.chattts.export import export_chattts

            export_chattts(checkpoint, export)
        exported = time.perf_counter()
        if "int8" not in read_manifest(export)["variants"]:
            quantize_onnx(export)
        extra = set(argv[3].split(","))  # the optional variants: int4, int8-all (or none)
        if "int4" in extra and "int4" not in read_manifest(export)["variants"]:
            quantize_int4(export)
        if "int8-all" in extra and "int8-all" not in read_manifest(export)["variants"]:
            quantize_int8_all(export)
        result = {
            "export_s": round(exported - started, 1),
            "quantize_s": round(time.perf_counter() - exported, 1),
        }
    elif argv[:1] == ["measure"] and len(argv) == 2:
        result = measure_torch(json.loads(argv[1]))
    else:
        print(
            "usage: python -m tts_bridge.bench.chattts_measure checkpoint DEST HIDDEN LAYERS\n"
            "       python -m tts_bridge.bench.chattts_measure export CHECKPOINT DEST "
            "int4,int8-all|none\n"
            "       python -m tts_bridge.bench.chattts_measure measure SPEC_JSON",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
