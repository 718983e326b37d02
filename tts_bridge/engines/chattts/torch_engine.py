"""ChatTTS (torch) engine: the quality tier, zh and en at 24 kHz.

Weights are read from a local folder in ChatTTS's asset layout and verified before ChatTTS sees
them: the official release against ChatTTS's own ``ChatTTS/res/sha256_map.json``, any other
checkpoint against the expected hashes the caller passes (the project's model manifest). ChatTTS's
``Config`` (GPT, decoder and vocoder sizes, speaker statistics) is derived from the checkpoint's
own files, so a fine-tune, the official weights and the tests' tiny random checkpoint all load
through the same code.

Nothing here imports torch at module level: importing this module stays cheap, and the helpers
that only look at file headers (``read_checkpoint``, ``safetensors_shapes``, ``official_sha256``)
work without torch, so the model registry and ``tts-bridge doctor`` can check a checkpoint on an
install without the ``chattts`` extra.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import logging
import re
import struct
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tts_bridge.engines.base import (
    EngineError,
    FloatAudio,
    SynthesisOptions,
    Tier,
    check_interrupt,
    interrupt_requested,
)
from tts_bridge.engines.chattts.common import (
    SAMPLE_RATE,
    ChatTTSEngineBase,
    ChatTTSOptions,
    expected_seconds,
    max_new_tokens,
    read_json,
    read_spk_stat_file,
)
from tts_bridge.engines.chattts.speaker import (
    DEFAULT_SPEAKER_SEED,
    SpeakerStats,
    sample_spk_emb,
    validate_spk_emb,
)
from tts_bridge.engines.manifests import sha256_file
from tts_bridge.textlog import short, size

__all__ = [
    "CHECKPOINT_FILES",
    "HOP_LENGTH",
    "NUM_AUDIO_TOKENS",
    "NUM_VQ",
    "N_MELS",
    "SPK_STAT_FILE",
    "ChatTTSEngine",
    "CheckpointDims",
    "ConvStackDims",
    "chattts_config",
    "official_sha256",
    "read_checkpoint",
    "safetensors_shapes",
]

_LOGGER = logging.getLogger(__name__)

# ChatTTS 0.2.5 hard-wires these: the EOS code is num_audio_tokens - 1 = 625 = 5**4, the size of
# the DVAE quantizer's codebook, and its DVAE and decoder always produce 100 mel channels.
NUM_VQ = 4
NUM_AUDIO_TOKENS = 626
N_MELS = 100
HOP_LENGTH = 256

# The files ChatTTS.load(source="custom") checks, relative to the checkpoint folder.
CHECKPOINT_FILES: tuple[str, ...] = (
    "asset/Decoder.safetensors",
    "asset/DVAE.safetensors",
    "asset/Embed.safetensors",
    "asset/Vocos.safetensors",
    "asset/gpt/config.json",
    "asset/gpt/model.safetensors",
    "asset/tokenizer/special_tokens_map.json",
    "asset/tokenizer/tokenizer_config.json",
    "asset/tokenizer/tokenizer.json",
)
SPK_STAT_FILE = "asset/spk_stat.json"
"""Speaker statistics of a non-official checkpoint (the official ones are built into ChatTTS)."""

_MAX_SAFETENSORS_HEADER = 64 << 20


# -- checkpoint inspection (no torch) ---------------------------------------------------------


@dataclass(frozen=True)
class ConvStackDims:
    """Sizes of one ChatTTS DVAEDecoder stack (also used as the DVAE encoder)."""

    idim: int
    odim: int
    hidden: int
    n_layer: int
    bn_dim: int


@dataclass(frozen=True)
class CheckpointDims:
    """Everything ChatTTS's Config needs, read from a checkpoint's config.json and tensor shapes."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_hidden_layers: int
    max_position_embeddings: int
    spk_emb_dim: int
    num_text_tokens: int
    num_audio_tokens: int
    num_vq: int
    decoder: ConvStackDims
    dvae_encoder: ConvStackDims
    dvae_decoder: ConvStackDims
    dvae_vq_dim: int
    dvae_vq_groups: int
    dvae_vq_levels: int
    vocos_dim: int
    vocos_intermediate_dim: int
    vocos_layers: int
    vocos_head_n_fft: int
    vocos_mel_n_fft: int
    n_mels: int


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from a safetensors header (reads only the header, no torch)."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise EngineError(f"{path} is not a safetensors file (too short)")
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_SAFETENSORS_HEADER:
                raise EngineError(f"{path} is not a safetensors file (header {length} bytes)")
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as exc:
        raise EngineError(f"{path}: unreadable safetensors header: {exc}") from exc
    return {
        name: tuple(int(n) for n in entry["shape"])
        for name, entry in header.items()
        if name != "__metadata__"
    }


