"""Export a ChatTTS checkpoint to ONNX graphs that onnxruntime runs without torch.

What is written to ``dest`` (the layout ``onnx_format`` names and ``onnx_engine`` loads)::

    gpt.onnx              one GPT step: embeddings + KV cache in, code logits + hidden + cache out
                          (each graph's weights sit beside it in "<graph>.onnx.data")
    head_text.onnx        the text head (hidden -> text logits), for the refine pass
    decoder.onnx          ChatTTS's hidden-state decoder: GPT hidden states -> 100-band mel
    vocos.onnx            Vocos backbone and head up to magnitude and phase
    decoder_stream.onnx   the decoder as a streaming step: new hidden states + per-layer caches
    vocos_stream.onnx     Vocos likewise: new mel frames + per-layer caches (see below)
    emb_text.npy          text token embedding (num_text_tokens, hidden)
    emb_code.npy          the four audio code embeddings (4, 626, hidden)
    istft_window.npy      Vocos's ISTFT window, so numpy inverts exactly what torch would
    tokenizer/            ChatTTS's tokenizer files, copied
    spk_stat.json         speaker statistics (the project's format; see
    tests/support/chattts_tiny.py)
    homophones_map.json   ChatTTS's homophone table, used by its text clean-up
    config.json           the model sizes the engine needs
    manifest.json         sha256 of every file above

Design choices:

* **Embeddings in numpy, not in a graph.** An embedding lookup is a gather plus (for audio codes)
  a sum of four rows; numpy does it exactly and for free, the speaker vector is inserted with
  one ``where``, and ``np.load(mmap_mode="r")`` keeps the 65 MB text table on disk except the
  rows a prompt touches. The GPT graph therefore takes ``inputs_embeds``.
* **The GPT step is restated, not traced from transformers.** ``GptStep`` (in export_modules)
  is LlamaModel's forward (RMSNorm, rotary positions, causal attention, SwiGLU) written against
  the checkpoint's own tensors. Tracing transformers' own model exports its cache classes and
  mask builders, which change from release to release; the parity tests compare this graph with
  LlamaModel.
* **The KV cache in two parts, as plain per-layer tensors** (batch, heads, length, head_dim):
  ``past_key_i``/``past_value_i`` (settled, long) and ``recent_key_i``/``recent_value_i`` (the
  last few steps) in; ``present_key_i``/``present_value_i`` = recent + this step's keys/values
  out. The attention scores against both parts are concatenated (a few numbers per position),
  not the keys and values. With one cache tensor the in-graph concatenation copies the whole
  cache every step, a share of the step that grows with the batch and the length (near the
  30 s limit the copy rivals the weights); the two-part graph was faster at batch 1 and no
  slower at batch 4 (docs/benchmarks.md has the profile). The engine folds ``present`` into ``past``
  every few dozen steps. Batch, sequence, past and recent
  lengths are dynamic, so one graph does the prefill (both parts empty) and every decode step.
* **Heads at the last position only.** ChatTTS reads the logits and hidden state of the last
  position; computing four 626-way heads for every prompt token would be wasted work. The text
  head (one logit per text token, a noticeable share of a step) is a separate graph for the
  same reason: the audio loop never needs it.
* **Streaming step graphs with explicit caches.** The decoder and Vocos are stacks of
  non-causal, zero-padded convolutions. ``decoder_stream.onnx`` and ``vocos_stream.onnx``
  restate them (``DecoderStream``, ``VocosStream``, on the checkpoint's own modules) so frames
  can be pushed a few at a time and each push computes only its own frames: every convolution
  with padding p (= dilation x (kernel // 2)) takes a cache of its last 2p input frames
  (initially p zero frames, its left padding) as a graph input ``cache_i`` and returns the next
  one as ``next_cache_i``; it convolves cache + new frames without padding, so a layer's output
  trails its input by p frames. A ConvNeXt residual (output frame t adds input frame t) reads
  the same buffer p frames back. Per-frame operations (LayerNorm, MLP, GELU, head) see new frames
  only. Input ``flush``, shaped (1, 0) or (1, 1) (zeros), appends p zero frames (the right
  padding) to every layer when its width is 1: the end of the text, where the outputs then
  equal the one-shot graph's. The padding each cache stands for is in the graph's metadata
  (``pads``, comma-separated). A layer must get more than its p frames on the first push (the
  engine holds frames back until the whole stack's delay is covered, or the text ends).
* **ISTFT in numpy.** ``torch.istft`` does not export to a graph onnxruntime accepts; the graph
  stops at magnitude and phase and the engine inverts with ``numpy.fft.irfft`` + overlap-add.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tts_bridge.engines.base import EngineError
from tts_bridge.engines.chattts.common import SAMPLE_RATE
from tts_bridge.engines.chattts.export_modules import (
    EXAMPLE_FRAMES,
    DecoderStream,
    GptStep,
    VocosSpectrum,
    VocosStream,
)
from tts_bridge.engines.chattts.onnx_format import (
    CONFIG_FILE,
    DECODER_FILE,
    DECODER_STREAM_FILE,
    EMB_CODE_FILE,
    EMB_TEXT_FILE,
    FORMAT,
    FORMAT_VERSION,
    GPT_FILE,
    HEAD_TEXT_FILE,
    HOMOPHONES_FILE,
    SPK_STAT_NAME,
    STREAM_PADS_KEY,
    TOKENIZER_DIR,
    TOKENIZER_FILES,
    VOCOS_FILE,
    VOCOS_STREAM_FILE,
    WINDOW_FILE,
    external_data_path,
    write_manifest,
)
from tts_bridge.engines.chattts.speaker import SPK_STAT_FORMAT
from tts_bridge.engines.chattts.torch_engine import (
    CHECKPOINT_FILES,
    HOP_LENGTH,
    SPK_STAT_FILE,
    CheckpointDims,
    chattts_config,
    read_checkpoint,
)
from tts_bridge.engines.manifests import sha256_file

if TYPE_CHECKING:
    import torch

_LOGGER = logging.getLogger(__name__)

OPSET = 18
# Example sizes for tracing: each dynamic axis gets a value above 1, or the exporter would
# specialise the graph to it (0 and 1 are special-cased by torch.export).
_EXAMPLE_BATCH = 2
_EXAMPLE_SEQ = 3
_EXAMPLE_PAST = 5
_EXAMPLE_RECENT = 4


def export_chattts(
    src_checkpoint: Path,
    dest: Path,
    *,
    expected_sha256: Mapping[str, str] | None = None,
) -> list[Path]:
    """Export the checkpoint in ``src_checkpoint`` (ChatTTS's asset layout) into ``dest``.

    ``expected_sha256`` (relative path -> hex digest, as the model manifest records it) is
    checked before anything is read. Returns the files written, manifest last.
    Needs the 'chattts' extra plus ``onnx`` and ``onnxscript``; runs once per checkpoint.
    """
    if expected_sha256 is not None:
        source = _verify_source(src_checkpoint, expected_sha256)
    else:
        source = {rel: sha256_file(src_checkpoint / rel) for rel in _source_files(src_checkpoint)}
    dims = read_checkpoint(src_checkpoint)
    dest.mkdir(parents=True, exist_ok=True)
    asset = src_checkpoint / "asset"

    import torch

    # Export traces on one thread anyway; set it so the export is repeatable.
    torch.manual_seed(0)
    written: list[Path] = []
    with torch.no_grad():
        embed = _load_embed(asset / "Embed.safetensors", dims)
        head_code = torch.stack([embed.head_code[i].weight.detach() for i in range(dims.num_vq)])
        head_text = embed.head_text.weight.detach().clone()
        written.append(_save_npy(dest / EMB_TEXT_FILE, embed.emb_text.weight))
        written.append(
            _save_npy(
                dest / EMB_CODE_FILE,
                torch.stack([embed.emb_code[i].weight for i in range(dims.num_vq)]),
            )
        )
        del embed

        gpt_state = _load_safetensors(asset / "gpt" / "model.safetensors")
        gpt_config = json.loads((asset / "gpt" / "config.json").read_text(encoding="utf-8"))
        step = GptStep(gpt_state, gpt_config, head_code).eval()
        written.extend(_with_data(_export_gpt(step, dest / GPT_FILE)))
        del step, gpt_state
        written.extend(_with_data(_export_head_text(head_text, dest / HEAD_TEXT_FILE)))

        config = chattts_config(dims, "")
        decoder = _load_decoder(asset / "Decoder.safetensors", config)
        written.extend(_with_data(_export_decoder(decoder, dims, dest / DECODER_FILE)))
        written.extend(
            _with_data(_export_stream(DecoderStream(decoder), dest / DECODER_STREAM_FILE))
        )
        del decoder

        vocos = _load_vocos(asset / "Vocos.safetensors", config)
        written.append(_save_npy(dest / WINDOW_FILE, vocos.head.istft.window))
        written.extend(_with_data(_export_vocos(VocosSpectrum(vocos), dims, dest / VOCOS_FILE)))
        written.extend(_with_data(_export_stream(VocosStream(vocos), dest / VOCOS_STREAM_FILE)))
        del vocos

    written.extend(_copy_tokenizer(asset / "tokenizer", dest / TOKENIZER_DIR))
    written.append(_write_spk_stat(src_checkpoint, dims, dest / SPK_STAT_NAME))
    written.append(_copy_homophones(dest / HOMOPHONES_FILE))
    written.append(_write_config(dims, gpt_config, dest / CONFIG_FILE))
    manifest = write_manifest(
        dest,
        [p.relative_to(dest).as_posix() for p in written],
        variants={
            "fp32": {
                "gpt": GPT_FILE,
                "decoder": DECODER_FILE,
                "vocos": VOCOS_FILE,
                "decoder_stream": DECODER_STREAM_FILE,
                "vocos_stream": VOCOS_STREAM_FILE,
            }
        },
        extra={"source": {"folder": src_checkpoint.name, "sha256": source}},
    )
    _LOGGER.info("Exported ChatTTS %s to %s (%d files)", src_checkpoint, dest, len(written) + 1)
    return [*written, manifest]


# -- the GPT step -------------------------------------------------------------------------------


def gpt_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """Input and output names of the GPT graph (the engine binds by these names)."""
    cache = [
        f"{part}_{kind}_{i}"
        for i in range(num_layers)
        for part in ("past", "recent")
        for kind in ("key", "value")
    ]
    present = [f"present_{kind}_{i}" for i in range(num_layers) for kind in ("key", "value")]
    return (
        ["inputs_embeds", "attention_mask", "position_ids", *cache],
        ["logits_code", "hidden", *present],
    )


def _export_gpt(step: Any, path: Path) -> Path:
    import torch

    batch, seq, past = _EXAMPLE_BATCH, _EXAMPLE_SEQ, _EXAMPLE_PAST
    embeds = torch.randn(batch, seq, step.hidden).contiguous()
    mask = torch.ones(batch, past + _EXAMPLE_RECENT + seq, dtype=torch.int64)
    positions = torch.arange(past, past + seq, dtype=torch.int64).repeat(batch, 1).contiguous()
    cache = [
        torch.randn(batch, step.num_heads, length, step.head_dim).contiguous()
        for _ in range(step.num_layers)
        for length in (past, past, _EXAMPLE_RECENT, _EXAMPLE_RECENT)
    ]
    inputs, outputs = gpt_io_names(step.num_layers)
    axes: dict[str, dict[int, str]] = {
        "inputs_embeds": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"},
        "logits_code": {0: "batch"},
        "hidden": {0: "batch"},
    }
    for name in inputs[3:]:
        axes[name] = {0: "batch", 2: "past" if name.startswith("past") else "recent"}
    for name in outputs[2:]:
        axes[name] = {0: "batch", 2: "recent_plus_seq"}
    _onnx_export(
        step, (embeds, mask, positions, *cache), path, inputs=inputs, outputs=outputs, axes=axes
    )
    return path


def _export_head_text(weight: torch.Tensor, path: Path) -> Path:
    import torch

    class _HeadText(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(weight.float().clone(), requires_grad=False)

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = torch.matmul(hidden, self.weight.t())
            return logits

    example = torch.randn(_EXAMPLE_BATCH, weight.shape[1])
    axes = {"hidden": {0: "batch"}, "logits_text": {0: "batch"}}
    _onnx_export(
        _HeadText(), (example,), path, inputs=["hidden"], outputs=["logits_text"], axes=axes
    )
    return path


# -- decoder and vocos --------------------------------------------------------------------------


def _export_decoder(decoder: Any, dims: CheckpointDims, path: Path) -> Path:
    import torch

    class _Decoder(torch.nn.Module):
        """ChatTTS's DVAE.forward(mode="decode") without a quantizer, minus inference_mode."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = decoder

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            # (B, H, T) -> (B, H/2, 2T): each hidden state becomes two mel frames.
            b, c, t = hidden.shape
            feats = hidden.view(b, 2, c // 2, t).permute(0, 2, 3, 1).flatten(2)
            mel: torch.Tensor = self.inner.out_conv(self.inner.decoder(x=feats))
            coef: torch.Tensor = self.inner.coef
            return mel * coef

    example = torch.randn(_EXAMPLE_BATCH, dims.hidden_size, EXAMPLE_FRAMES).contiguous()
    axes = {"hidden": {0: "batch", 2: "steps"}, "mel": {0: "batch", 2: "frames"}}
    _onnx_export(_Decoder().eval(), (example,), path, inputs=["hidden"], outputs=["mel"], axes=axes)
    return path


def _export_vocos(spectrum: Any, dims: CheckpointDims, path: Path) -> Path:
    import torch

    example = torch.randn(_EXAMPLE_BATCH, dims.n_mels, EXAMPLE_FRAMES).contiguous()
    axes = {
        "mel": {0: "batch", 2: "frames"},
        "magnitude": {0: "batch", 2: "frames"},
        "phase": {0: "batch", 2: "frames"},
    }
    _onnx_export(
        spectrum, (example,), path, inputs=["mel"], outputs=["magnitude", "phase"], axes=axes
    )
    return path


def _export_stream(module: Any, path: Path) -> Path:
    import torch

    (data_in,), data_out = module.data_names
    caches = [torch.randn(1, c, 2 * p) for c, p in zip(module.channels, module.pads, strict=True)]
    flush = torch.zeros(1, 1)
    names = [f"cache_{i}" for i in range(len(caches))]
    next_names = [f"next_cache_{i}" for i in range(len(caches))]
    axes: dict[str, dict[int, str]] = {data_in: {2: "steps"}, "flush": {1: "flush"}}
    axes.update({name: {2: "frames"} for name in data_out})
    axes.update({name: {2: f"{name}_frames"} for name in names + next_names})
    _onnx_export(
        module,
        (module.example, flush, *caches),
        path,
        inputs=[data_in, "flush", *names],
        outputs=[*data_out, *next_names],
        axes=axes,
        metadata={STREAM_PADS_KEY: ",".join(str(p) for p in module.pads)},
    )
    return path


# -- helpers ------------------------------------------------------------------------------------


def _onnx_export(
    module: Any,
    args: tuple[Any, ...],
    path: Path,
    *,
    inputs: list[str],
    outputs: list[str],
    axes: dict[str, dict[int, str]],
    metadata: Mapping[str, str] | None = None,
) -> None:
    import torch

    # The TorchScript exporter: these modules are plain tensor code, it handles the dynamic
    # axes by name, and it needs neither torch.export's guards nor onnxscript at export time.
    torch.onnx.export(
        module,
        args,
        str(path),
        input_names=inputs,
        output_names=outputs,
        dynamic_axes=axes,
        opset_version=OPSET,
        do_constant_folding=True,
        dynamo=False,
    )
    # Weights go to "<graph>.data" beside the graph: onnxruntime maps external data instead of
    # parsing it out of one big protobuf, which kept a second copy of the weights in the
    # engine's peak RSS.
    onnx = importlib.import_module("onnx")
    model = onnx.load(str(path))
    if metadata:
        onnx.helper.set_model_props(model, dict(metadata))
    data = external_data_path(path)
    data.unlink(missing_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )
    size = path.stat().st_size + data.stat().st_size
    _LOGGER.info("Wrote %s (%.1f MB with its data)", path, size / 1e6)


def _with_data(path: Path) -> list[Path]:
    return [path, external_data_path(path)]


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = load_file(str(path))
    return state


def _load_embed(path: Path, dims: CheckpointDims) -> Any:
    from ChatTTS.model.embed import Embed

    embed = Embed(dims.hidden_size, dims.num_audio_tokens, dims.num_text_tokens, dims.num_vq)
    embed.load_state_dict(_load_safetensors(path))
    return embed.eval()


def _load_decoder(path: Path, config: Any) -> Any:
    from ChatTTS.model.dvae import DVAE

    decoder = DVAE(decoder_config=asdict(config.decoder), dim=config.decoder.idim)
    decoder.load_state_dict(_load_safetensors(path))
    return decoder.eval()


def _load_vocos(path: Path, config: Any) -> Any:
    # vocos ships no type information; importlib keeps mypy from asking for stubs.
    vocos_module = importlib.import_module("vocos")
    instantiate_class = importlib.import_module("vocos.pretrained").instantiate_class

    vocos = vocos_module.Vocos(
        feature_extractor=instantiate_class(args=(), init=asdict(config.vocos.feature_extractor)),
        backbone=instantiate_class(args=(), init=asdict(config.vocos.backbone)),
        head=instantiate_class(args=(), init=asdict(config.vocos.head)),
    )
    vocos.load_state_dict(_load_safetensors(path))
    return vocos.eval()


def _save_npy(path: Path, tensor: torch.Tensor) -> Path:
    np.save(path, tensor.detach().float().contiguous().numpy(), allow_pickle=False)
    return path


def _copy_tokenizer(src: Path, dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if not (src / name).is_file():
            raise EngineError(f"{src / name}: missing (ChatTTS tokenizer incomplete)")
        copied.append(Path(shutil.copyfile(src / name, dest / name)))
    return copied


def _write_spk_stat(src: Path, dims: CheckpointDims, dest: Path) -> Path:
    own = src / SPK_STAT_FILE
    if own.is_file():
        shutil.copyfile(own, dest)
        return dest
    # Only the official release loads without asset/spk_stat.json (its statistics are built
    # into ChatTTS's Config); write them out so the torch-free engine has them too.
    from ChatTTS.config import Config

    data = {
        "format": SPK_STAT_FORMAT,
        "version": 1,
        "hidden_size": dims.hidden_size,
        "spk_stat": Config().spk_stat,
    }
    dest.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return dest


def _copy_homophones(dest: Path) -> Path:
    spec = importlib.util.find_spec("ChatTTS")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("the ChatTTS package is not installed (install the 'chattts' extra)")
    package = Path(next(iter(spec.submodule_search_locations)))
    shutil.copyfile(package / "res" / "homophones_map.json", dest)
    return dest


def _write_config(dims: CheckpointDims, gpt_config: Mapping[str, Any], path: Path) -> Path:
    head_dim = dims.hidden_size // dims.num_attention_heads
    data = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "sample_rate": SAMPLE_RATE,
        "hop_length": HOP_LENGTH,
        "n_fft": dims.vocos_head_n_fft,
        "hidden_size": dims.hidden_size,
        "num_hidden_layers": dims.num_hidden_layers,
        "num_attention_heads": dims.num_attention_heads,
        "head_dim": int(gpt_config.get("head_dim") or head_dim),
        "num_vq": dims.num_vq,
        "num_audio_tokens": dims.num_audio_tokens,
        "num_text_tokens": dims.num_text_tokens,
        "max_position_embeddings": dims.max_position_embeddings,
        "opset": OPSET,
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def _source_files(src: Path) -> list[str]:
    files = list(CHECKPOINT_FILES)
    if (src / SPK_STAT_FILE).is_file():
        files.append(SPK_STAT_FILE)
    return files


def _verify_source(src: Path, expected: Mapping[str, str]) -> dict[str, str]:
    """Check the checkpoint against ``expected``; returns the hashes (read once, then recorded
    in the export's manifest as its source)."""
    hashes: dict[str, str] = {}
    for rel in _source_files(src):
        want = expected.get(rel)
        if want is None:
            raise EngineError(f"{src / rel}: no expected sha256 for this file")
        if not (src / rel).is_file():
            raise EngineError(f"{src / rel}: missing (ChatTTS checkpoint incomplete)")
        actual = sha256_file(src / rel)
        if actual != want.lower():
            raise EngineError(f"{src / rel}: sha256 mismatch (expected {want}, got {actual})")
        hashes[rel] = actual
    return hashes
