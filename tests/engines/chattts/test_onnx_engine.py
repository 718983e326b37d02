"""ChatTTS on ONNX Runtime: export, INT8 quantization and the torch-free engine.

Everything runs on the tiny random checkpoint (tests/support/chattts_tiny.py): the real exporter
writes real ONNX graphs, onnxruntime runs them, and the results are compared with ChatTTS's own
torch modules and code loop on the same weights. The audio is noise; the comparisons are exact or
within stated tolerances.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest

from tests.support.chattts_tiny import (
    HIDDEN_SIZE,
    NEEDS_CHATTTS_ONNX,
    chattts_reference,
    run_torch_free,
    tiny_hashes,
)
from tts_bridge.engines.base import EngineError, SynthesisOptions
from tts_bridge.engines.chattts.common import ChatTTSOptions
from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
from tts_bridge.engines.chattts.onnx_format import (
    MANIFEST_FILE,
    cpu_has_vnni,
    precision_files,
    read_manifest,
)
from tts_bridge.engines.chattts.onnx_model import (
    ChatTTSOnnxModel,
    CodeSampler,
    SamplingParams,
    TextCleaner,
    code_prompt,
    normalized_speaker,
)
from tts_bridge.engines.chattts.onnx_stream import istft
from tts_bridge.engines.chattts.speaker import encode_spk_emb, sample_spk_emb
from tts_bridge.engines.chattts.torch_engine import CHECKPOINT_FILES, SPK_STAT_FILE, ChatTTSEngine
from tts_bridge.engines.manifests import sha256_file

THREADS = 1
TEXTS = ["the washing machine has finished", "客厅的灯已经打开了"]
PARITY_STEPS = 40
# Stated INT8 tolerance: relative L2 error of the code logits against FP32. Both weight types
# measure about 0.006 on this model where they are used (QInt8 only with VNNI); the u8 x s8
# saturation QInt8 suffers without VNNI shows up as errors near 0.4.
INT8_LOGIT_REL_TOLERANCE = 0.05
INT4_LOGIT_REL_TOLERANCE = 0.25
"""4-bit blocks lose far more than INT8; this only catches a broken graph (wrong layout or
scales give errors of order 1), the bench measures the real agreement."""

pytestmark = NEEDS_CHATTTS_ONNX


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Path) -> Path:
    return tiny_checkpoint


@pytest.fixture(scope="module")
def export(tiny_export: Path) -> Path:
    """The tiny checkpoint exported and quantized (shared: treat as read-only)."""
    return tiny_export


@pytest.fixture(scope="module")
def chat(checkpoint: Path) -> Iterator[Any]:
    """ChatTTS itself (torch) on the same checkpoint: the reference."""
    yield from chattts_reference(checkpoint, THREADS)


def _model(export: Path, precision: str = "fp32") -> ChatTTSOnnxModel:
    graphs = precision_files(read_manifest(export), precision)
    return ChatTTSOnnxModel(export, graphs, threads=THREADS)


def _speaker(export: Path, seed: int = 3) -> str:
    return ChatTTSOnnxEngine(export).sample_speaker(seed)


# -- export and manifest ------------------------------------------------------------------------


def test_manifest_lists_every_file_with_its_hash(export: Path) -> None:
    manifest = read_manifest(export)
    on_disk = {
        p.relative_to(export).as_posix()
        for p in export.rglob("*")
        if p.is_file() and p.name != MANIFEST_FILE
    }
    assert set(manifest["files"]) == on_disk
    for rel, digest in manifest["files"].items():
        assert sha256_file(export / rel) == digest, rel
    assert manifest["variants"]["fp32"] == {
        "gpt": "gpt.onnx",
        "decoder": "decoder.onnx",
        "vocos": "vocos.onnx",
        "decoder_stream": "decoder_stream.onnx",
        "vocos_stream": "vocos_stream.onnx",
    }
    # The measured choice: only the GPT is worth INT8, with QUInt8 weights.
    assert manifest["variants"]["int8"]["gpt"] == "gpt.int8.onnx"
    assert manifest["variants"]["int8"]["decoder"] == "decoder.onnx"
    expected = "qint8" if cpu_has_vnni() else "quint8"
    assert manifest["quantization"]["weight_type"] == expected
    assert manifest["quantization"]["requested_weight_type"] == "auto"
    assert set(manifest["source"]["sha256"]) == {*CHECKPOINT_FILES, SPK_STAT_FILE}


def test_export_refuses_a_tampered_source(checkpoint: Path, tmp_path: Path) -> None:
    from tts_bridge.engines.chattts.export import export_chattts

    hashes = tiny_hashes(checkpoint)
    hashes["asset/Vocos.safetensors"] = "0" * 64
    with pytest.raises(EngineError, match=r"Vocos\.safetensors: sha256 mismatch"):
        export_chattts(checkpoint, tmp_path / "out", expected_sha256=hashes)
    assert not (tmp_path / "out" / MANIFEST_FILE).exists()


# -- parity with ChatTTS (torch) ----------------------------------------------------------------


def test_prompt_ids_and_embeddings_equal_chattts(export: Path, chat: Any) -> None:
    import torch

    speaker = _speaker(export)
    prompts = chat.speaker.decorate_code_prompts(list(TEXTS), "[speed_5]", None, speaker)
    assert prompts == [code_prompt(t, 5, True) for t in TEXTS]
    input_ids, attention_mask, text_mask = chat.tokenizer.encode(prompts, 4)
    with torch.no_grad():
        emb = chat.embed(input_ids, text_mask)
        chat.speaker.apply(emb, speaker, input_ids, chat.tokenizer.spk_emb_ids, emb.device)

    prompt = _model(export).encode(prompts, speaker)
    assert np.array_equal(prompt.input_ids, input_ids[..., 0].numpy())
    assert np.array_equal(prompt.attention_mask, attention_mask.numpy())
    assert np.array_equal(prompt.embeds, emb.numpy())


@pytest.mark.parametrize("seed", range(8))
def test_speaker_vector_is_normalized_exactly_like_torch(seed: int) -> None:
    import torch

    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(768) * rng.uniform(0.1, 3.0)).astype(np.float16)
    spk = encode_spk_emb(values)
    expected = torch.nn.functional.normalize(torch.from_numpy(values), p=2.0, dim=0, eps=1e-12)
    assert np.array_equal(normalized_speaker(spk, 768), expected.float().numpy())


def _greedy_torch(chat: Any, speaker: str, steps: int) -> Any:
    """ChatTTS's own GPT.generate, made greedy by a last logits processor."""
    import torch
    from ChatTTS.model.processors import gen_logits

    prompts = chat.speaker.decorate_code_prompts(list(TEXTS), "[speed_5]", None, speaker)
    input_ids, attention_mask, text_mask = chat.tokenizer.encode(prompts, 4)
    with torch.no_grad():
        emb = chat.embed(input_ids, text_mask)
        chat.speaker.apply(emb, speaker, input_ids, chat.tokenizer.spk_emb_ids, emb.device)
    warpers, processors = gen_logits(num_code=625, top_P=0.7, top_K=20, repetition_penalty=1.05)

    def greedy(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, -torch.inf)
        return out.scatter_(1, scores.argmax(1, keepdim=True), 0.0)

    return next(
        chat.gpt.generate(
            emb,
            input_ids,
            temperature=torch.tensor([0.3] * 4),
            eos_token=625,
            attention_mask=attention_mask,
            max_new_token=steps,
            min_new_token=1,
            logits_processors=(*processors, *warpers, greedy),
            return_hidden=True,
            show_tqdm=False,
            manual_seed=0,
        )
    )


