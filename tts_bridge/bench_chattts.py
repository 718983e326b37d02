"""`tts-bridge bench --chattts`: ChatTTS speed and memory on the full-size architecture.

The real weights come from a model hub this project never contacts, so the bench writes a
checkpoint with the official shapes and random weights into a temporary folder: GPT 768 hidden x
20 layers (12 heads, MLP 3072), 4 VQ codebooks of 626 audio tokens, a 21178-token text vocabulary,
and ChatTTS's own decoder, DVAE and Vocos sizes (taken from ``ChatTTS.config.Config``). Random
weights: speed and memory are real, the sound is not.

The checkpoint is recorded in a temporary model manifest and loaded through ``ChatTTSEngine``
(hash verification, Config derived from the files, ChatTTS's loader): the code path the bridge
runs. The GPT then generates exactly ``tokens`` tokens per text (``min_new_token ==
max_new_token``: random weights would otherwise stop at a random EOS), so every run does the same
work. Measured per configuration -- torch FP32 or dynamic INT8 (``quantize_dynamic`` on the GPT's
Linear layers), batch 1 or 4 -- each in its own child process so its peak RSS is its own: load
time, GPT tokens/s, real-time factors (one token = 512 samples at 24 kHz, 46.875 tokens per
second of audio; the bench measures it), decoder + Vocos time, RSS after loading, RSS of the
model in use (after the run: transformers maps the GPT weights from the file, and they become
resident only as generation touches them) and peak RSS.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from tts_bridge import __version__
from tts_bridge.benchutil import machine_info
from tts_bridge.benchutil import table as _table
from tts_bridge.engines.chattts_torch import (
    NUM_AUDIO_TOKENS,
    NUM_VQ,
    SAMPLE_RATE,
    SPK_STAT_FILE,
    SPK_STAT_FORMAT,
    _release_freed_heap,
    read_checkpoint,
)
from tts_bridge.models import add_model, expected_hashes

_LOGGER = logging.getLogger(__name__)

NOTE = "random weights: speed and memory are real, the sound is not"
MODEL_NAME = "chattts-bench"
OFFICIAL_HIDDEN_SIZE = 768
OFFICIAL_LAYERS = 20
HEAD_DIM = 64
"""Official: 12 heads of 64 for hidden 768; smaller test models keep the head width."""
NUM_TEXT_TOKENS = 21178
"""bert-base-chinese's 21128 tokens plus ChatTTS's 50 control tokens (Embed and head_text)."""
LLAMA_VOCAB_SIZE = 32000
"""The official gpt/config.json keeps LlamaConfig's default; ChatTTS deletes that embedding."""
PRECISIONS = ("fp32", "int8")
WARMUP_TOKENS = 4
CHILD_TIMEOUT_S = 3600

# Texts of similar length so a batch pads little; the 4th is Chinese like many real requests.
BENCH_TEXTS = (
    "the washing machine has finished.",
    "the front door has been open for five minutes.",
    "dinner is ready, please come to the kitchen.",
    "客厅温度二十一点五度，湿度百分之四十五。",
)

_BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# ChatTTS's 50 tokens in upstream order; [break_0] must rank above every ordinary token.
_CHATTTS_SPECIAL = (
    "[Sasr]", "[Pasr]", "[Easr]", "[Stts]", "[Ptts]", "[Etts]",
    "[Sbreak]", "[Pbreak]", "[Ebreak]", "[uv_break]", "[v_break]",
    "[lbreak]", "[llbreak]", "[undefine]", "[laugh]", "[spk_emb]", "[empty_spk]",
    "[music]", "[pure]",
    *(f"[break_{i}]" for i in range(8)),
    *(f"[laugh_{i}]" for i in range(3)),
    *(f"[oral_{i}]" for i in range(10)),
    *(f"[speed_{i}]" for i in range(10)),
)  # fmt: skip


# -- the checkpoint -------------------------------------------------------------------------------