def read_checkpoint(folder: Path) -> CheckpointDims:
    """Derive ChatTTS's model sizes from a checkpoint folder; EngineError names what is wrong."""
    asset = folder / "asset"
    gpt = read_json(asset / "gpt" / "config.json")
    embed = safetensors_shapes(asset / "Embed.safetensors")
    decoder = safetensors_shapes(asset / "Decoder.safetensors")
    dvae = safetensors_shapes(asset / "DVAE.safetensors")
    vocos = safetensors_shapes(asset / "Vocos.safetensors")

    try:
        hidden = int(gpt["hidden_size"])
        dims_gpt = {
            "intermediate_size": int(gpt["intermediate_size"]),
            "num_attention_heads": int(gpt["num_attention_heads"]),
            "num_hidden_layers": int(gpt["num_hidden_layers"]),
            "max_position_embeddings": int(gpt.get("max_position_embeddings", 4096)),
            "spk_emb_dim": int(gpt.get("spk_emb_dim") or 192),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"{asset / 'gpt' / 'config.json'}: missing or bad field {exc}") from exc

    where = asset / "Embed.safetensors"
    text_shape = _shape(embed, "emb_text.weight", where)
    codebooks = sorted(k for k in embed if re.fullmatch(r"emb_code\.\d+\.weight", k))
    if not codebooks:
        raise EngineError(f"{where}: no emb_code.N.weight tensors")
    code_shape = _shape(embed, codebooks[0], where)
    if text_shape[1] != hidden or code_shape[1] != hidden:
        raise EngineError(
            f"{where}: embedding width {text_shape[1]} does not match GPT hidden size {hidden}"
        )
    if len(codebooks) != NUM_VQ or code_shape[0] != NUM_AUDIO_TOKENS:
        raise EngineError(
            f"{where}: {len(codebooks)} codebooks of {code_shape[0]} codes; ChatTTS needs "
            f"{NUM_VQ} codebooks of {NUM_AUDIO_TOKENS} (its DVAE and EOS code are fixed)"
        )

    decoder_dims = _conv_stack(decoder, "decoder.", asset / "Decoder.safetensors")
    if hidden % 2 or decoder_dims.idim != hidden // 2:
        raise EngineError(
            f"{asset / 'Decoder.safetensors'}: decoder input {decoder_dims.idim} must be half "
            f"the GPT hidden size {hidden} (each hidden state becomes two mel frames)"
        )
    dvae_path = asset / "DVAE.safetensors"
    projections = sorted(
        k for k in dvae if re.fullmatch(r"vq_layer\.quantizer\.rvqs\.\d+\.project_in\.weight", k)
    )
    if not projections:
        raise EngineError(f"{dvae_path}: no vq_layer.quantizer.rvqs.N.project_in.weight tensors")
    levels, per_group = _shape(dvae, projections[0], dvae_path)

    vocos_path = asset / "Vocos.safetensors"
    embed_shape = _shape(vocos, "backbone.embed.weight", vocos_path)
    fb_shape = _shape(vocos, "feature_extractor.mel_spec.mel_scale.fb", vocos_path)
    for path, shapes, key in (
        (asset / "Decoder.safetensors", decoder, "out_conv.weight"),
        (dvae_path, dvae, "out_conv.weight"),
    ):
        if _shape(shapes, key, path)[0] != N_MELS:
            raise EngineError(f"{path}: {key} must produce {N_MELS} mel channels")
    if embed_shape[1] != N_MELS or fb_shape[1] != N_MELS:
        raise EngineError(f"{vocos_path}: the vocoder must take {N_MELS} mel channels")

    return CheckpointDims(
        hidden_size=hidden,
        **dims_gpt,
        num_text_tokens=text_shape[0],
        num_audio_tokens=code_shape[0],
        num_vq=len(codebooks),
        decoder=decoder_dims,
        dvae_encoder=_conv_stack(dvae, "encoder.", dvae_path),
        dvae_decoder=_conv_stack(dvae, "decoder.", dvae_path),
        dvae_vq_dim=per_group * len(projections),
        dvae_vq_groups=len(projections),
        dvae_vq_levels=levels,
        vocos_dim=embed_shape[0],
        vocos_intermediate_dim=_shape(vocos, "backbone.convnext.0.pwconv1.weight", vocos_path)[0],
        vocos_layers=_count_blocks(vocos, "backbone.convnext."),
        vocos_head_n_fft=_shape(vocos, "head.out.weight", vocos_path)[0] - 2,
        vocos_mel_n_fft=_shape(vocos, "feature_extractor.mel_spec.spectrogram.window", vocos_path)[
            0
        ],
        n_mels=N_MELS,
    )