def test_greedy_codes_hidden_states_and_waveform_match_torch(export: Path, chat: Any) -> None:
    """Batch of two texts of different lengths (left padding), the KV cache across 40 steps,
    the repetition penalty and both decoders, against ChatTTS's own loop and modules."""
    speaker = _speaker(export)
    reference = _greedy_torch(chat, speaker, PARITY_STEPS)
    model = _model(export)
    prompt = model.encode([code_prompt(t, 5, True) for t in TEXTS], speaker)
    params = SamplingParams(min_new_token=1, max_new_token=PARITY_STEPS, greedy=True)
    results = model.generate(prompt, params, seed=0)

    for row, result in enumerate(results):
        torch_codes = reference.ids[row].numpy()
        torch_hiddens = reference.hiddens[row].numpy()
        assert result.codes.shape == (PARITY_STEPS, 4)
        assert np.array_equal(result.codes, torch_codes)
        assert np.abs(result.hiddens - torch_hiddens).max() < 1e-5

        torch_wave = chat._decode_to_wavs([reference.hiddens[row].clone()], True)[0]
        wave = model.decode(result.hiddens)
        assert wave.shape == torch_wave.shape == (256 * (2 * PARITY_STEPS - 1),)
        assert np.abs(wave - torch_wave).max() < 1e-5
        assert np.abs(wave).max() > 1e-3  # not trivially equal


