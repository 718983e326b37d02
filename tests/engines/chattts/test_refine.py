"""ChatTTS's refine pass on ONNX Runtime (tts_bridge.engines.chattts.refine), against ChatTTS.

The tiny random checkpoint of tests/support/chattts_tiny.py, with one change: the gain of the text
head's ``[Ebreak]`` row is raised, so greedy refinement ends on EOS after a few tokens instead
of always running to its budget (both ends of the loop are then compared with torch). The real
exporter writes the graphs, onnxruntime runs them, and ChatTTS's own ``_refine_text`` and
``infer(refine_text_only=True)`` on the same weights are the reference.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest

from tests.support.chattts_tiny import (
    NEEDS_CHATTTS_ONNX,
    chattts_reference,
    export_tiny,
    run_torch_free,
)
from tts_bridge.engines.base import EngineError
from tts_bridge.engines.chattts.common import ChatTTSOptions
from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
from tts_bridge.engines.chattts.onnx_format import Precision, precision_files, read_manifest
from tts_bridge.engines.chattts.onnx_model import (
    ChatTTSOnnxModel,
    CodeSampler,
    SamplingParams,
    TextCleaner,
)
from tts_bridge.engines.chattts.refine import (
    RefineParams,
    TextRefiner,
    engine_params,
    refine_budget,
    text_prompt,
)
from tts_bridge.engines.manifests import sha256_file

THREADS = 1
TEXTS = ["the washing machine has finished", "客厅的灯已经打开了"]
PROMPT = "[oral_2][laugh_0][break_6]"
EOS_GAIN = 4.0
"""Factor on the weight-norm gain of head_text's [Ebreak] row (see the module docs)."""

pytestmark = NEEDS_CHATTTS_ONNX


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer

    # A copy of the session's checkpoint: this module changes it.
    dest = Path(
        shutil.copytree(tiny_checkpoint, tmp_path_factory.mktemp("chattts-refine") / "tiny")
    )
    tokenizer = Tokenizer.from_file(str(dest / "asset" / "tokenizer" / "tokenizer.json"))
    eos = tokenizer.token_to_id("[Ebreak]")
    embed = dest / "asset" / "Embed.safetensors"
    state = load_file(str(embed))
    state["head_text.parametrizations.weight.original0"][eos] *= EOS_GAIN
    save_file(state, str(embed))
    return dest