def write_random_checkpoint(
    dest: Path,
    *,
    hidden_size: int = OFFICIAL_HIDDEN_SIZE,
    num_layers: int = OFFICIAL_LAYERS,
    seed: int = 0,
) -> Path:
    """Write a ChatTTS checkpoint with random weights in the official layout; returns ``dest``.

    With the defaults every tensor has the official shape. ``hidden_size``/``num_layers`` shrink
    only the GPT (and the embeddings, whose width is the GPT's); the decoder, DVAE and Vocos keep
    ChatTTS's own sizes, so their cost is measured as it is.
    """
    import torch

    if hidden_size % 2 or hidden_size < 2:
        raise ValueError("hidden_size must be even (each hidden state becomes two mel frames)")
    heads = max(1, hidden_size // HEAD_DIM)
    if hidden_size % heads:
        raise ValueError(f"hidden_size must be a multiple of {HEAD_DIM} above {HEAD_DIM}")
    asset = dest / "asset"
    (asset / "gpt").mkdir(parents=True, exist_ok=True)
    (asset / "tokenizer").mkdir(parents=True, exist_ok=True)
    vocab_size = _write_tokenizer(asset / "tokenizer")
    # A private RNG stream: the caller's global torch RNG state is left alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _write_gpt(asset / "gpt", hidden_size, num_layers, heads)
        _write_codec(asset, hidden_size, vocab_size)
    _write_spk_stat(dest / SPK_STAT_FILE, hidden_size, seed)
    return dest


def _save(state: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(path))


def _write_gpt(folder: Path, hidden_size: int, num_layers: int, heads: int) -> None:
    from transformers import LlamaConfig, LlamaModel

    config: dict[str, Any] = {
        "architectures": ["LlamaModel"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": 4 * hidden_size,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "num_attention_heads": heads,
        "num_hidden_layers": num_layers,
        "num_key_value_heads": heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": False,
        "vocab_size": LLAMA_VOCAB_SIZE,
        # The keys ChatTTS adds to its config.json.
        "num_audio_tokens": NUM_AUDIO_TOKENS,
        "num_text_tokens": None,
        "num_vq": NUM_VQ,
        "spk_KL": False,
        "spk_emb_dim": 192,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    llama = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    # Saved whole, embed_tokens included, as LlamaModel.save_pretrained writes it: loading then
    # reads and drops that matrix just as it does with the released file.
    _save(LlamaModel(LlamaConfig(**llama)).state_dict(), folder / "model.safetensors")


def _write_codec(asset: Path, hidden_size: int, num_text_tokens: int) -> None:
    """Embed, DVAE, Decoder and Vocos from ChatTTS's own classes and default (official) sizes."""
    from ChatTTS.config.config import Config, Decoder
    from ChatTTS.model.dvae import DVAE
    from ChatTTS.model.embed import Embed

    # vocos ships no type information; importlib keeps mypy from asking for stubs.
    vocos = importlib.import_module("vocos")
    instantiate = importlib.import_module("vocos.pretrained").instantiate_class
    official = Config()

    _save(
        Embed(hidden_size, NUM_AUDIO_TOKENS, num_text_tokens, NUM_VQ).state_dict(),
        asset / "Embed.safetensors",
    )
    dvae = DVAE(
        decoder_config=asdict(official.dvae.decoder),
        encoder_config=asdict(official.dvae.encoder),
        vq_config=asdict(official.dvae.vq),
        dim=official.dvae.decoder.idim,
    )
    _save(dvae.state_dict(), asset / "DVAE.safetensors")
    # The decoder reads each GPT hidden state folded into two mel frames: idim = hidden / 2
    # (384 for the official model); its own width and depth are ChatTTS's.
    size = official.decoder
    decoder = Decoder(
        idim=hidden_size // 2,
        odim=hidden_size // 2,
        hidden=size.hidden,
        n_layer=size.n_layer,
        bn_dim=size.bn_dim,
    )
    _save(
        DVAE(decoder_config=asdict(decoder), dim=decoder.idim).state_dict(),
        asset / "Decoder.safetensors",
    )
    vocoder = vocos.Vocos(
        feature_extractor=instantiate(args=(), init=asdict(official.vocos.feature_extractor)),
        backbone=instantiate(args=(), init=asdict(official.vocos.backbone)),
        head=instantiate(args=(), init=asdict(official.vocos.head)),
    )
    _save(vocoder.state_dict(), asset / "Vocos.safetensors")


def _write_tokenizer(folder: Path) -> int:
    """A BERT WordPiece tokenizer of the official size; returns its length (21178)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    punctuation = "，。、！？：；“”‘’（）,.!?:;'\"()-%°/"
    pieces = list(dict.fromkeys([*_BERT_SPECIAL, *punctuation, *letters]))
    pieces.extend(f"##{c}" for c in letters)
    # CJK characters fill the ordinary vocabulary, as in bert-base-chinese.
    ordinary = NUM_TEXT_TOKENS - len(_CHATTTS_SPECIAL)
    cjk = (chr(c) for r in (range(0x4E00, 0xA000), range(0x3400, 0x4DC0)) for c in r)
    pieces.extend(next(cjk) for _ in range(ordinary - len(pieces)))
    vocab = {piece: index for index, piece in enumerate(pieces)}

    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens([*_BERT_SPECIAL, *_CHATTTS_SPECIAL])
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
        "pad_token": "[PAD]",
        "sep_token": "[SEP]",
        "unk_token": "[UNK]",
    }
    config = {
        **special,
        "tokenizer_class": "BertTokenizerFast",
        "do_lower_case": True,
        "tokenize_chinese_chars": True,
        "strip_accents": None,
        "clean_up_tokenization_spaces": True,
        "model_max_length": 1 << 20,
        "padding_side": "left",
    }
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", special)
    size: int = tokenizer.get_vocab_size(with_added_tokens=True)
    return size


def _write_spk_stat(path: Path, hidden_size: int, seed: int) -> None:
    pybase16384 = importlib.import_module("pybase16384")
    rng = np.random.default_rng(seed)
    stat = np.concatenate(
        [rng.uniform(0.5, 1.5, hidden_size), rng.normal(0.0, 0.2, hidden_size)]
    ).astype(np.float16)
    _write_json(
        path,
        {
            "format": SPK_STAT_FORMAT,
            "version": 1,
            "hidden_size": hidden_size,
            "spk_stat": pybase16384.encode_to_string(stat.tobytes()),
        },
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def official_sections(checkpoint: Path) -> list[str]:
    """The sections of ChatTTS's Config that this checkpoint's files reproduce exactly."""
    from ChatTTS.config.config import Config

    from tts_bridge.engines.chattts_torch import chattts_config

    official = Config()
    derived = chattts_config(read_checkpoint(checkpoint), official.spk_stat)
    return [
        section
        for section in ("gpt", "embed", "decoder", "dvae", "vocos")
        if asdict(getattr(derived, section)) == asdict(getattr(official, section))
    ]


# -- one configuration (runs in a child process) ------------------------------------------------


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _rss_mb() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / (1 << 20)


def measure(
    checkpoint: Path,
    models_dir: Path,
    *,
    precision: str,
    batch: int,
    tokens: int,
    threads: int,
) -> dict[str, Any]:
    """Load through ChatTTSEngine, then time one fixed-length generation and its decoding."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tts_bridge.engines.chattts_torch import ChatTTSEngine

    loadavg_start = os.getloadavg()[0]
    started = time.perf_counter()
    # Importing torch, transformers and ChatTTS is a cost of its own (the bridge pays it on the
    # first ChatTTS request); timed apart so load_s is the model itself.
    importlib.import_module("ChatTTS")
    import_s = time.perf_counter() - started
    engine = ChatTTSEngine(
        checkpoint, expected_sha256=expected_hashes(MODEL_NAME, models_dir), threads=threads
    )
    started = time.perf_counter()
    engine.load()  # verifies every file's SHA-256, as the bridge does
    load_s = time.perf_counter() - started
    rss_loaded = _rss_mb()
    # The engine has no public way to fix the token count (it sizes each generation from the
    # text), so the bench drives the loaded Chat object with ChatTTS's own parameters.
    loaded = engine._loaded
    assert loaded is not None
    chat = loaded.chat
    # Every fixed-length run ends "incomplete" at max_new_token by design; not worth a warning.
    logging.getLogger("tts_bridge.engines.chattts_torch.chattts").setLevel(logging.ERROR)

    quantize_s = 0.0
    if precision == "int8":
        import torch

        started = time.perf_counter()
        # torch.ao.quantization carries no annotations; the call is the documented API.
        torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            chat.gpt.gpt, {torch.nn.Linear}, dtype=torch.qint8, inplace=True
        )
        quantize_s = time.perf_counter() - started
        # Hand the heap freed by the swap back to the OS (as the engine does on unload). The
        # FP32 weights themselves stay mapped from model.safetensors (clean file pages that
        # the kernel can reclaim, but RSS counts them) while any GPT tensor still uses it.
        gc.collect()
        _release_freed_heap()
    elif precision != "fp32":
        raise ValueError(f"precision must be one of {PRECISIONS}")
    rss_ready = _rss_mb()

    speaker = engine.sample_speaker(0)
    texts = [
        chat.normalizer(BENCH_TEXTS[i % len(BENCH_TEXTS)], True, True, None) for i in range(batch)
    ]
    _generate(chat, texts, speaker, WARMUP_TOKENS)
    gpt_s, decode_s, generated, samples = _generate(chat, texts, speaker, tokens)
    # transformers memory-maps the GPT weights: they become resident as the first generation
    # touches them, so the RSS of a model in use is read after the run, not after loading.
    rss_in_use = _rss_mb()
    audio_s = samples * batch / SAMPLE_RATE
    return {
        "precision": precision,
        "batch": batch,
        "threads": threads,
        "tokens_per_text": tokens,
        "tokens_total": generated,
        "import_s": round(import_s, 2),
        "load_s": round(load_s, 2),
        "quantize_s": round(quantize_s, 2),
        "gpt_s": round(gpt_s, 2),
        "gpt_tokens_per_s": round(generated / gpt_s, 1),
        "gpt_rtf": round(gpt_s / audio_s, 3),
        "decode_s": round(decode_s, 3),
        "decode_rtf": round(decode_s / audio_s, 4),
        "rtf": round((gpt_s + decode_s) / audio_s, 3),
        "samples_per_text": samples,
        # Vocos' centred ISTFT gives (2 x tokens - 1) x 256 samples: 512 per token less one hop.
        "samples_per_token": round(samples / tokens, 2),
        "audio_s": round(audio_s, 2),
        "rss_loaded_mb": round(rss_loaded, 1),
        "rss_ready_mb": round(rss_ready, 1),
        "rss_in_use_mb": round(rss_in_use, 1),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "loadavg_start": round(loadavg_start, 2),
        "loadavg_end": round(os.getloadavg()[0], 2),
    }


def _generate(
    chat: Any, texts: list[str], speaker: str, tokens: int
) -> tuple[float, float, int, int]:
    """One batch through the GPT and then the decoder + Vocos, the two halves of Chat._infer.

    Returns (GPT seconds, decode seconds, tokens generated, samples per text).
    """
    params = chat.InferCodeParams(
        prompt="[speed_5]",
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
    gpt_s = time.perf_counter() - started
    generated = sum(int(h.shape[0]) for h in result.hiddens)
    started = time.perf_counter()
    wavs = chat._decode_to_wavs(result.hiddens, True)
    decode_s = time.perf_counter() - started
    result.destroy()
    if generated != tokens * len(texts):
        raise RuntimeError(f"expected {tokens} tokens per text, the GPT made {generated} in all")
    return gpt_s, decode_s, generated, int(wavs.shape[-1])


# -- the bench ------------------------------------------------------------------------------------


def _child(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-m", "tts_bridge.bench_chattts", *args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench child {args[0]} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


TABLE_COLUMNS = [
    "precision",
    "batch",
    "import_s",
    "load_s",
    "quantize_s",
    "gpt_tokens_per_s",
    "gpt_rtf",
    "decode_rtf",
    "rtf",
    "rss_in_use_mb",
    "peak_rss_mb",
    "loadavg_start",
]


def run_chattts_bench(
    out: Path,
    tokens: int = 200,
    batches: Sequence[int] = (1, 4),
    hidden_size: int = OFFICIAL_HIDDEN_SIZE,
    num_layers: int = OFFICIAL_LAYERS,
    *,
    precisions: Sequence[str] = PRECISIONS,
    threads: int | None = None,
) -> dict[str, Any]:
    """Build the random checkpoint, measure every precision x batch, print a table, write JSON."""
    if tokens < 1 or not batches or min(batches) < 1:
        raise ValueError("tokens and every batch size must be at least 1")
    unknown = set(precisions) - set(PRECISIONS)
    if unknown:
        raise ValueError(f"unknown precisions {sorted(unknown)}; choose from {PRECISIONS}")
    threads = threads or len(os.sched_getaffinity(0))
    report: dict[str, Any] = {
        "version": __version__,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "note": NOTE,
        "machine": machine_info(),
        "command": "tts-bridge " + " ".join(sys.argv[1:]),
        "tokens_per_text": tokens,
        "threads": threads,
    }
    with tempfile.TemporaryDirectory(prefix="tts-chattts-bench-") as tmp:
        checkpoint, models_dir = Path(tmp) / "checkpoint", Path(tmp) / "models"
        print(f"writing a {hidden_size} x {num_layers} ChatTTS checkpoint ...", file=sys.stderr)
        report["checkpoint"] = _child(["build", str(checkpoint), str(hidden_size), str(num_layers)])
        report["checkpoint"]["dims"] = asdict(read_checkpoint(checkpoint))
        manifest = add_model(MODEL_NAME, checkpoint, models_dir)
        report["checkpoint"]["bytes"] = manifest.total_bytes
        rows = []
        for precision in precisions:
            for batch in batches:
                print(f"measuring {precision} batch {batch} ...", file=sys.stderr)
                spec = {
                    "checkpoint": str(checkpoint),
                    "models_dir": str(models_dir),
                    "precision": precision,
                    "batch": batch,
                    "tokens": tokens,
                    "threads": threads,
                }
                rows.append(_child(["measure", json.dumps(spec)]))
    report["results"] = rows
    sections = report["checkpoint"]["official_sections"]
    shape = "official shapes" if len(sections) == 5 else f"official: {', '.join(sections)}"
    print(
        f"ChatTTS, GPT {hidden_size} hidden x {num_layers} layers ({shape}), "
        f"{report['checkpoint']['bytes'] / 1e6:.0f} MB; {tokens} tokens per text, "
        f"{threads} threads\n{NOTE}\n"
    )
    print(_table(rows, TABLE_COLUMNS))
    busiest = max(max(r["loadavg_start"], r["loadavg_end"]) for r in rows)
    if busiest > report["machine"]["cpus"] / 2:
        # torch's OpenMP threads stall when the cores are shared; say so next to the figures.
        print(
            f"\nthe machine was busy (1-minute load average up to {busiest:.1f} on "
            f"{report['machine']['cpus']} cores): these figures understate the speed"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten to {out}")
    return report


def _child_main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if argv[:1] == ["build"] and len(argv) == 4:
        started = time.perf_counter()
        checkpoint = write_random_checkpoint(
            Path(argv[1]), hidden_size=int(argv[2]), num_layers=int(argv[3])
        )
        result: dict[str, Any] = {
            "build_s": round(time.perf_counter() - started, 1),
            "official_sections": official_sections(checkpoint),
        }
    elif argv[:1] == ["measure"] and len(argv) == 2:
        spec = json.loads(argv[1])
        result = measure(
            Path(spec["checkpoint"]),
            Path(spec["models_dir"]),
            precision=spec["precision"],
            batch=spec["batch"],
            tokens=spec["tokens"],
            threads=spec["threads"],
        )
    else:
        print("usage: python -m tts_bridge.bench_chattts build DEST HIDDEN LAYERS", file=sys.stderr)
        print("       python -m tts_bridge.bench_chattts measure SPEC_JSON", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
