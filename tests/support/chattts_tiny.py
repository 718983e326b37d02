"""A tiny randomly initialised ChatTTS checkpoint in the real asset layout, for tests.

The real weights (about 1.1 GB) come from a model hub this project never contacts, so the tests
drive the real ``chattts`` code with this stand-in. Every file is written where ChatTTS expects
its official file, with the same tensor names, built from ChatTTS's own module classes so the key
names and shapes cannot drift from what ``Chat.load`` accepts::

    <dest>/asset/gpt/config.json              LlamaConfig JSON with ChatTTS's extra keys
    <dest>/asset/gpt/model.safetensors        LlamaModel weights (no embed_tokens, as upstream)
    <dest>/asset/Embed.safetensors            text/code embeddings and heads (num_vq = 4, 626 codes)
    <dest>/asset/DVAE.safetensors             encoder + GFSQ quantizer + decoder
    <dest>/asset/Decoder.safetensors          the hidden-state decoder (idim = GPT hidden / 2)
    <dest>/asset/Vocos.safetensors            vocoder (100 mel channels, n_fft 1024, hop 256)
    <dest>/asset/tokenizer/{tokenizer.json, tokenizer_config.json, special_tokens_map.json}
    <dest>/asset/spk_stat.json                speaker statistics (see below)

``asset/spk_stat.json`` is this project's format for the speaker statistics of a checkpoint that
is not the official release (the official statistics are built into ChatTTS's ``Config``)::

    {"format": "chattts-spk-stat", "version": 1, "hidden_size": H, "spk_stat": "<base16384>"}

where ``spk_stat`` is the same encoding ChatTTS's ``Config.spk_stat`` uses: base16384 of the
float16 array ``[std (H values), mean (H values)]``.

Run as a script to write one: ``python tests/support/chattts_tiny.py DEST``.

The ChatTTS tests share their set-up through this module too: the ``NEEDS_CHATTTS`` and
``NEEDS_CHATTTS_ONNX`` skip markers, ``tiny_hashes`` (the expected hashes of a checkpoint's
files), ``export_tiny`` (the real exporter, optionally with INT8 quantization),
``chattts_reference`` (ChatTTS itself on a checkpoint) and ``run_torch_free`` (a snippet in a
fresh interpreter, with a report of the heavy modules it imported).

Building a checkpoint and exporting it take seconds each, and a dozen test modules need one, so
``TinyModels`` builds each variant once per test session; the session fixtures below
(registered for every test by ``tests/conftest.py``) hand them out. They are shared: treat them
as read-only, and copy one (``shutil.copytree``) before changing it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from tts_bridge.bench.chattts import (
    BERT_SPECIAL_TOKENS,
    save_safetensors,
    write_bert_tokenizer,
    write_spk_stat,
)
from tts_bridge.engines.chattts.torch_engine import CHECKPOINT_FILES, SPK_STAT_FILE, ChatTTSEngine
from tts_bridge.manifests import sha256_file

REPO_ROOT = Path(__file__).resolve().parents[2]

# ChatTTS 0.2.5 hard-wires these (EOS is code 625 and the DVAE quantizer has 5**4 = 625 codes).
NUM_VQ = 4
NUM_AUDIO_TOKENS = 626
N_MELS = 100
N_FFT = 1024
HOP_LENGTH = 256

# Sizes of the tiny model: big enough to exercise every layer type, small enough to load fast.
HIDDEN_SIZE = 32
NUM_LAYERS = 2
HEAD_DIM = 16
DVAE_VQ_DIM = 32
SMALL_CHANNELS = 16

_PUNCTUATION = "，。、！？：；“”‘’（）,.!?:;'\"()-%°/"
# Common characters of home announcements; anything else becomes [UNK], which is fine for noise.
_CJK = (
    "的一是了不在有人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过"
    "子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体"
    "制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内"
    "数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提"
    "直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计"
    "别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海"
    "口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身"
    "车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石"
    "记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青"
    "省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型"
    "眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严您好请客厅卧室"
    "厨房浴灯开关窗帘洗衣机烘干冰箱空调暖湿已经完成晚饭准备好了前门打开锁上吗度湿度摄氏明天下雨"
)


def make_tiny_checkpoint(
    dest: Path, seed: int = 0, *, hidden_size: int = HIDDEN_SIZE, num_layers: int = NUM_LAYERS
) -> Path:
    """Write a tiny random ChatTTS checkpoint under ``dest``; returns ``dest``.

    The same arguments write byte-identical files, so their hashes are stable. A larger
    ``hidden_size``/``num_layers`` (the real model: 768 x 20) makes a checkpoint of measurable
    size, e.g. to watch memory come back after unloading; ``hidden_size`` must be a multiple of 16.
    """
    import torch

    if hidden_size % HEAD_DIM:
        raise ValueError(f"hidden_size must be a multiple of {HEAD_DIM}")
    asset = dest / "asset"
    (asset / "gpt").mkdir(parents=True, exist_ok=True)
    (asset / "tokenizer").mkdir(parents=True, exist_ok=True)

    vocab_size = _write_tokenizer(asset / "tokenizer")
    # A private RNG stream: the test process's global torch RNG is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _write_gpt(asset / "gpt", hidden_size, num_layers)
        _write_embed(asset / "Embed.safetensors", hidden_size, vocab_size)
        _write_dvae(asset / "DVAE.safetensors")
        _write_decoder(asset / "Decoder.safetensors", hidden_size)
        _write_vocos(asset / "Vocos.safetensors")
    write_spk_stat(asset / "spk_stat.json", hidden_size, seed)
    return dest


# -- shared test set-up -------------------------------------------------------------------------

NEEDS_CHATTTS = pytest.mark.skipif(
    importlib.util.find_spec("ChatTTS") is None,
    reason="needs the 'chattts' extra (torch, ChatTTS)",
)

NEEDS_CHATTTS_ONNX = pytest.mark.skipif(
    importlib.util.find_spec("ChatTTS") is None
    or importlib.util.find_spec("onnx") is None
    or importlib.util.find_spec("onnxruntime") is None,
    reason="needs the 'chattts' extra plus onnx (the exporter) and onnxruntime",
)

HEAVY_MODULES = ("torch", "torchaudio", "transformers", "ChatTTS", "vocos", "numba", "onnx")
"""Top-level packages the ONNX engine must run without."""

_REPORT_HEAVY = f"""
import json as _json, sys as _sys
_heavy = sorted(n for n in _sys.modules if n.split(".")[0] in {HEAVY_MODULES!r})
print(_json.dumps({{**report, "heavy": _heavy}}))
"""


def tiny_hashes(checkpoint: Path) -> dict[str, str]:
    """The sha256 of every file ChatTTS loads from ``checkpoint`` (the expected hashes)."""
    return {rel: sha256_file(checkpoint / rel) for rel in (*CHECKPOINT_FILES, SPK_STAT_FILE)}


def export_tiny(checkpoint: Path, dest: Path, *, quantize: bool = False) -> Path:
    """Export ``checkpoint`` to ONNX under ``dest`` with the real exporter (its hashes checked),
    then add the INT8 variant if ``quantize``; returns ``dest``."""
    from tts_bridge.engines.chattts.export import export_chattts

    export_chattts(checkpoint, dest, expected_sha256=tiny_hashes(checkpoint))
    if quantize:
        from tts_bridge.engines.chattts.quantize import quantize_onnx

        quantize_onnx(dest)
    return dest


def chattts_reference(checkpoint: Path, threads: int) -> Iterator[Any]:
    """Yield ChatTTS's own ``Chat`` (torch) loaded from ``checkpoint`` by the torch engine, then
    unload it: the reference the ONNX code is compared with (``yield from`` it in a fixture)."""
    engine = ChatTTSEngine(checkpoint, expected_sha256=tiny_hashes(checkpoint), threads=threads)
    engine.load()
    yield engine._loaded.chat  # type: ignore[union-attr]  # white-box: ChatTTS's own objects
    engine.unload()


def run_torch_free(code: str, *args: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter from the repository root, with ``args`` as its
    ``sys.argv[1:]``; it must succeed and set ``report`` to a JSON-able dict.

    Returns that dict plus ``"heavy"``: the modules of HEAVY_MODULES' packages imported by the
    end of the run (sorted; empty when the code ran torch-free).
    """
    result = subprocess.run(
        [sys.executable, "-c", code + _REPORT_HEAVY, *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


# -- built once per test session ------------------------------------------------------------------


class TinyModels:
    """Tiny checkpoints and their ONNX exports, each built on first use and then reused.

    Everything lives under one session temporary folder, keyed by the arguments: the same
    ``make_tiny_checkpoint`` arguments give the same checkpoint (byte for byte), so sharing one
    between tests changes no result. The INT8 export is the FP32 export copied and quantized,
    as ``export_tiny(..., quantize=True)`` would leave it.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._built: dict[tuple[object, ...], Path] = {}

    def checkpoint(
        self, seed: int = 0, *, hidden_size: int = HIDDEN_SIZE, num_layers: int = NUM_LAYERS
    ) -> Path:
        """The checkpoint ``make_tiny_checkpoint`` writes for these arguments (read-only)."""
        key = ("checkpoint", seed, hidden_size, num_layers)
        return self._once(
            key,
            lambda dest: make_tiny_checkpoint(
                dest, seed, hidden_size=hidden_size, num_layers=num_layers
            ),
            self._folder(seed, hidden_size, num_layers) / "tiny",
        )

    def export(
        self,
        seed: int = 0,
        *,
        hidden_size: int = HIDDEN_SIZE,
        num_layers: int = NUM_LAYERS,
        quantize: bool = True,
    ) -> Path:
        """That checkpoint exported to ONNX, with the INT8 variant if ``quantize`` (read-only)."""
        folder = self._folder(seed, hidden_size, num_layers)
        checkpoint = self.checkpoint(seed, hidden_size=hidden_size, num_layers=num_layers)
        fp32 = self._once(
            ("export", seed, hidden_size, num_layers, False),
            lambda dest: export_tiny(checkpoint, dest),
            folder / "export-fp32",
        )
        if not quantize:
            return fp32
        return self._once(
            ("export", seed, hidden_size, num_layers, True),
            lambda dest: _quantized_copy(fp32, dest),
            folder / "export",
        )

    def _folder(self, seed: int, hidden_size: int, num_layers: int) -> Path:
        return self._root / f"seed{seed}-{hidden_size}x{num_layers}"

    def _once(self, key: tuple[object, ...], build: Callable[[Path], Path], dest: Path) -> Path:
        if key not in self._built:
            if dest.exists():  # a build that failed half-way: start again
                shutil.rmtree(dest)
            self._built[key] = build(dest)
        return self._built[key]


def _quantized_copy(export: Path, dest: Path) -> Path:
    from tts_bridge.engines.chattts.quantize import quantize_onnx

    shutil.copytree(export, dest)
    quantize_onnx(dest)
    return dest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """The session's tiny ChatTTS checkpoints and exports (see ``TinyModels``)."""
    return TinyModels(tmp_path_factory.mktemp("chattts-tiny"))


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_models: TinyModels) -> Path:
    """The tiny checkpoint of seed 0 (read-only; skipped without the 'chattts' extra)."""
    if importlib.util.find_spec("ChatTTS") is None:
        pytest.skip("needs the 'chattts' extra (torch, ChatTTS)")
    return tiny_models.checkpoint()


@pytest.fixture(scope="session")
def tiny_export(tiny_models: TinyModels, tiny_checkpoint: Path) -> Path:
    """``tiny_checkpoint`` exported to ONNX and quantized: FP32 and INT8 (read-only)."""
    return tiny_models.export()


@pytest.fixture(scope="session")
def tiny_export_fp32(tiny_models: TinyModels, tiny_checkpoint: Path) -> Path:
    """``tiny_checkpoint`` exported to ONNX, FP32 only (read-only)."""
    return tiny_models.export(quantize=False)


# -- writing the files ----------------------------------------------------------------------------


def _write_gpt(folder: Path, hidden_size: int, num_layers: int) -> None:
    from transformers import LlamaConfig, LlamaModel

    config: dict[str, Any] = {
        "architectures": ["LlamaModel"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": 2 * hidden_size,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "num_attention_heads": hidden_size // HEAD_DIM,
        "num_hidden_layers": num_layers,
        "num_key_value_heads": hidden_size // HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": False,
        # ChatTTS ignores the Llama token embedding (it deletes embed_tokens after loading);
        # a tiny vocabulary keeps that throw-away matrix small.
        "vocab_size": 8,
        # Extra keys the official config.json carries for ChatTTS.
        "num_audio_tokens": NUM_AUDIO_TOKENS,
        "num_text_tokens": None,
        "num_vq": NUM_VQ,
        "spk_KL": False,
        "spk_emb_dim": 192,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    llama_keys = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    model = LlamaModel(LlamaConfig(**llama_keys))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("embed_tokens.")}
    save_safetensors(state, folder / "model.safetensors")


def _write_embed(path: Path, hidden_size: int, num_text_tokens: int) -> None:
    from ChatTTS.model.embed import Embed

    embed = Embed(hidden_size, NUM_AUDIO_TOKENS, num_text_tokens, NUM_VQ)
    state = embed.state_dict()
    # Random heads would sample the EOS code every few steps; a zero-gain EOS row gives it logit
    # 0, far outside the top-K of the other random logits. Generations then run to the token
    # budget the engine sets, so test audio has a predictable, plausible length.
    eos = NUM_AUDIO_TOKENS - 1
    for index in range(NUM_VQ):
        state[f"head_code.{index}.parametrizations.weight.original0"][eos] = 0.0
    save_safetensors(state, path)


def _write_dvae(path: Path) -> None:
    from ChatTTS.config.config import VQ, Decoder
    from ChatTTS.model.dvae import DVAE

    dim = DVAE_VQ_DIM // 2  # the decoder reads the quantizer output folded in two
    encoder = Decoder(idim=dim, odim=DVAE_VQ_DIM, hidden=SMALL_CHANNELS, n_layer=1, bn_dim=8)
    decoder = Decoder(idim=dim, odim=dim, hidden=SMALL_CHANNELS, n_layer=1, bn_dim=8)
    dvae = DVAE(
        decoder_config=asdict(decoder),
        encoder_config=asdict(encoder),
        vq_config=asdict(VQ(dim=DVAE_VQ_DIM, levels=(5, 5, 5, 5), G=2, R=2)),
        dim=dim,
    )
    save_safetensors(dvae.state_dict(), path)


def _write_decoder(path: Path, hidden_size: int) -> None:
    from ChatTTS.config.config import Decoder
    from ChatTTS.model.dvae import DVAE

    idim = hidden_size // 2  # ChatTTS folds each GPT hidden state into two mel frames
    config = Decoder(idim=idim, odim=idim, hidden=SMALL_CHANNELS, n_layer=1, bn_dim=8)
    decoder = DVAE(decoder_config=asdict(config), dim=idim)
    save_safetensors(decoder.state_dict(), path)


def _write_vocos(path: Path) -> None:
    # vocos and pybase16384 ship no type information; importlib keeps mypy from asking for it.
    vocos = importlib.import_module("vocos")
    features = importlib.import_module("vocos.feature_extractors")
    heads = importlib.import_module("vocos.heads")
    models = importlib.import_module("vocos.models")

    vocoder = vocos.Vocos(
        feature_extractor=features.MelSpectrogramFeatures(
            sample_rate=24000, n_fft=N_FFT, hop_length=HOP_LENGTH, n_mels=N_MELS, padding="center"
        ),
        backbone=models.VocosBackbone(
            input_channels=N_MELS, dim=SMALL_CHANNELS, intermediate_dim=32, num_layers=1
        ),
        head=heads.ISTFTHead(
            dim=SMALL_CHANNELS, n_fft=N_FFT, hop_length=HOP_LENGTH, padding="center"
        ),
    )
    save_safetensors(vocoder.state_dict(), path)


def _write_tokenizer(folder: Path) -> int:
    """A BERT WordPiece tokenizer with ChatTTS's special tokens appended; returns its size."""
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    # dict.fromkeys drops repeated characters and keeps the order (the ids stay stable).
    pieces = list(dict.fromkeys([*BERT_SPECIAL_TOKENS, *(_PUNCTUATION + letters + _CJK)]))
    pieces.extend(f"##{c}" for c in letters)
    return write_bert_tokenizer(folder, pieces)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/support/chattts_tiny.py DEST")
    print(make_tiny_checkpoint(Path(sys.argv[1])))