def _conv_stack(shapes: Mapping[str, tuple[int, ...]], prefix: str, path: Path) -> ConvStackDims:
    conv_in = _shape(shapes, f"{prefix}conv_in.0.weight", path)
    return ConvStackDims(
        idim=conv_in[1],
        odim=_shape(shapes, f"{prefix}conv_out.weight", path)[0],
        hidden=_shape(shapes, f"{prefix}conv_in.2.weight", path)[0],
        n_layer=_count_blocks(shapes, f"{prefix}decoder_block."),
        bn_dim=conv_in[0],
    )


def _count_blocks(shapes: Mapping[str, tuple[int, ...]], prefix: str) -> int:
    indices = {k[len(prefix) :].split(".", 1)[0] for k in shapes if k.startswith(prefix)}
    return len(indices)


def _shape(shapes: Mapping[str, tuple[int, ...]], key: str, path: Path) -> tuple[int, ...]:
    try:
        return shapes[key]
    except KeyError:
        raise EngineError(f"{path}: tensor {key} is missing; not a ChatTTS checkpoint?") from None


def official_sha256() -> dict[str, str]:
    """ChatTTS's own hashes of its official files, keyed by path relative to the checkpoint.

    Read from the installed package's data file without importing ChatTTS (which imports torch).
    """
    spec = importlib.util.find_spec("ChatTTS")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("the ChatTTS package is not installed (install the 'chattts' extra)")
    package = Path(next(iter(spec.submodule_search_locations)))
    raw = read_json(package / "res" / "sha256_map.json")
    return {rel: str(raw[_sha256_map_key(rel)]) for rel in CHECKPOINT_FILES}


def _matches_official(expected: Mapping[str, str]) -> bool:
    try:
        official = official_sha256()
    except EngineError:
        return False  # without ChatTTS installed nothing loads, but identity still works
    return all(expected.get(rel, "").lower() == official[rel] for rel in CHECKPOINT_FILES)


def _import_chattts() -> Any:
    """Import ChatTTS (and with it torch and transformers) with model hubs switched off."""
    import os

    # Belt and braces: nothing may fetch weights at run time. transformers and huggingface_hub
    # read this once, when they are first imported.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ChatTTS

    return ChatTTS


def _sha256_map_key(rel: str) -> str:
    """ChatTTS's key for a file: 'asset/gpt/config.json' -> 'sha256_asset_gpt_config_json'."""
    return "sha256_" + rel.replace("/", "_").replace(".", "_")


# -- the engine ---------------------------------------------------------------------------------


@dataclass
class _Loaded:
    """What exists only while the model is loaded."""

    chat: Any
    dims: CheckpointDims
    stats: SpeakerStats
    default_speaker: str


