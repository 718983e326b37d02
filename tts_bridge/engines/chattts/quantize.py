"""INT8 variants of an exported ChatTTS model (onnxruntime dynamic quantization).

Dynamic quantization stores MatMul weights as 8-bit integers and quantizes activations per call;
it needs no calibration data, which we could not have without the real weights anyway.

Choices, measured on the full-size architecture with random weights (``python -m
tts_bridge.bench.onnx_backends``; the figures are in docs/benchmarks.md):

* **Weight type by CPU.** onnxruntime multiplies u8 activations by s8 (QInt8) weights. On x86
  CPUs with VNNI (``avx512_vnni``/``avx_vnni``) that is one exact instruction, and QInt8 was the
  faster choice at equal logit error. Without VNNI (AVX2 only, e.g. AMD Zen 2/3) the u8 x s8
  path goes through ``vpmaddubsw``, whose 16-bit sums saturate: QInt8 logits were badly off
  and slower, so QUInt8 is used there, and on anything that is not x86.
  ``weight_type="auto"`` (the default) decides by the CPU that quantizes; the engine warns when
  a QInt8 model is loaded on a CPU without VNNI.
* **Per tensor, no reduce_range.** Per-channel scales cut the logit error only slightly and
  were no faster; reduce_range (7-bit weights, the other cure for saturation) raised the error
  for no measurable speed on VNNI.
* **The decoder and Vocos stay FP32.** They are a small part of a token's time; INT8 saved
  little of it and put its error straight into the waveform.
* **MatMul only.** onnxruntime's dynamic ConvInteger path is slower than its FP32 convolutions.

``quantize_int4`` adds an optional ``int4`` variant for boards short of memory: the GPT's MatMul
weights as 4-bit blocks (onnxruntime's ``MatMulNBits``, symmetric), the rest as in FP32. It is
never made by default: on random weights its logits pick FP32's top code far less often than
INT8's (the bench reports the agreement), and only real weights can say whether it sounds right.

* **Block 128, accuracy level 4.** Level 4 multiplies with int8 activations (the VNNI path);
  without it the 4-bit graph was slower than INT8. Block 32 reads 18 % more bytes (more scales)
  and was slower than 128 in the same run.

``quantize_int8_all`` adds an optional ``int8-all`` variant for a process that must stay small:
the INT8 GPT of ``int8`` plus the decoder and Vocos the engine loads (the streaming graphs) with
INT8 MatMul weights, about 110 MB less resident memory at full size. Nearly all of those two
graphs' weights are the ConvNeXt blocks' pointwise MatMuls, so this is the same dynamic
quantization as the GPT's (MatMul only, per tensor, the weight type by CPU); it also decoded
faster than FP32. Its cost is in the waveform, measured against FP32 on the same hidden states
(docs/benchmarks.md has the figures), and in streaming: the activations' scales are per call, so
the pieces of a streamed text no longer equal its one-shot audio bit for bit, only to within
that same error. Weight-only 8-bit blocks (``MatMulNBits`` with float activations) would keep
streaming exact, but decoded slower than FP32. ``int8`` itself is unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tts_bridge.engines.base import EngineError
from tts_bridge.engines.chattts.onnx_format import (
    COMMON_FILES,
    GRAPHS,
    HEAD_TEXT_FILE,
    STREAM_GRAPHS,
    cpu_has_vnni,
    external_data_path,
    precision_files,
    read_manifest,
    write_manifest,
)

_LOGGER = logging.getLogger(__name__)

WeightType = Literal["auto", "quint8", "qint8"]


@dataclass(frozen=True)
class QuantizeSettings:
    """How ``quantize_onnx`` quantizes; the defaults are the measured choice (module docs)."""

    weight_type: WeightType = "auto"
    """8-bit weight type; "auto": QInt8 on x86 CPUs with VNNI, QUInt8 elsewhere (module docs)."""
    per_channel: bool = False
    """One scale per output channel instead of per tensor."""
    reduce_range: bool = False
    """7-bit weights, which avoids the saturation but loses precision."""
    graphs: tuple[str, ...] = ("gpt",)
    """Which graphs get an INT8 file; the others are shared with the FP32 variant."""


def resolve_weight_type(requested: WeightType) -> Literal["quint8", "qint8"]:
    """The weight type "auto" stands for on this CPU (see the module docs)."""
    if requested != "auto":
        return requested
    return "qint8" if cpu_has_vnni() else "quint8"


def int8_name(fp32_name: str) -> str:
    """'gpt.onnx' -> 'gpt.int8.onnx'."""
    stem = fp32_name.removesuffix(".onnx")
    return f"{stem}.int8.onnx"


def quantize_onnx(dest: Path, settings: QuantizeSettings | None = None) -> list[Path]:
    """Write INT8 graphs next to the FP32 export in ``dest``; update its manifest.

    Adds the ``int8`` variant (quantized graphs per ``settings``, FP32 for the rest) and the
    settings used to the manifest. Returns the files written, the manifest last. Needs ``onnx``
    (onnxruntime's quantizer edits the graph with it), not torch.
    """

    settings = settings or QuantizeSettings()
    unknown = set(settings.graphs) - set(GRAPHS)
    if unknown:
        raise EngineError(f"unknown graphs to quantize: {sorted(unknown)}")
    manifest = read_manifest(dest)
    fp32 = precision_files(manifest, "fp32")
    chosen = resolve_weight_type(settings.weight_type)
    written: list[Path] = []
    int8 = dict(fp32)
    for role in settings.graphs:
        source = dest / fp32[role]
        target = dest / int8_name(fp32[role])
        written += _quantize_matmuls(
            source,
            target,
            chosen,
            per_channel=settings.per_channel,
            reduce_range=settings.reduce_range,
        )
        int8[role] = target.name
    files = _all_files(manifest, [p.name for p in written])
    variants = {**manifest["variants"], "int8": int8}
    extra = {k: v for k, v in manifest.items() if k not in ("files", "variants")}
    extra["quantization"] = {
        "method": "onnxruntime.quantization.quantize_dynamic",
        "weight_type": chosen,
        "requested_weight_type": settings.weight_type,
        "quantized_on_vnni_cpu": cpu_has_vnni(),
        "per_channel": settings.per_channel,
        "reduce_range": settings.reduce_range,
        "graphs": list(settings.graphs),
    }
    written.append(write_manifest(dest, files, variants=variants, extra=extra))
    return written


INT4_BLOCK_SIZE = 128
INT4_ACCURACY_LEVEL = 4
"""onnxruntime's ``accuracy_level``: 4 = int8 activations ("compute type int8")."""


def int4_name(fp32_name: str) -> str:
    """'gpt.onnx' -> 'gpt.int4.onnx'."""
    return f"{fp32_name.removesuffix('.onnx')}.int4.onnx"


def quantize_int4(
    dest: Path,
    *,
    block_size: int = INT4_BLOCK_SIZE,
    accuracy_level: int = INT4_ACCURACY_LEVEL,
) -> list[Path]:
    """Write ``gpt.int4.onnx`` (4-bit MatMul weights) next to the export; add the ``int4``
    variant to the manifest. Returns the files written, the manifest last. Needs ``onnx`` and
    ``onnx_ir`` (onnxruntime's 4-bit quantizer uses both), not torch."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if block_size < 16 or block_size & (block_size - 1):
        raise EngineError(f"int4 block size must be a power of two >= 16, not {block_size}")
    manifest = read_manifest(dest)
    fp32 = precision_files(manifest, "fp32")
    source = dest / fp32["gpt"]
    target = dest / int4_name(fp32["gpt"])
    quantizer = MatMulNBitsQuantizer(
        onnx.load(source),
        block_size=block_size,
        is_symmetric=True,
        accuracy_level=accuracy_level,
    )
    quantizer.process()
    data = external_data_path(target)
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(
        quantizer.model.model,
        target,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )
    _LOGGER.info(
        "Quantized %s -> %s (4-bit blocks of %d, accuracy level %d, %.1f -> %.1f MB)",
        source.name,
        target.name,
        block_size,
        accuracy_level,
        _size(source) / 1e6,
        _size(target) / 1e6,
    )
    written = [target, data]
    files = _all_files(manifest, [p.name for p in written])
    variants = {**manifest["variants"], "int4": {**fp32, "gpt": target.name}}
    extra = {k: v for k, v in manifest.items() if k not in ("files", "variants")}
    extra["int4_quantization"] = {
        "method": "onnxruntime.quantization.matmul_nbits_quantizer (MatMulNBits)",
        "block_size": block_size,
        "accuracy_level": accuracy_level,
        "symmetric": True,
        "graphs": ["gpt"],
    }
    written.append(write_manifest(dest, files, variants=variants, extra=extra))
    return written


def quantize_int8_all(dest: Path, weight_type: WeightType = "auto") -> list[Path]:
    """Add the ``int8-all`` variant: ``int8``'s GPT (made first when the export has none) and
    INT8 MatMul weights in the streaming decoder and Vocos, which the engine loads for every
    decode (``decoder_stream.int8.onnx``, ``vocos_stream.int8.onnx``). Returns the files
    written, the manifest last; the FP32 files are left as they are.

    An export without the streaming graphs is refused: its windowed streaming measures the
    decoders' reach by how NaN spreads, and INT8 activations (one scale per call) spread a NaN
    over every frame."""

    written: list[Path] = []
    manifest = read_manifest(dest)
    if not set(STREAM_GRAPHS) <= set(precision_files(manifest, "fp32")):
        raise EngineError(
            f"{dest}: no streaming decoder graphs to quantize; export the model again first"
        )
    if "int8" not in manifest["variants"]:
        written += quantize_onnx(dest)[:-1]
        manifest = read_manifest(dest)
    fp32 = precision_files(manifest, "fp32")
    variant = {**fp32, "gpt": precision_files(manifest, "int8")["gpt"]}
    chosen = resolve_weight_type(weight_type)
    roles = list(STREAM_GRAPHS)
    for role in roles:
        source = dest / fp32[role]
        target = dest / int8_name(fp32[role])
        written += _quantize_matmuls(source, target, chosen)
        variant[role] = target.name
    files = _all_files(manifest, [p.relative_to(dest).as_posix() for p in written])
    variants = {**manifest["variants"], "int8-all": variant}
    extra = {k: v for k, v in manifest.items() if k not in ("files", "variants")}
    extra["int8_all_quantization"] = {
        "method": "onnxruntime.quantization.quantize_dynamic",
        "weight_type": chosen,
        "requested_weight_type": weight_type,
        "quantized_on_vnni_cpu": cpu_has_vnni(),
        "per_channel": False,
        "reduce_range": False,
        "graphs": roles,
        "gpt": variant["gpt"],
    }
    written.append(write_manifest(dest, files, variants=variants, extra=extra))
    return written


def _quantize_matmuls(
    source: Path,
    target: Path,
    weight_type: Literal["quint8", "qint8"],
    *,
    per_channel: bool = False,
    reduce_range: bool = False,
) -> list[Path]:
    """INT8 weights for ``source``'s MatMuls (onnxruntime's dynamic quantization) in
    ``target``; returns the graph and its data file."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    external_data_path(target).unlink(missing_ok=True)  # onnx appends to an existing data file
    quantize_dynamic(
        source,
        target,
        # MatMul only: onnxruntime's dynamic ConvInteger is slower than FP32 Conv on CPU.
        op_types_to_quantize=["MatMul", "Gemm"],
        per_channel=per_channel,
        reduce_range=reduce_range,
        weight_type=QuantType.QInt8 if weight_type == "qint8" else QuantType.QUInt8,
        # Weights in "<graph>.data", as the exporter writes them (less peak memory at load).
        use_external_data_format=True,
    )
    _LOGGER.info(
        "Quantized %s -> %s (%s weights, %.1f -> %.1f MB)",
        source.name,
        target.name,
        weight_type,
        _size(source) / 1e6,
        _size(target) / 1e6,
    )
    return [target, external_data_path(target)]


def _size(graph: Path) -> int:
    data = external_data_path(graph)
    return graph.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def _all_files(manifest: Mapping[str, Any], added: Sequence[str]) -> list[str]:
    # read_manifest checked that "files" is a mapping; re-quantizing rewrites the same names.
    known = set(manifest["files"]) | set(COMMON_FILES) | {HEAD_TEXT_FILE}
    return sorted(known | set(added))