def test_decoder_and_vocos_match_torch_on_the_same_input(export: Path, chat: Any) -> None:
    import torch

    hiddens = np.random.default_rng(0).standard_normal((25, HIDDEN_SIZE)).astype(np.float32)
    model = _model(export)
    magnitude, phase = model.spectrum(hiddens)
    with torch.no_grad():
        mel = chat.decoder(torch.from_numpy(hiddens.T[None].copy()))
        x = chat.vocos.head.out(chat.vocos.backbone(mel)).transpose(1, 2)
        mag, ph = x.chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        wave = chat.vocos.decode(mel)[0].numpy()
    assert np.abs(magnitude - mag.numpy()).max() < 1e-5 * max(1.0, float(mag.abs().max()))
    assert np.abs(phase - ph.numpy()).max() < 1e-5
    assert np.abs(model.decode(hiddens) - wave).max() < 1e-5


def test_numpy_istft_equals_torch_istft() -> None:
    import torch

    rng = np.random.default_rng(1)
    magnitude = rng.uniform(0.0, 3.0, (513, 30)).astype(np.float32)
    phase = rng.uniform(-np.pi, np.pi, (513, 30)).astype(np.float32)
    window = torch.hann_window(1024)
    spec = torch.from_numpy(magnitude) * (
        torch.cos(torch.from_numpy(phase)) + 1j * torch.sin(torch.from_numpy(phase))
    )
    expected = torch.istft(spec, 1024, 256, 1024, window, center=True).numpy()
    got = istft(magnitude, phase, window.numpy(), 256)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() < 1e-5


def test_sampler_filters_like_chattts_processors() -> None:
    """Temperature, repetition penalty, top-P and top-K leave the same candidates with the same
    scores as ChatTTS's torch processors (sampling itself uses a different generator)."""
    import torch
    from ChatTTS.model.processors import gen_logits

    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((8, 626)) * 3).astype(np.float32)
    history = rng.integers(0, 40, size=(8, 23)).astype(np.int64)
    temperature = np.float32(0.3)
    warpers, processors = gen_logits(num_code=625, top_P=0.7, top_K=20, repetition_penalty=1.05)
    scores = torch.from_numpy(logits) / torch.tensor(0.3)
    for process in (*processors, *warpers):
        scores = process(torch.from_numpy(history), scores)
    expected = scores.numpy()

    sampler = CodeSampler(SamplingParams(temperature=0.3), num_vq=4, eos=625, seed=0)
    got = sampler._top_p_k(sampler._penalize(logits / temperature, history))
    assert np.array_equal(np.isfinite(got), np.isfinite(expected))
    kept = np.isfinite(expected)
    assert np.allclose(got[kept], expected[kept], rtol=1e-6, atol=1e-6)
    assert (kept.sum(axis=1) >= 3).all()


def test_min_new_token_blocks_eos() -> None:
    logits = np.zeros((4, 626), dtype=np.float32)
    logits[:, 625] = 50.0  # EOS overwhelmingly likely
    params = SamplingParams(min_new_token=2, greedy=True)
    sampler = CodeSampler(params, num_vq=4, eos=625, seed=0)
    empty = np.zeros((4, 0), dtype=np.int64)
    assert (sampler(logits, empty, step=1) != 625).all()
    assert (sampler(logits, empty, step=2) == 625).all()


@pytest.mark.parametrize(
    "text",
    [
        "The washing machine has finished!",
        "客厅的灯已经打开了：温度（摄氏）二十一度！",
        "Dinner's ready; come down (now) - 5 minutes.",
        "[uv_break]晚饭准备好了[laugh]。",
        "a stray ] bracket and an [unclosed tag",
        "Mixed 中文 and English, 你好!",
    ],
)
def test_text_cleaner_equals_chattts_normalizer(export: Path, chat: Any, text: str) -> None:
    cleaner = TextCleaner(export / "homophones_map.json")
    assert cleaner(text) == chat.normalizer(text, True, True, None)


# -- INT8 ---------------------------------------------------------------------------------------


def _forced_logits(model: ChatTTSOnnxModel, speaker: str) -> np.ndarray:
    """Code logits of a prefill and 10 steps fed fixed codes, so both models see one input."""
    prompt = model.encode([code_prompt(t, 5, True) for t in TEXTS], speaker)
    mask = prompt.attention_mask
    positions = np.cumsum(mask, axis=1) - 1
    positions[mask == 0] = 1
    embeds, cache = prompt.embeds, model.new_cache(len(TEXTS))
    codes = np.random.default_rng(4).integers(0, 625, size=(10, len(TEXTS), 4))
    collected = []
    for step in range(10):
        logits, _hidden = model.step(embeds, mask, positions, cache)
        collected.append(logits)
        embeds = model.embed_codes(codes[step])[:, None, :]
        mask = np.concatenate([mask, np.ones((len(TEXTS), 1), dtype=np.int64)], axis=1)
        positions = mask.sum(axis=1, keepdims=True) - 1
    return np.stack(collected)


