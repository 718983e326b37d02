"""A ChatTTS checkpoint with random weights, in ChatTTS's own asset layout.

The real weights come from a model hub this project never contacts. The bench measures speed and
memory on a checkpoint of the official shapes (``OFFICIAL``: random weights cost what real ones
cost), and the tests drive the real ``chattts`` code on a tiny one (``TINY``) that loads in
moments. Both are written here, by one writer sized by a parameter. Every file lands where ChatTTS
expects its official file, built from ChatTTS's own module classes, so key names and shapes cannot
drift from what ``Chat.load`` accepts::

    <dest>/asset/gpt/config.json              LlamaConfig JSON with ChatTTS's extra keys
    <dest>/asset/gpt/model.safetensors        LlamaModel weights
    <dest>/asset/Embed.safetensors            text/code embeddings and heads (num_vq = 4, 626 codes)
    <dest>/asset/DVAE.safetensors             encoder + GFSQ quantizer + decoder
    <dest>/asset/Decoder.safetensors          the hidden-state decoder (idim = GPT hidden / 2)
    <dest>/asset/Vocos.safetensors            vocoder (100 mel channels, n_fft 1024, hop 256)
    <dest>/asset/tokenizer/{tokenizer.json, tokenizer_config.json, special_tokens_map.json}
    <dest>/asset/spk_stat.json                speaker statistics (written last)

``asset/spk_stat.json`` is this project's format for the speaker statistics of a checkpoint that
is not the official release (the official statistics are built into ChatTTS's ``Config``)::

    {"format": "chattts-spk-stat", "version": 1, "hidden_size": H, "spk_stat": "<base16384>"}

where ``spk_stat`` is the same encoding ChatTTS's ``Config.spk_stat`` uses: base16384 of the
float16 array ``[std (H values), mean (H values)]``.

The same size and seed write byte-identical files, so their hashes are stable. torch, ChatTTS,
transformers and vocos are imported only while writing.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tts_bridge.engines.chattts.speaker import SPK_STAT_FORMAT
from tts_bridge.engines.chattts.torch_engine import (
    NUM_AUDIO_TOKENS,
    NUM_VQ,
    SPK_STAT_FILE,
    read_checkpoint,
)

if TYPE_CHECKING:
    from ChatTTS.config.config import Config

__all__ = [
    "OFFICIAL",
    "TINY",
    "CheckpointSize",
    "official_sections",
    "write_random_checkpoint",
]

NUM_TEXT_TOKENS = 21178
"""bert-base-chinese's 21128 tokens plus ChatTTS's 50 control tokens (Embed and head_text)."""
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# ChatTTS's 50 tokens in upstream order; [break_0] must rank above every ordinary token.
CHATTTS_SPECIAL_TOKENS: tuple[str, ...] = (
    "[Sasr]", "[Pasr]", "[Easr]", "[Stts]", "[Ptts]", "[Etts]",
    "[Sbreak]", "[Pbreak]", "[Ebreak]", "[uv_break]", "[v_break]",
    "[lbreak]", "[llbreak]", "[undefine]", "[laugh]", "[spk_emb]", "[empty_spk]",
    "[music]", "[pure]",
    *(f"[break_{i}]" for i in range(8)),
    *(f"[laugh_{i}]" for i in range(3)),
    *(f"[oral_{i}]" for i in range(10)),
    *(f"[speed_{i}]" for i in range(10)),
)  # fmt: skip

_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
_PUNCTUATION = "，。、！？：；“”‘’（）,.!?:;'\"()-%°/"
# Common characters of home announcements: the small vocabulary. Anything else becomes [UNK],
# which is fine for random weights.
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
# The small codec's widths: big enough to exercise every layer type, small enough to load fast.
_SMALL_CHANNELS = 16
_SMALL_VQ_DIM = 32
_SMALL_BN_DIM = 8


@dataclass(frozen=True)
class CheckpointSize:
    """How big a random checkpoint is; ``dataclasses.replace`` changes the GPT's size."""

    hidden_size: int
    """GPT width; the embeddings and the hidden-state decoder follow it. Must be even."""
    num_layers: int
    head_dim: int
    """Width of one attention head (heads = hidden_size / head_dim, at least one)."""
    mlp_ratio: int
    """The GPT's MLP width as a multiple of hidden_size."""
    llama_vocab_size: int
    """Rows of LlamaModel's own token embedding, which ChatTTS deletes after loading."""
    keep_llama_embedding: bool
    """Save that matrix as LlamaModel.save_pretrained does (loading reads and drops it, as it
    does with the released file), or leave it out."""
    small_codec: bool
    """DVAE, decoder and Vocos at small widths; otherwise at ChatTTS's own (official) sizes."""
    small_vocabulary: bool
    """A text vocabulary of the characters announcements use; otherwise the official 21178."""
    quiet_eos: bool
    """Zero the gain of the EOS code: random heads would sample it every few steps, and with
    logit 0 it stays outside the top-K of the other random logits, so generations run to the
    token budget the engine sets and test audio has a predictable, plausible length."""