class ChatTTSEngine(ChatTTSEngineBase[_Loaded]):
    """ChatTTS on torch for one local checkpoint folder. Cheap to construct; loads on first use.

    ``expected_sha256`` maps each file's path relative to ``checkpoint`` (``asset/gpt/config.json``
    ...) to its hex SHA-256; None means the official release, checked against ChatTTS's own
    hashes. A checkpoint other than the official one also needs ``asset/spk_stat.json``, covered
    by the mapping. ``hasher`` defaults to a streamed SHA-256; a caching hasher may be passed.
    """

    name = "chattts"
    tier: Tier = "quality"
    _label = "ChatTTS"
    _artifact = "checkpoint"
    _unhashed_hint = "; record the model in the manifest first (tts-bridge models add)"

    def __init__(
        self,
        checkpoint: Path,
        *,
        expected_sha256: Mapping[str, str] | None = None,
        threads: int = 1,
        device: str = "cpu",
        defaults: ChatTTSOptions | None = None,
        default_speaker: str | None = None,
        hasher: Callable[[Path], str] = sha256_file,
    ) -> None:
        super().__init__(
            checkpoint,
            expected_sha256=expected_sha256,
            threads=threads,
            defaults=defaults,
            default_speaker=default_speaker,
            hasher=hasher,
        )
        self._device = device
        self._hidden_size: int | None = None

    # -- metadata --------------------------------------------------------------------------

    @property
    def is_official(self) -> bool:
        """True when the expected hashes are those of ChatTTS's official release."""
        return _matches_official(self._expected_hashes())

    @property
    def hidden_size(self) -> int:
        """The GPT hidden size (the length of a speaker embedding), from config.json."""
        if self._hidden_size is None:
            config = read_json(self._folder / "asset" / "gpt" / "config.json")
            try:
                self._hidden_size = int(config["hidden_size"])
            except (KeyError, TypeError, ValueError) as exc:
                raise EngineError(f"{self._folder}: config.json has no hidden_size") from exc
        return self._hidden_size

    def speaker_stats(self) -> SpeakerStats:
        """The checkpoint's speaker statistics (verified), without loading the model."""
        loaded = self._loaded
        if loaded is not None:
            return loaded.stats
        return self._read_stats(self.hidden_size, self.is_official, verify=True)

    # -- load / unload ---------------------------------------------------------------------

    def _load_locked(self) -> _Loaded:
        import time

        started = time.monotonic()
        expected = self._expected_hashes()
        official = self.is_official
        self.verify(expected)
        dims = read_checkpoint(self._folder)
        stats = self._read_stats(dims.hidden_size, official, verify=False)

        chattts = _import_chattts()
        import torch

        torch.set_num_threads(self._threads)
        chat = chattts.Chat(logging.getLogger(f"{__name__}.chattts"))
        chat.config = chattts_config(dims, stats.encode())
        # source="custom" re-checks the files against this map and never downloads or renames
        # (source="local" would move a mismatching file to .bak and fetch a replacement). The
        # map holds the hashes verified above, in ChatTTS's key format.
        chat.sha256_map = {_sha256_map_key(rel): expected[rel].lower() for rel in CHECKPOINT_FILES}
        try:
            ok = chat.load(
                source="custom",
                custom_path=str(self._folder),
                device=torch.device(self._device),
                compile=False,
            )
        except (RuntimeError, ValueError, KeyError, TypeError, OSError, AssertionError) as exc:
            raise EngineError(f"ChatTTS could not load {self._folder}: {exc}") from exc
        if not ok:
            raise EngineError(f"ChatTTS refused to load {self._folder}; see its log above")
        # ChatTTS's GPT loop polls chat.context between steps (Chat.interrupt sets it): ours
        # asks the calling thread's interrupt check, so background work gives way to live work.
        chat.context = _InterruptFlag()
        # Compile the text normalizer's numba kernels now, not inside the first request.
        chat.normalizer("warm up 预热", True, True, None)
        default_speaker = self._default_speaker or sample_spk_emb(stats, DEFAULT_SPEAKER_SEED)
        validate_spk_emb(default_speaker, dims.hidden_size)
        _LOGGER.info(
            "Loaded ChatTTS %s (%s, hidden %d x %d layers, %d threads) in %.1f s",
            self._folder,
            "official weights" if official else "custom checkpoint",
            dims.hidden_size,
            dims.num_hidden_layers,
            self._threads,
            time.monotonic() - started,
        )
        return _Loaded(chat, dims, stats, default_speaker)

    def unload(self) -> None:
        with self._lock:
            if self._loaded is None:
                return
            self._loaded = None
        # The model sits in reference cycles (modules, bound methods); collect them now and
        # hand the freed heap back to the OS, or RSS would stay at its loaded size.
        gc.collect()
        _release_freed_heap()
        _LOGGER.info("Unloaded ChatTTS %s", self._folder)

    # -- synthesis -------------------------------------------------------------------------

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        """Speak ``text``: one float32 chunk per generation of at most ~25 s expected audio.

        ``speaker`` is a ChatTTS spk_emb string (None: the checkpoint's default speaker).
        ``options`` may be ChatTTSOptions; plain SynthesisOptions take the engine's defaults
        for everything but speed. The same speaker and seed are used for every chunk.
        """
        chosen = self._options(options)
        if speaker is not None:
            self.validate_speaker(speaker)
        for chunk in self.generations(text, chosen):
            audio = self._generate(chunk, speaker, chosen)
            if audio.size:
                yield audio

    def _generate(self, text: str, speaker: str | None, options: ChatTTSOptions) -> FloatAudio:
        budget = max_new_tokens(expected_seconds(text, options.speed_level))
        with self._lock:
            loaded = self._loaded_locked()
            # Fresh parameter objects every call: infer() writes into the ones it is given
            # (a shared default would keep the first call's txt_smp/spk_smp forever).
            code_params = loaded.chat.InferCodeParams(
                prompt=f"[speed_{options.speed_level}]",
                spk_emb=speaker or loaded.default_speaker,
                temperature=options.temperature,
                top_P=options.top_P,
                top_K=options.top_K,
                max_new_token=budget,
                # With a manual seed ChatTTS does not retry an EOS at step 0, and an empty
                # result makes infer() fail; one token minimum rules that out.
                min_new_token=1,
                show_tqdm=False,
                manual_seed=options.seed,
            )
            refine_params = loaded.chat.RefineTextParams(
                prompt=options.refine_prompt,
                # The refiner re-emits the text with a few tags added; ChatTTS's fixed 384
                # tokens would let a confused refiner ramble far past a short sentence.
                max_new_token=min(384, 2 * len(text) + 32),
                min_new_token=1,
                show_tqdm=False,
                manual_seed=options.seed,
            )
            _LOGGER.debug("ChatTTS: %s (max %d tokens, seed %d)", short(text), budget, options.seed)
            try:
                wavs = loaded.chat.infer(
                    [text],
                    split_text=False,
                    skip_refine_text=not options.refine_text,
                    params_refine_text=refine_params,
                    params_infer_code=code_params,
                )
            except (RuntimeError, ValueError, IndexError, AssertionError) as exc:
                raise EngineError(f"ChatTTS failed on {size(text)}: {exc}") from exc
        # An interrupted generation returns what it had so far: never cache that.
        check_interrupt()
        audio = np.asarray(wavs[0], dtype=np.float32).reshape(-1)
        return np.clip(audio, -1.0, 1.0)

    # -- helpers ---------------------------------------------------------------------------

    def _expected_hashes(self) -> dict[str, str]:
        if self._expected is not None:
            return self._expected
        return official_sha256()

    def _required_files(self, expected: Mapping[str, str]) -> tuple[str, ...]:
        if _matches_official(expected):
            return CHECKPOINT_FILES
        return (*CHECKPOINT_FILES, SPK_STAT_FILE)

    def _read_stats(self, hidden_size: int, official: bool, *, verify: bool) -> SpeakerStats:
        if official:
            config = _import_chattts().config.Config()
            return SpeakerStats.decode(config.spk_stat, hidden_size, "ChatTTS's built-in spk_stat")
        path = self._folder / SPK_STAT_FILE
        if not path.is_file():
            raise EngineError(
                f"{path}: missing; a checkpoint other than the official ChatTTS release needs "
                "its speaker statistics there"
            )
        if verify:
            self._verify_file(SPK_STAT_FILE, self._expected_hashes())
        return read_spk_stat_file(path, hidden_size)