def test_int8_logits_stay_close_to_fp32(export: Path) -> None:
    speaker = _speaker(export)
    fp32 = _forced_logits(_model(export, "fp32"), speaker)
    int8 = _forced_logits(_model(export, "int8"), speaker)
    assert int8.shape == fp32.shape == (10, len(TEXTS), 4, 626)
    assert np.isfinite(int8).all()
    relative = np.linalg.norm(int8 - fp32) / np.linalg.norm(fp32)
    assert relative < INT8_LOGIT_REL_TOLERANCE, relative


def test_quint8_is_accurate_on_any_cpu(export: Path, tmp_path: Path) -> None:
    from tts_bridge.engines.chattts.quantize import (
        QuantizeSettings,
        quantize_onnx,
        resolve_weight_type,
    )

    assert resolve_weight_type("quint8") == "quint8"
    assert resolve_weight_type("auto") == ("qint8" if cpu_has_vnni() else "quint8")
    copy = tmp_path / "export"
    shutil.copytree(export, copy)
    quantize_onnx(copy, QuantizeSettings(weight_type="quint8"))
    assert read_manifest(copy)["quantization"]["weight_type"] == "quint8"
    speaker = _speaker(copy)
    fp32 = _forced_logits(_model(copy, "fp32"), speaker)
    int8 = _forced_logits(_model(copy, "int8"), speaker)
    assert np.linalg.norm(int8 - fp32) / np.linalg.norm(fp32) < INT8_LOGIT_REL_TOLERANCE


def test_int8_engine_speaks_finite_audio_of_the_right_length(export: Path) -> None:
    engine = ChatTTSOnnxEngine(export, precision="int8", threads=THREADS)
    options = ChatTTSOptions(seed=5)
    chunks = list(engine.synthesize("The front door is open.", None, options))
    assert len(chunks) == 1
    audio = chunks[0]
    assert audio.dtype == np.float32 and np.isfinite(audio).all()
    assert np.abs(audio).max() <= 1.0
    # The tiny model never picks EOS: the loop runs to its budget of tokens x 512 samples.
    from tts_bridge.engines.chattts.common import expected_seconds, max_new_tokens

    budget = max_new_tokens(expected_seconds("The front door is open."))
    assert 0.9 * budget * 512 < audio.size <= 256 * (2 * budget - 1)
    again = list(engine.synthesize("The front door is open.", None, options))
    assert np.array_equal(again[0], audio)
    engine.unload()


def test_int4_variant_is_optional_close_to_fp32_and_speaks(export: Path, tmp_path: Path) -> None:
    from tts_bridge.engines.chattts.quantize import quantize_int4

    assert "int4" not in read_manifest(export)["variants"]  # never made by default
    copy = tmp_path / "export"
    shutil.copytree(export, copy)
    written = quantize_int4(copy, block_size=16)
    manifest = read_manifest(copy)
    assert manifest["variants"]["int4"]["gpt"] == "gpt.int4.onnx"
    assert "int8" in manifest["variants"]  # the other variants are kept
    assert manifest["int4_quantization"]["block_size"] == 16
    assert {p.name for p in written} >= {"gpt.int4.onnx", "gpt.int4.onnx.data"}
    import onnx

    graph = onnx.load(copy / "gpt.int4.onnx", load_external_data=False)
    assert any(node.op_type == "MatMulNBits" for node in graph.graph.node)

    speaker = _speaker(copy)
    fp32 = _forced_logits(_model(copy, "fp32"), speaker)
    int4 = _forced_logits(_model(copy, "int4"), speaker)
    relative = np.linalg.norm(int4 - fp32) / np.linalg.norm(fp32)
    assert 0 < relative < INT4_LOGIT_REL_TOLERANCE, relative

    engine = ChatTTSOnnxEngine(copy, precision="int4", threads=THREADS)
    assert ":int4:" in engine.identity
    (audio,) = engine.synthesize("The front door is open.", None, ChatTTSOptions(seed=5))
    assert np.isfinite(audio).all() and audio.size > 0
    engine.unload()
    with pytest.raises(EngineError, match="block size"):
        quantize_int4(copy, block_size=48)


# -- the engine ---------------------------------------------------------------------------------


