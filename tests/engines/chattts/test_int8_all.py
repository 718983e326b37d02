"""The optional ``int8-all`` variant: the INT8 GPT plus an INT8 decoder and Vocos.

On the tiny random checkpoint (tests/support/chattts_tiny.py): ``quantize_int8_all`` writes new
files beside the export and records them, the FP32 files and the other variants stay as they
were, the engine verifies and loads the variant, and its audio stays within a stated SNR of
FP32's decoder on the same hidden states (one shot and streamed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.support.chattts_tiny import NEEDS_CHATTTS_ONNX
from tts_bridge.engines.base import EngineError
from tts_bridge.engines.chattts.common import ChatTTSOptions
from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
from tts_bridge.engines.chattts.onnx_format import (
    MANIFEST_FILE,
    STREAM_GRAPHS,
    loaded_files,
    precision_files,
    read_manifest,
)
from tts_bridge.engines.chattts.onnx_model import ChatTTSOnnxModel, SamplingParams, code_prompt
from tts_bridge.engines.manifests import sha256_file

pytestmark = NEEDS_CHATTTS_ONNX

THREADS = 1
TEXT = "the washing machine has finished"
MIN_SNR_DB = 30.0
"""Stated fidelity of the INT8 decoder and Vocos: the waveform's SNR against FP32's decoders on
the same hidden states. The tiny model measures about 40 dB one shot and streamed; per-tensor
INT8 weights and activations are good for about 35-40 dB per layer, so a broken graph (wrong
scales, a dropped layer) lands far below this."""
CODEC_FILES = (
    "decoder_stream.int8.onnx",
    "decoder_stream.int8.onnx.data",
    "vocos_stream.int8.onnx",
    "vocos_stream.int8.onnx.data",
)


def _snr_db(reference: npt.NDArray[np.float32], other: npt.NDArray[np.float32]) -> float:
    ref = reference.astype(np.float64)
    noise = float(np.sum((ref - other) ** 2))
    return float(10 * np.log10(float(np.sum(ref**2)) / max(noise, 1e-30)))


@pytest.fixture(scope="module")
def lean(tiny_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny INT8 export with the int8-all variant added (read-only)."""
    from tts_bridge.engines.chattts.quantize import quantize_int8_all

    copy = tmp_path_factory.mktemp("int8-all") / "export"
    shutil.copytree(tiny_export, copy)
    quantize_int8_all(copy)
    return copy


@pytest.fixture(scope="module")
def hiddens(tiny_export: Path) -> npt.NDArray[np.float32]:
    """Hidden states of one generation of the tiny INT8 GPT (120 codes)."""
    model = ChatTTSOnnxModel(
        tiny_export, precision_files(read_manifest(tiny_export), "int8"), threads=THREADS
    )
    prompt = model.encode([code_prompt(model.cleaner(TEXT), 5, True)], None)
    params = SamplingParams(min_new_token=120, max_new_token=120)
    (result,) = model.generate(prompt, params, seed=3)
    return result.hiddens


def test_int8_all_is_optional_and_leaves_the_other_files_alone(
    tiny_export: Path, tmp_path: Path
) -> None:
    from tts_bridge.engines.chattts.quantize import quantize_int8_all

    before = read_manifest(tiny_export)
    assert "int8-all" not in before["variants"]  # never made by default
    copy = tmp_path / "export"
    shutil.copytree(tiny_export, copy)
    written = quantize_int8_all(copy)
    assert [p.name for p in written] == [*CODEC_FILES, MANIFEST_FILE]
    after = read_manifest(copy)
    # Every file the export had is unchanged on disk and in the manifest; the new ones are added.
    assert {rel: after["files"][rel] for rel in before["files"]} == before["files"]
    for rel, digest in before["files"].items():
        assert sha256_file(copy / rel) == digest, rel
    for name in CODEC_FILES:
        assert after["files"][name] == sha256_file(copy / name)
    assert {k: after["variants"][k] for k in before["variants"]} == before["variants"]
    assert after["variants"]["int8-all"] == {
        **before["variants"]["fp32"],
        "gpt": before["variants"]["int8"]["gpt"],
        "decoder_stream": "decoder_stream.int8.onnx",
        "vocos_stream": "vocos_stream.int8.onnx",
    }
    record = after["int8_all_quantization"]
    assert record["graphs"] == list(STREAM_GRAPHS)
    assert record["weight_type"] == before["quantization"]["weight_type"]  # both chosen by CPU
    assert set(loaded_files(after, "int8-all")) >= set(CODEC_FILES)


def test_int8_all_graphs_multiply_int8_weights(lean: Path) -> None:
    import onnx

    for name in ("decoder_stream.int8.onnx", "vocos_stream.int8.onnx"):
        graph = onnx.load(lean / name, load_external_data=False).graph
        weights = {i.name: i.data_type for i in graph.initializer}
        float_matmuls = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
        assert not float_matmuls, name  # every weight MatMul was quantized
        integer = [n for n in graph.node if n.op_type == "MatMulInteger"]
        assert integer, name
        eight_bit = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
        assert all(weights[n.input[1]] in eight_bit for n in integer), name
        # The convolutions keep their FP32 weights (onnxruntime's ConvInteger is slower).
        assert not any(n.op_type == "ConvInteger" for n in graph.node), name
    fp32 = sum((lean / f"{g}.onnx.data").stat().st_size for g in STREAM_GRAPHS)
    int8 = sum((lean / f"{g}.int8.onnx.data").stat().st_size for g in STREAM_GRAPHS)
    assert int8 < fp32  # at full size a quarter (the MatMuls); here the convolutions dominate