OFFICIAL = CheckpointSize(
    hidden_size=768,
    num_layers=20,
    head_dim=64,
    mlp_ratio=4,
    llama_vocab_size=32000,
    keep_llama_embedding=True,
    small_codec=False,
    small_vocabulary=False,
    quiet_eos=False,
)
"""Every tensor of the official release's shape (12 heads, MLP 3072)."""
TINY = CheckpointSize(
    hidden_size=32,
    num_layers=2,
    head_dim=16,
    mlp_ratio=2,
    llama_vocab_size=8,
    keep_llama_embedding=False,
    small_codec=True,
    small_vocabulary=True,
    quiet_eos=True,
)
"""Every layer type at a size that loads and runs in moments (the tests' checkpoint)."""


def write_random_checkpoint(dest: Path, size: CheckpointSize = OFFICIAL, seed: int = 0) -> Path:
    """Write a checkpoint of ``size`` with random weights (from ``seed``) under ``dest``;
    returns ``dest``. The speaker statistics come last: their presence means a whole checkpoint.
    """
    import torch

    hidden_size = size.hidden_size
    if hidden_size % 2 or hidden_size < 2:
        raise ValueError("hidden_size must be even (each hidden state becomes two mel frames)")
    heads = max(1, hidden_size // size.head_dim)
    if hidden_size % heads:
        raise ValueError(f"hidden_size must be a multiple of {size.head_dim}")
    asset = dest / "asset"
    (asset / "gpt").mkdir(parents=True, exist_ok=True)
    (asset / "tokenizer").mkdir(parents=True, exist_ok=True)
    vocab_size = _write_tokenizer(asset / "tokenizer", size)
    # A private RNG stream: the caller's global torch RNG state is left alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _write_gpt(asset / "gpt", size, heads)
        _write_codec(asset, size, vocab_size)
    _write_spk_stat(dest / SPK_STAT_FILE, hidden_size, seed)
    return dest


def official_sections(checkpoint: Path) -> list[str]:
    """The sections of ChatTTS's Config that this checkpoint's files reproduce exactly."""
    from ChatTTS.config.config import Config

    from tts_bridge.engines.chattts.torch_engine import chattts_config

    official = Config()
    derived = chattts_config(read_checkpoint(checkpoint), official.spk_stat)
    return [
        section
        for section in ("gpt", "embed", "decoder", "dvae", "vocos")
        if asdict(getattr(derived, section)) == asdict(getattr(official, section))
    ]


def _save_safetensors(state: dict[str, Any], path: Path) -> None:
    """A module's state dict as a safetensors file (contiguous copies, as torch saves them)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(path))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_gpt(folder: Path, size: CheckpointSize, heads: int) -> None:
    from transformers import LlamaConfig, LlamaModel

    hidden_size = size.hidden_size
    config: dict[str, Any] = {
        "architectures": ["LlamaModel"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": size.mlp_ratio * hidden_size,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "num_attention_heads": heads,
        "num_hidden_layers": size.num_layers,
        "num_key_value_heads": heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": False,
        "vocab_size": size.llama_vocab_size,
        # The keys ChatTTS adds to its config.json.
        "num_audio_tokens": NUM_AUDIO_TOKENS,
        "num_text_tokens": None,
        "num_vq": NUM_VQ,
        "spk_KL": False,
        "spk_emb_dim": 192,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    llama = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    state = LlamaModel(LlamaConfig(**llama)).state_dict()
    if not size.keep_llama_embedding:
        state = {k: v for k, v in state.items() if not k.startswith("embed_tokens.")}
    _save_safetensors(state, folder / "model.safetensors")


def _codec_config(size: CheckpointSize) -> Config:
    """ChatTTS's Config with the DVAE and Vocos sizes of ``size`` (the decoder's depth and
    width too; its input width follows the GPT and is set where it is written)."""
    from ChatTTS.config.config import DVAE, VQ, Config, Decoder

    official = Config()
    if not size.small_codec:
        return official
    dim = _SMALL_VQ_DIM // 2  # the DVAE decoder reads the quantizer output folded in two
    vocos = official.vocos
    small = dict(hidden=_SMALL_CHANNELS, n_layer=1, bn_dim=_SMALL_BN_DIM)
    return dataclasses.replace(
        official,
        decoder=Decoder(**small),
        dvae=DVAE(
            encoder=Decoder(idim=dim, odim=_SMALL_VQ_DIM, **small),
            decoder=Decoder(idim=dim, odim=dim, **small),
            vq=VQ(dim=_SMALL_VQ_DIM, levels=(5, 5, 5, 5), G=2, R=2),
        ),
        vocos=dataclasses.replace(
            vocos,
            backbone=dataclasses.replace(
                vocos.backbone,
                init_args=dataclasses.replace(
                    vocos.backbone.init_args,
                    dim=_SMALL_CHANNELS,
                    intermediate_dim=2 * _SMALL_CHANNELS,
                    num_layers=1,
                ),
            ),
            head=dataclasses.replace(
                vocos.head,
                init_args=dataclasses.replace(vocos.head.init_args, dim=_SMALL_CHANNELS),
            ),
        ),
    )


def _write_codec(asset: Path, size: CheckpointSize, num_text_tokens: int) -> None:
    """Embed, DVAE, Decoder and Vocos from ChatTTS's own classes."""
    from ChatTTS.config.config import Decoder
    from ChatTTS.model.dvae import DVAE
    from ChatTTS.model.embed import Embed

    # vocos ships no type information; importlib keeps mypy from asking for stubs.
    vocos = importlib.import_module("vocos")
    instantiate = importlib.import_module("vocos.pretrained").instantiate_class
    codec = _codec_config(size)
    hidden_size = size.hidden_size

    state = Embed(hidden_size, NUM_AUDIO_TOKENS, num_text_tokens, NUM_VQ).state_dict()
    if size.quiet_eos:
        eos = NUM_AUDIO_TOKENS - 1
        for index in range(NUM_VQ):
            state[f"head_code.{index}.parametrizations.weight.original0"][eos] = 0.0
    _save_safetensors(state, asset / "Embed.safetensors")
    dvae = DVAE(
        decoder_config=asdict(codec.dvae.decoder),
        encoder_config=asdict(codec.dvae.encoder),
        vq_config=asdict(codec.dvae.vq),
        dim=codec.dvae.decoder.idim,
    )
    _save_safetensors(dvae.state_dict(), asset / "DVAE.safetensors")
    # The decoder reads each GPT hidden state folded into two mel frames: idim = hidden / 2
    # (384 for the official model).
    decoder = Decoder(
        idim=hidden_size // 2,
        odim=hidden_size // 2,
        hidden=codec.decoder.hidden,
        n_layer=codec.decoder.n_layer,
        bn_dim=codec.decoder.bn_dim,
    )
    _save_safetensors(
        DVAE(decoder_config=asdict(decoder), dim=decoder.idim).state_dict(),
        asset / "Decoder.safetensors",
    )
    vocoder = vocos.Vocos(
        feature_extractor=instantiate(args=(), init=asdict(codec.vocos.feature_extractor)),
        backbone=instantiate(args=(), init=asdict(codec.vocos.backbone)),
        head=instantiate(args=(), init=asdict(codec.vocos.head)),
    )
    _save_safetensors(vocoder.state_dict(), asset / "Vocos.safetensors")