@pytest.fixture(scope="module")
def export(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint exported and quantized (treat as read-only)."""
    dest = tmp_path_factory.mktemp("chattts-refine") / "export"
    return export_tiny(checkpoint, dest, quantize=True)


@pytest.fixture(scope="module")
def chat(checkpoint: Path) -> Iterator[Any]:
    """ChatTTS itself (torch) on the same checkpoint: the reference."""
    yield from chattts_reference(checkpoint, THREADS)


def _refiner(export: Path, precision: Precision = "fp32") -> TextRefiner:
    graphs = precision_files(read_manifest(export), precision)
    model = ChatTTSOnnxModel(export, graphs, threads=THREADS)
    return TextRefiner(model, export, threads=THREADS)


def _torch_logits(
    monkeypatch: pytest.MonkeyPatch,
    *,
    greedy: bool = True,
    record: list[Any] | None = None,
) -> None:
    """Make ChatTTS's refine pass greedy (a last logits processor keeping only the argmax), and
    optionally record the logits it sees after the temperature (a first processor)."""
    import ChatTTS.core
    import torch

    original: Callable[..., Any] = ChatTTS.core.gen_logits

    def keep_best(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, -torch.inf)
        return out.scatter_(1, scores.argmax(1, keepdim=True), 0.0)

    def recorder(_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        assert record is not None
        record.append(scores.clone())
        return scores

    def patched(*args: Any, **kwargs: Any) -> tuple[list[Any], list[Any]]:
        warpers, processors = original(*args, **kwargs)
        first = [recorder] if record is not None else []
        last = [keep_best] if greedy else []
        return [*warpers, *last], [*first, *processors]

    monkeypatch.setattr(ChatTTS.core, "gen_logits", patched)


def _torch_params(chat: Any, prompt: str, max_new_token: int, **extra: Any) -> Any:
    return chat.RefineTextParams(
        prompt=prompt,
        min_new_token=1,
        max_new_token=max_new_token,
        show_tqdm=False,
        manual_seed=0,
        **extra,
    )


# -- prompt -------------------------------------------------------------------------------------


def test_prompt_equals_chattts(chat: Any) -> None:
    options = ChatTTSOptions(refine_text=True, oral_level=2, laugh_level=0, break_level=6)
    assert options.refine_prompt == PROMPT
    assert chat.speaker.decorate_text_prompts(list(TEXTS), PROMPT) == [
        text_prompt(t, PROMPT) for t in TEXTS
    ]
    assert text_prompt("hi") == "[Sbreak]hi[Pbreak]"
    params, budgets = engine_params(options, ["Hello.", "x" * 400])
    # The torch engine's choices: RefineTextParams' sampling defaults, its own token caps.
    defaults = chat.RefineTextParams()
    assert (params.temperature, params.top_p, params.top_k) == (
        defaults.temperature,
        defaults.top_P,
        defaults.top_K,
    )
    assert params.repetition_penalty == defaults.repetition_penalty == 1.0
    assert params.prompt == PROMPT and params.min_new_token == 1
    assert budgets == [2 * 6 + 32, 384] == [refine_budget("Hello."), refine_budget("x" * 400)]
    assert params.max_new_token == 384


# -- parity with ChatTTS (torch) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "max_new_token"),
    [(PROMPT, 60), ("", 60), (PROMPT, 3)],
    ids=["prompt-eos", "no-prompt-eos", "budget"],
)
def test_greedy_refined_ids_and_text_match_torch(
    export: Path, chat: Any, monkeypatch: pytest.MonkeyPatch, prompt: str, max_new_token: int
) -> None:
    """A batch of two texts (left padding), the KV cache, the text head and EOS or the budget
    ending the loop, against ChatTTS's own _refine_text and infer(refine_text_only=True)."""
    _torch_logits(monkeypatch)
    cleaner = TextCleaner(export / "homophones_map.json")
    cleaned = [cleaner(t) for t in TEXTS]
    reference = chat._refine_text(cleaned, chat.device, _torch_params(chat, prompt, max_new_token))
    torch_ids = [ids.numpy() for ids in reference.ids]
    torch_texts = chat.infer(
        list(TEXTS),
        refine_text_only=True,
        split_text=False,
        params_refine_text=_torch_params(chat, prompt, max_new_token),
    )

    refiner = _refiner(export)
    params = RefineParams(prompt=prompt, min_new_token=1, max_new_token=max_new_token, greedy=True)
    ids = refiner.generate(cleaned, params, seed=0)
    assert len(ids) == len(torch_ids) == 2
    for mine, theirs in zip(ids, torch_ids, strict=True):
        assert mine.tolist() == theirs.tolist()
        if max_new_token == 3:
            assert len(mine) == 3  # the budget ended it
        else:
            assert 1 <= len(mine) < max_new_token  # [Ebreak] ended it (excluded)
    assert refiner.refine(cleaned, params, seed=0) == torch_texts


def test_text_logits_match_torch_step_by_step(
    export: Path, chat: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text logits of every step (prefill included) for both rows, fed the same tokens."""
    import torch

    record: list[torch.Tensor] = []
    _torch_logits(monkeypatch, record=record)
    cleaner = TextCleaner(export / "homophones_map.json")
    cleaned = [cleaner(t) for t in TEXTS]
    params = _torch_params(chat, "", 30, temperature=1.0)
    reference = chat._refine_text(cleaned, chat.device, params)
    steps = len(record)
    assert steps == max(len(ids) for ids in reference.ids) + 1  # the EOS step has logits too

    refiner = _refiner(export)
    model = refiner._model  # white-box: feed torch's tokens through the ONNX graphs
    prompt = model.encode([text_prompt(t) for t in cleaned], None)
    mask = prompt.attention_mask
    positions = np.cumsum(mask, axis=1) - 1
    positions[mask == 0] = 1
    embeds, cache = prompt.embeds, model.new_cache(len(TEXTS))
    emb_text = np.load(export / "emb_text.npy")
    for step in range(steps):
        _codes, hidden = model.step(embeds, mask, positions, cache)
        (logits,) = refiner._head.run(None, {"hidden": hidden})
        expected = record[step].numpy()
        assert logits.shape == expected.shape == (2, refiner.num_text_tokens)
        assert np.abs(logits - expected).max() < 1e-4 * max(1.0, float(np.abs(expected).max()))
        picked = expected.argmax(axis=1)
        embeds = emb_text[picked][:, None, :]
        mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
        positions = mask.sum(axis=1, keepdims=True) - 1
    # The two texts reach the head as different hidden states (not trivially equal rows).
    assert not np.allclose(record[0][0].numpy(), record[0][1].numpy())


@pytest.mark.parametrize("vocab", [677, 21178])
def test_sampler_filters_text_logits_like_chattts(vocab: int) -> None:
    """The code loop's sampler with one row per text leaves the same candidates with the same
    scores as ChatTTS's refine processors (temperature 0.7, top-P 0.7, top-K 20, no penalty)."""
    import torch
    from ChatTTS.model.processors import gen_logits

    rng = np.random.default_rng(vocab)
    logits = (rng.standard_normal((4, vocab)) * 3).astype(np.float32)
    history = rng.integers(0, vocab, size=(4, 9)).astype(np.int64)
    warpers, processors = gen_logits(num_code=vocab, top_P=0.7, top_K=20, repetition_penalty=1.0)
    assert processors == []  # ChatTTS applies no penalty at its refine default
    scores = torch.from_numpy(logits) / torch.tensor([0.7])
    for process in warpers:
        scores = process(torch.from_numpy(history[:, :, None]), scores)
    expected = scores.numpy()

    sampler = CodeSampler(
        SamplingParams(temperature=0.7, repetition_penalty=1.0), num_vq=1, eos=vocab - 42, seed=0
    )
    got = sampler._top_p_k(sampler._penalize(logits / np.float32(0.7), history))
    kept = np.isfinite(expected)
    assert np.array_equal(np.isfinite(got), kept)
    assert np.allclose(got[kept], expected[kept], rtol=1e-6, atol=1e-6)


def test_decode_equals_chattts(export: Path, chat: Any) -> None:
    """ChatTTS's `i[i.less(break_0)]` then tokenizer.decode: specials kept or dropped alike,
    WordPiece pieces merged, transformers' space clean-up around punctuation."""
    refiner = _refiner(export)
    assert refiner.first_dropped == chat.tokenizer.break_0_ids
    assert refiner.eos == chat.tokenizer.eos_token
    vocab = chat.tokenizer.len
    punctuation = [
        chat.tokenizer._tokenizer.convert_tokens_to_ids(c) for c in "'.,?!" if c.isascii()
    ]
    rng = np.random.default_rng(7)
    cleaned_up = 0
    for _ in range(200):
        ids = rng.integers(0, vocab, size=int(rng.integers(0, 25)))
        ids[rng.random(ids.size) < 0.3] = rng.choice(punctuation)
        expected = chat.tokenizer.decode([ids[ids < chat.tokenizer.break_0_ids].tolist()])[0]
        got = refiner.decode(ids)
        assert got == expected, ids.tolist()
        raw = refiner._tokenizer.decode([int(i) for i in ids if i < refiner.first_dropped])
        cleaned_up += raw != got
    assert cleaned_up > 0  # the clean-up really ran on some samples


# -- the engine ---------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_engine_refines_then_speaks_finite_audio(export: Path, precision: Precision) -> None:
    engine = ChatTTSOnnxEngine(export, precision=precision, threads=THREADS)
    plain = ChatTTSOptions(seed=4)
    refined = ChatTTSOptions(seed=4, refine_text=True, oral_level=2, laugh_level=0, break_level=6)
    (unrefined,) = engine.synthesize("The front door is open.", None, plain)
    assert engine._loaded is not None and engine._loaded.refiner is None  # loaded on demand
    chunks = list(engine.synthesize("The front door is open.", None, refined))
    assert engine._loaded.refiner is not None
    assert len(chunks) == 1
    audio = chunks[0]
    assert audio.dtype == np.float32 and audio.size > 0 and np.isfinite(audio).all()
    assert np.abs(audio).max() <= 1.0
    assert not np.array_equal(audio, unrefined)  # the refined text reached the code loop
    (again,) = engine.synthesize("The front door is open.", None, refined)
    assert np.array_equal(again, audio)
    clips = engine.synthesize_batch(["Hi.", "?!", "晚饭准备好了。"], None, refined)
    assert clips[1].size == 0 and clips[0].size > 0 and clips[2].size > 0
    engine.unload()
    assert not engine.loaded


def test_head_text_is_verified_and_in_the_identity(export: Path, tmp_path: Path) -> None:
    precisions: tuple[Precision, ...] = ("fp32", "int8")
    for precision in precisions:
        files = ChatTTSOnnxEngine(export, precision=precision).files()
        assert {"head_text.onnx", "head_text.onnx.data"} <= set(files)
    assert "head_text" not in read_manifest(export)["variants"]["int8"]  # FP32 in both
    copy = tmp_path / "export"
    shutil.copytree(export, copy)
    before = ChatTTSOnnxEngine(copy, precision="int8").identity
    with (copy / "head_text.onnx.data").open("ab") as handle:
        handle.write(b"\0")
    engine = ChatTTSOnnxEngine(copy, precision="int8")
    with pytest.raises(EngineError, match=r"head_text\.onnx\.data: sha256 mismatch"):
        engine.load()
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["head_text.onnx.data"] = sha256_file(copy / "head_text.onnx.data")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert ChatTTSOnnxEngine(copy, precision="int8").identity != before


def test_engine_refines_without_importing_torch(export: Path) -> None:
    code = """
import sys
from pathlib import Path
from tts_bridge.engines.chattts.common import ChatTTSOptions
from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
sizes = {}
for precision in ("fp32", "int8"):
    engine = ChatTTSOnnxEngine(Path(sys.argv[1]), precision=precision)
    speaker = engine.sample_speaker(1)
    options = ChatTTSOptions(seed=2, refine_text=True, oral_level=3, break_level=4)
    chunks = list(engine.synthesize("Dinner is ready.", speaker, options))
    sizes[precision] = sum(c.size for c in chunks)
    assert engine._loaded.refiner is not None
report = {"sizes": sizes}
"""
    report = run_torch_free(code, str(export))
    assert report["heavy"] == []
    assert report["sizes"]["fp32"] > 0 and report["sizes"]["int8"] > 0