def test_int8_all_audio_is_within_the_stated_snr_of_fp32(
    lean: Path, hiddens: npt.NDArray[np.float32]
) -> None:
    manifest = read_manifest(lean)
    reference = ChatTTSOnnxModel(lean, precision_files(manifest, "int8"), threads=THREADS)
    tested = ChatTTSOnnxModel(lean, precision_files(manifest, "int8-all"), threads=THREADS)
    want, got = reference.decode(hiddens), tested.decode(hiddens)
    assert got.shape == want.shape and np.isfinite(got).all()
    assert not np.array_equal(got, want)  # really other decoders
    assert _snr_db(want, got) >= MIN_SNR_DB, _snr_db(want, got)
    # Streamed in pieces: each piece is final, and joined they stay as close to FP32's audio
    # (the activations' scales are per call, so not bit-equal to the one-shot INT8 audio).
    decoder = tested.stream_decoder()
    pieces = [decoder.push(hiddens[:count]) for count in (9, 21, 45, 80)]
    pieces.append(decoder.push(hiddens, final=True))
    streamed = np.concatenate(pieces)
    assert streamed.shape == want.shape
    assert _snr_db(want, streamed) >= MIN_SNR_DB, _snr_db(want, streamed)
    # A flush with no new codes (right padding only) works on the INT8 graphs too.
    decoder = tested.stream_decoder()
    head = decoder.push(hiddens[:60])
    tail = decoder.push(hiddens[:60], final=True)
    assert np.concatenate([head, tail]).shape == reference.decode(hiddens[:60]).shape


def test_engine_verifies_and_speaks_int8_all(lean: Path) -> None:
    engine = ChatTTSOnnxEngine(lean, precision="int8-all", threads=THREADS)
    assert ":int8-all:" in engine.identity
    assert engine.identity != ChatTTSOnnxEngine(lean, precision="int8").identity
    assert set(engine.files()) >= set(CODEC_FILES)
    (audio,) = engine.synthesize("The front door is open.", None, ChatTTSOptions(seed=5))
    assert audio.dtype == np.float32 and np.isfinite(audio).all() and audio.size > 0
    engine.unload()


def test_tampered_int8_decoder_is_refused(lean: Path, tmp_path: Path) -> None:
    copy = tmp_path / "export"
    shutil.copytree(lean, copy)
    with (copy / "vocos_stream.int8.onnx.data").open("ab") as handle:
        handle.write(b"\0")
    with pytest.raises(EngineError, match=r"vocos_stream\.int8\.onnx\.data: sha256 mismatch"):
        ChatTTSOnnxEngine(copy, precision="int8-all").load()
    ChatTTSOnnxEngine(copy, precision="int8").load()  # int8 does not use that file


def test_int8_all_from_an_fp32_export_makes_int8_first(
    tiny_export_fp32: Path, tmp_path: Path
) -> None:
    from tts_bridge.engines.chattts.quantize import quantize_int8_all

    copy = tmp_path / "export"
    shutil.copytree(tiny_export_fp32, copy)
    with pytest.raises(EngineError, match=r"no int8-all variant.*quantize --int8-all"):
        ChatTTSOnnxEngine(copy, precision="int8-all").load()
    written = {p.name for p in quantize_int8_all(copy)}
    assert {"gpt.int8.onnx", "gpt.int8.onnx.data", *CODEC_FILES} <= written
    manifest = json.loads((copy / MANIFEST_FILE).read_text(encoding="utf-8"))
    assert manifest["variants"]["int8"]["gpt"] == manifest["variants"]["int8-all"]["gpt"]
    ChatTTSOnnxEngine(copy, precision="int8-all").load()


def test_int8_all_needs_the_streaming_graphs(tiny_export: Path, tmp_path: Path) -> None:
    """An export made before the streaming graphs streams with windows, whose reach is measured
    by NaN: INT8 activations would spread it everywhere, so the variant is refused there."""
    from tts_bridge.engines.chattts.onnx_format import write_manifest
    from tts_bridge.engines.chattts.quantize import quantize_int8_all

    copy = tmp_path / "export"
    shutil.copytree(tiny_export, copy)
    manifest = read_manifest(copy)
    variants = {
        name: {role: f for role, f in graphs.items() if role not in STREAM_GRAPHS}
        for name, graphs in manifest["variants"].items()
    }
    extra = {k: v for k, v in manifest.items() if k not in ("files", "variants")}
    write_manifest(copy, sorted(manifest["files"]), variants=variants, extra=extra)
    with pytest.raises(EngineError, match="export the model again"):
        quantize_int8_all(copy)
    assert "int8-all" not in read_manifest(copy)["variants"]