def _write_tokenizer(folder: Path, size: CheckpointSize) -> int:
    """A BERT WordPiece tokenizer with ChatTTS's special tokens appended, saved as ChatTTS's
    tokenizer folder holds it; returns its length (21178 at the official size)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    extra = _CJK if size.small_vocabulary else ""
    # dict.fromkeys drops repeated characters and keeps the order (the ids stay stable).
    pieces = list(dict.fromkeys([*BERT_SPECIAL_TOKENS, *(_PUNCTUATION + _LETTERS + extra)]))
    pieces.extend(f"##{c}" for c in _LETTERS)
    if not size.small_vocabulary:
        # CJK characters fill the ordinary vocabulary, as in bert-base-chinese.
        ordinary = NUM_TEXT_TOKENS - len(CHATTTS_SPECIAL_TOKENS)
        cjk = (chr(c) for r in (range(0x4E00, 0xA000), range(0x3400, 0x4DC0)) for c in r)
        pieces.extend(next(cjk) for _ in range(ordinary - len(pieces)))

    vocab = {piece: index for index, piece in enumerate(pieces)}
    tokenizer = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens([*BERT_SPECIAL_TOKENS, *CHATTTS_SPECIAL_TOKENS])
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
    length: int = tokenizer.get_vocab_size(with_added_tokens=True)
    return length


def _write_spk_stat(path: Path, hidden_size: int, seed: int) -> None:
    """Random speaker statistics in the project's spk_stat.json format (seeded)."""
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