def test_identity_names_precision_and_hash(export: Path, tmp_path: Path) -> None:
    fp32 = ChatTTSOnnxEngine(export, precision="fp32")
    int8 = ChatTTSOnnxEngine(export, precision="int8")
    assert fp32.identity.startswith(f"chattts-onnx:{export.name}:fp32:")
    assert int8.identity.startswith(f"chattts-onnx:{export.name}:int8:")
    assert fp32.identity != int8.identity
    copy = tmp_path / export.name
    shutil.copytree(export, copy)
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    manifest["files"]["gpt.int8.onnx"] = "f" * 64
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert ChatTTSOnnxEngine(copy, precision="int8").identity != int8.identity
    assert ChatTTSOnnxEngine(copy, precision="fp32").identity == fp32.identity


def test_same_voices_as_the_torch_engine(export: Path, checkpoint: Path) -> None:
    torch_engine = ChatTTSEngine(checkpoint, expected_sha256=tiny_hashes(checkpoint))
    onnx_engine = ChatTTSOnnxEngine(export)
    for seed in (0, 1, 42):
        assert onnx_engine.sample_speaker(seed) == torch_engine.sample_speaker(seed)
    assert onnx_engine.speaker_stats().std.tobytes() == torch_engine.speaker_stats().std.tobytes()


def test_tampered_graph_is_refused(export: Path, tmp_path: Path) -> None:
    copy = tmp_path / "export"
    shutil.copytree(export, copy)
    with (copy / "gpt.int8.onnx").open("ab") as handle:
        handle.write(b"\0")
    engine = ChatTTSOnnxEngine(copy, precision="int8")
    with pytest.raises(EngineError, match=r"gpt\.int8\.onnx: sha256 mismatch"):
        engine.load()
    # FP32 does not use that file and still loads.
    ChatTTSOnnxEngine(copy, precision="fp32").load()


def test_missing_int8_variant_says_how_to_make_it(export: Path, tmp_path: Path) -> None:
    copy = tmp_path / "export"
    shutil.copytree(export, copy)
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    del manifest["variants"]["int8"]
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(EngineError, match=r"no int8 variant.*quantize"):
        ChatTTSOnnxEngine(copy, precision="int8").load()


def test_refine_text_is_applied_rather_than_ignored(export: Path) -> None:
    """refine_text rewrites the text before the code loop (parity:
    tests/engines/chattts/test_refine.py):
    audio cached under a key that says refined must really be refined."""
    engine = ChatTTSOnnxEngine(export, precision="fp32", threads=THREADS)
    (plain,) = engine.synthesize("Hello.", None, ChatTTSOptions(seed=1))
    (refined,) = engine.synthesize("Hello.", None, ChatTTSOptions(seed=1, refine_text=True))
    assert refined.dtype == np.float32 and refined.size > 0 and np.isfinite(refined).all()
    assert not np.array_equal(plain, refined)
    engine.unload()


def test_batch_gives_one_clip_per_text(export: Path) -> None:
    engine = ChatTTSOnnxEngine(export, precision="fp32", threads=THREADS)
    texts = ["Hi.", "The washing machine has finished.", "?!", "晚饭准备好了。"]
    clips = engine.synthesize_batch(texts, None, SynthesisOptions())
    assert len(clips) == 4
    assert clips[2].size == 0  # nothing speakable: silence, not babble
    spoken = [clips[0], clips[1], clips[3]]
    assert all(c.dtype == np.float32 and c.size > 0 and np.isfinite(c).all() for c in spoken)
    # Each text stops at its own token budget, not at its longest batch-mate's.
    assert clips[1].size > 1.5 * clips[0].size
    assert engine.sample_rate == 24_000
    speaker = sample_spk_emb(engine.speaker_stats(), 9)
    (alone,) = engine.synthesize_batch(["Hi."], speaker, SynthesisOptions())
    assert alone.size > 0
    engine.unload()
    assert not engine.loaded


def test_engine_runs_without_importing_torch(export: Path) -> None:
    code = """
import sys
from pathlib import Path
from tts_bridge.engines.chattts.common import ChatTTSOptions
from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
sizes = {}
for precision in ("fp32", "int8"):
    engine = ChatTTSOnnxEngine(Path(sys.argv[1]), precision=precision)
    engine.identity
    speaker = engine.sample_speaker(1)
    chunks = list(engine.synthesize("Dinner is ready.", speaker, ChatTTSOptions(seed=2)))
    sizes[precision] = sum(c.size for c in chunks)
report = {"sizes": sizes}
"""
    report = run_torch_free(code, str(export))
    assert report["heavy"] == []
    assert report["sizes"]["fp32"] > 0 and report["sizes"]["int8"] > 0