def chattts_config(dims: CheckpointDims, spk_stat: str) -> Any:
    """ChatTTS's Config for these sizes, built from fresh objects.

    ChatTTS's config dataclasses share their default sub-objects between instances, so editing
    ``Config().gpt`` in place would change the defaults of every later Chat in the process.
    """
    cc = _import_chattts().config.config

    def stack(d: ConvStackDims) -> Any:
        return cc.Decoder(
            idim=d.idim, odim=d.odim, hidden=d.hidden, n_layer=d.n_layer, bn_dim=d.bn_dim
        )

    return cc.Config(
        path=cc.Path(),
        decoder=stack(dims.decoder),
        dvae=cc.DVAE(
            encoder=stack(dims.dvae_encoder),
            decoder=stack(dims.dvae_decoder),
            # Only the number of FSQ levels shows in the weights; ChatTTS uses 5 per level.
            vq=cc.VQ(
                dim=dims.dvae_vq_dim, levels=(5,) * dims.dvae_vq_levels, G=dims.dvae_vq_groups
            ),
        ),
        gpt=cc.GPT(
            hidden_size=dims.hidden_size,
            intermediate_size=dims.intermediate_size,
            num_attention_heads=dims.num_attention_heads,
            num_hidden_layers=dims.num_hidden_layers,
            use_cache=False,
            max_position_embeddings=dims.max_position_embeddings,
            spk_emb_dim=dims.spk_emb_dim,
            num_audio_tokens=dims.num_audio_tokens,
            num_text_tokens=dims.num_text_tokens,
            num_vq=dims.num_vq,
        ),
        embed=cc.Embed(
            hidden_size=dims.hidden_size,
            num_audio_tokens=dims.num_audio_tokens,
            num_text_tokens=dims.num_text_tokens,
            num_vq=dims.num_vq,
        ),
        vocos=cc.Vocos(
            feature_extractor=cc.FeatureExtractor(
                init_args=cc.FeatureExtractorInitArgs(
                    sample_rate=SAMPLE_RATE,
                    n_fft=dims.vocos_mel_n_fft,
                    hop_length=HOP_LENGTH,
                    n_mels=dims.n_mels,
                )
            ),
            backbone=cc.Backbone(
                init_args=cc.BackboneInitArgs(
                    input_channels=dims.n_mels,
                    dim=dims.vocos_dim,
                    intermediate_dim=dims.vocos_intermediate_dim,
                    num_layers=dims.vocos_layers,
                )
            ),
            head=cc.FourierHead(
                init_args=cc.FourierHeadInitArgs(
                    dim=dims.vocos_dim, n_fft=dims.vocos_head_n_fft, hop_length=HOP_LENGTH
                )
            ),
        ),
        spk_stat=spk_stat,
    )


def _release_freed_heap() -> None:
    """Ask glibc to return freed heap pages to the OS (no-op elsewhere).

    Loading copies every tensor through temporary buffers; glibc keeps such freed memory in its
    arenas, where it still counts as the process's RSS.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        _LOGGER.debug("malloc_trim unavailable; freed memory stays with the allocator")


class _InterruptFlag:
    """Stands in for ChatTTS's ``GPT.Context``: ``get`` is true when the synthesizing thread
    should give way (``tts_bridge.engines.base.interruptible``); ChatTTS's own ``set`` calls
    (it clears the flag at the start of every ``infer``) change nothing."""

    def set(self, value: bool) -> None:
        pass

    def get(self) -> bool:
        return interrupt_requested()
