"""The ChatTTS ONNX export as files: its layout, its manifest and which files a precision uses.

An export is a folder that ``export.export_chattts`` writes and ``quantize.quantize_onnx``
extends with INT8 graphs; ``manifest.json`` holds the sha256 of every file and, per precision,
which graph file plays which role. The exporter, the quantizer, the engine and the model
registry all read the layout from here, so none of them can disagree about a file name, and
reading it costs neither onnxruntime nor torch (the registry looks for exports at start-up).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tts_bridge.engines.base import EngineError
from tts_bridge.engines.manifests import sha256_file
from tts_bridge.engines.settings import Precision
from tts_bridge.system.durable import write_atomic

__all__ = [
    "COMMON_FILES",
    "CONFIG_FILE",
    "DECODER_FILE",
    "DECODER_STREAM_FILE",
    "EMB_CODE_FILE",
    "EMB_TEXT_FILE",
    "FORMAT",
    "FORMAT_VERSION",
    "GPT_FILE",
    "GRAPHS",
    "HEAD_TEXT_FILE",
    "HOMOPHONES_FILE",
    "MANIFEST_FILE",
    "QUANTIZED_PRECISIONS",
    "SPK_STAT_NAME",
    "STREAM_GRAPHS",
    "STREAM_PADS_KEY",
    "TOKENIZER_DIR",
    "TOKENIZER_FILES",
    "VOCOS_FILE",
    "VOCOS_STREAM_FILE",
    "WINDOW_FILE",
    "Precision",
    "cpu_has_vnni",
    "external_data_path",
    "loaded_files",
    "loaded_roles",
    "precision_files",
    "read_manifest",
    "write_manifest",
]

FORMAT = "chattts-onnx"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
MANIFEST_FILE = "manifest.json"
GPT_FILE = "gpt.onnx"
HEAD_TEXT_FILE = "head_text.onnx"
DECODER_FILE = "decoder.onnx"
VOCOS_FILE = "vocos.onnx"
DECODER_STREAM_FILE = "decoder_stream.onnx"
VOCOS_STREAM_FILE = "vocos_stream.onnx"
STREAM_PADS_KEY = "pads"
"""Metadata of a streaming graph: each cache's padding p, comma-separated (exporter docs)."""
EMB_TEXT_FILE = "emb_text.npy"
EMB_CODE_FILE = "emb_code.npy"
WINDOW_FILE = "istft_window.npy"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SPK_STAT_NAME = "spk_stat.json"
HOMOPHONES_FILE = "homophones_map.json"
COMMON_FILES = (
    CONFIG_FILE,
    EMB_TEXT_FILE,
    EMB_CODE_FILE,
    WINDOW_FILE,
    *(f"{TOKENIZER_DIR}/{name}" for name in TOKENIZER_FILES),
    SPK_STAT_NAME,
    HOMOPHONES_FILE,
)
"""Files every precision uses; the graphs per precision are listed in the manifest."""

QUANTIZED_PRECISIONS: tuple[Precision, ...] = ("int8", "int4", "int8-all")
"""The variants ``tts-bridge models quantize`` makes (``int8-all``: the decoder and Vocos in
INT8 too, see ``quantize.quantize_int8_all``)."""
GRAPHS = ("gpt", "decoder", "vocos")
STREAM_GRAPHS = ("decoder_stream", "vocos_stream")
"""Optional roles (exports before them stream with ``StreamingDecoder``'s windows). When an
export has them, they also do the one-shot decode (one push with the flush: the same
convolutions, zero padded at both ends) and the ``decoder``/``vocos`` graphs are not loaded,
so the streaming graphs cost no memory (see ``loaded_roles``)."""


def loaded_roles(graphs: Mapping[str, str]) -> tuple[str, ...]:
    """The roles of ``graphs`` (``precision_files``) the engine loads: the streaming graphs
    replace the one-shot decoder and Vocos where the export has them."""
    if set(STREAM_GRAPHS) <= set(graphs):
        return ("gpt", *STREAM_GRAPHS)
    return GRAPHS


def write_manifest(
    folder: Path,
    files: Sequence[str],
    *,
    variants: Mapping[str, Mapping[str, str]],
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``manifest.json``: sha256 of ``files`` (relative paths) and the precision variants."""
    data: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "files": {rel: sha256_file(folder / rel) for rel in sorted(set(files))},
        "variants": {name: dict(graphs) for name, graphs in variants.items()},
    }
    data.update(extra or {})
    path = folder / MANIFEST_FILE
    # Rewritten by each quantization too: a crash leaves the old manifest or the new one.
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(folder: Path) -> dict[str, Any]:
    """The export's manifest; EngineError when it is missing or not ours."""
    path = folder / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineError(f"{path}: unreadable ({exc}); export the model first") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise EngineError(f"{path}: not a {FORMAT} manifest")
    if data.get("version") != FORMAT_VERSION:
        raise EngineError(f"{path}: manifest version {data.get('version')} is not supported")
    if not isinstance(data.get("files"), dict) or not isinstance(data.get("variants"), dict):
        raise EngineError(f"{path}: manifest lacks 'files' or 'variants'")
    return data


def external_data_path(graph: Path) -> Path:
    """Where a graph's weights are stored: 'gpt.onnx' -> 'gpt.onnx.data' beside it."""
    return graph.with_name(graph.name + ".data")


def precision_files(manifest: Mapping[str, Any], precision: str) -> dict[str, str]:
    """Graph role -> file for ``precision``; EngineError if that variant was never made.

    The streaming graphs (``STREAM_GRAPHS``) are included when the export has both."""
    variants: Mapping[str, Any] = manifest["variants"]
    graphs = variants.get(precision)
    if not isinstance(graphs, dict) or not set(GRAPHS) <= set(graphs):
        flag = {"int4": " --int4", "int8-all": " --int8-all"}.get(precision, "")
        hint = (
            f" (run: tts-bridge models quantize{flag})" if precision in QUANTIZED_PRECISIONS else ""
        )
        raise EngineError(f"this export has no {precision} variant{hint}")
    roles = GRAPHS + STREAM_GRAPHS if set(STREAM_GRAPHS) <= set(graphs) else GRAPHS
    return {role: str(graphs[role]) for role in roles}


def cpu_has_vnni() -> bool:
    """True on an x86 CPU with VNNI, where onnxruntime's u8 x s8 products cannot saturate."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return bool({"avx512_vnni", "avx_vnni"} & set(flags.split(":", 1)[-1].split()))


def loaded_files(manifest: Mapping[str, Any], precision: str) -> tuple[str, ...]:
    """Relative paths of every file the engine loads for ``precision``: what it verifies and
    hashes into its identity."""
    roles = precision_files(manifest, precision)
    graphs = {roles[role] for role in loaded_roles(roles)}
    # The text head (FP32 in both precisions) serves refine_text: verified and in the identity.
    graphs.add(HEAD_TEXT_FILE)
    data = {external_data_path(Path(g)).as_posix() for g in graphs}
    return (*COMMON_FILES, *sorted(graphs | (data & set(manifest["files"]))))
