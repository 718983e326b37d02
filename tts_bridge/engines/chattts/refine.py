"""ChatTTS's refine pass on ONNX Runtime: the text rewrite before the audio codes, without torch.

Reproduces ChatTTS 0.2.5 ``Chat._refine_text`` (``GPT.generate`` with ``infer_text=True``) and
what ``Chat._infer`` does with its result:

* prompt ``[Sbreak]{text}[Pbreak]{prompt}`` (``Speaker.decorate_text_prompts``: the
  ``[oral_N][laugh_N][break_N]`` tags of RefineTextParams come *after* ``[Pbreak]``), tokenized
  and embedded like a code prompt without a speaker (left padding, position ids
  ``cumsum(mask) - 1``);
* each step: the same GPT step graph as the code loop (its code logits are not used), then
  ``head_text.onnx`` on the last hidden state for logits over every text token; logits /
  temperature, repetition penalty (off at ChatTTS's default 1.0), top-P then top-K (each keeping
  at least 3), ``[Ebreak]`` forbidden before ``min_new_token``, one sample. ChatTTS suppresses no
  other token while sampling: control tokens may be generated and are only dropped afterwards;
* ``[Ebreak]`` ends a text (it is not part of the result); the next step's input is the sampled
  token's text embedding;
* the result keeps only ids below ``[break_0]`` (ChatTTS's ``i[i.less(break_0_ids)]``: the
  ``[break_N]``, ``[laugh_N]``, ``[oral_N]`` and ``[speed_N]`` tokens go, ``[uv_break]``,
  ``[laugh]`` and the like stay) and is decoded as ``BertTokenizerFast.batch_decode`` does with
  ChatTTS's arguments: special tokens kept, tokens joined by spaces (WordPiece ``##`` pieces
  merged), then transformers' ``clean_up_tokenization`` when ``tokenizer_config.json`` asks for
  it (transformers' default is off).

The engine speaks the decoded text as ChatTTS does: it goes into the code prompt as it is,
without a second clean-up.

Differences from ChatTTS, by design:

* Sampling uses numpy's generator (the code loop's ``CodeSampler``), so a seed repeats the
  refined text here but does not give torch's text; greedy decoding gives identical tokens
  (see the parity tests). ChatTTS also re-seeds its generator before every draw; here the
  generator runs on from step to step.
* A repetition penalty other than 1.0 is applied per text over its last 16 tokens. ChatTTS's
  processor gets the text ids as (batch, steps, 1) there and fails (or, at batch 1, broadcasts
  into the wrong shape); the engine uses 1.0, ChatTTS's default, like the torch engine.

``head_text.onnx`` stays FP32 in both precisions (quantization writes INT8 graphs for the GPT
only); the engine loads it on the first refined request, after ``files()`` verified it at load.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tts_bridge.engines.base import EngineError, check_interrupt
from tts_bridge.engines.chattts.common import ChatTTSOptions
from tts_bridge.engines.chattts.onnx_format import EMB_TEXT_FILE, HEAD_TEXT_FILE, TOKENIZER_DIR
from tts_bridge.engines.chattts.onnx_model import (
    ChatTTSOnnxModel,
    CodeSampler,
    SamplingParams,
    session_options,
)
from tts_bridge.textlog import short, size

__all__ = [
    "EOS_TOKEN",
    "FIRST_DROPPED_TOKEN",
    "MAX_NEW_TOKEN",
    "RefineParams",
    "TextRefiner",
    "clean_up_tokenization",
    "engine_params",
    "refine_budget",
    "text_prompt",
]

_LOGGER = logging.getLogger(__name__)

EOS_TOKEN = "[Ebreak]"
FIRST_DROPPED_TOKEN = "[break_0]"
"""Refined ids from this one on are dropped (ChatTTS: ``i[i.less(tokenizer.break_0_ids)]``)."""
MAX_NEW_TOKEN = 384
"""RefineTextParams' default cap on refined tokens."""


@dataclass(frozen=True)
class RefineParams:
    """ChatTTS's RefineTextParams that shape the refine pass (its defaults)."""

    prompt: str = ""
    """Tags after ``[Pbreak]``, e.g. ``[oral_2][laugh_0][break_6]``."""
    temperature: float = 0.7
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.0
    min_new_token: int = 0
    max_new_token: int = MAX_NEW_TOKEN
    greedy: bool = False
    """Take the most likely token instead of sampling (after penalty, top-P/K and EOS rules)."""


def text_prompt(text: str, prompt: str = "") -> str:
    """ChatTTS's Speaker.decorate_text_prompts for one text."""
    return f"[Sbreak]{text}[Pbreak]{prompt}"


def refine_budget(text: str) -> int:
    """The torch engine's cap on refined tokens for ``text`` (its ``_generate``): the refiner
    re-emits the text with a few tags, so ChatTTS's fixed 384 would let it ramble."""
    return min(MAX_NEW_TOKEN, 2 * len(text) + 32)


def engine_params(options: ChatTTSOptions, texts: Sequence[str]) -> tuple[RefineParams, list[int]]:
    """What the torch engine passes ChatTTS for ``options`` (RefineTextParams' sampling
    defaults, the options' prompt tags, at least one token) and each text's token budget."""
    budgets = [refine_budget(t) for t in texts]
    params = RefineParams(
        prompt=options.refine_prompt,
        min_new_token=1,
        max_new_token=max(budgets, default=1),
    )
    return params, budgets


def clean_up_tokenization(text: str) -> str:
    """transformers' ``PreTrainedTokenizerBase.clean_up_tokenization``, verbatim."""
    return (
        text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
    )


class TextRefiner:
    """The refine pass over a loaded ``ChatTTSOnnxModel``; not thread-safe (the engine's lock).

    Loads ``head_text.onnx``, its own view of ``emb_text.npy`` (memory-mapped: only the rows of
    generated tokens are read) and the tokenizer. ``folder``'s files must have been verified.
    """

    def __init__(
        self,
        model: ChatTTSOnnxModel,
        folder: Path,
        *,
        threads: int = 1,
        arena: bool = True,
        spinning: bool = True,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self._model = model
        try:
            self._head = ort.InferenceSession(
                str(folder / HEAD_TEXT_FILE),
                session_options(threads, arena=arena, spinning=spinning),
                ["CPUExecutionProvider"],
            )
        except Exception as exc:  # onnxruntime raises its own untyped exception classes
            raise EngineError(f"onnxruntime cannot load {folder / HEAD_TEXT_FILE}: {exc}") from exc
        self._emb_text = np.load(folder / EMB_TEXT_FILE, mmap_mode="r", allow_pickle=False)
        tokenizer_dir = folder / TOKENIZER_DIR
        self._tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.eos = self._token_id(EOS_TOKEN)
        self.first_dropped = self._token_id(FIRST_DROPPED_TOKEN)
        self._cleanup = _clean_up_spaces(tokenizer_dir / "tokenizer_config.json")
        self.num_text_tokens = int(self._emb_text.shape[0])
        width = self._head.get_outputs()[0].shape[-1]
        if isinstance(width, int) and width != self.num_text_tokens:
            raise EngineError(
                f"{folder}: {HEAD_TEXT_FILE} has {width} outputs, "
                f"{EMB_TEXT_FILE} {self.num_text_tokens} rows"
            )

    def _token_id(self, token: str) -> int:
        found = self._tokenizer.token_to_id(token)
        if found is None:
            raise EngineError(f"the ChatTTS tokenizer has no {token} token")
        return int(found)

    def refine(
        self,
        texts: Sequence[str],
        params: RefineParams,
        seed: int,
        budgets: Sequence[int] | None = None,
    ) -> list[str]:
        """Refined versions of ``texts`` (already cleaned), as ChatTTS hands them to the code
        pass. ``budgets`` optionally caps each text below ``params.max_new_token``."""
        try:
            ids = self.generate(texts, params, seed, budgets)
        except EngineError:
            raise
        except Exception as exc:  # onnxruntime's errors have no common public base class
            raise EngineError(f"ChatTTS ONNX refine failed on {size(texts[0])}: {exc}") from exc
        refined = [self.decode(row) for row in ids]
        for before, after in zip(texts, refined, strict=True):
            _LOGGER.debug("ChatTTS ONNX refined %s -> %s", short(before), short(after))
        return refined

    def generate(
        self,
        texts: Sequence[str],
        params: RefineParams,
        seed: int,
        budgets: Sequence[int] | None = None,
    ) -> list[npt.NDArray[np.int64]]:
        """ChatTTS's ``_refine_text``: each text's generated token ids, ``[Ebreak]`` excluded."""
        model = self._model
        batch = len(texts)
        row_budget = np.full(batch, params.max_new_token, dtype=np.int64)
        if budgets is not None:
            row_budget = np.minimum(row_budget, np.asarray(budgets, dtype=np.int64))
        sampler = CodeSampler(
            SamplingParams(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                repetition_penalty=params.repetition_penalty,
                min_new_token=params.min_new_token,
                max_new_token=params.max_new_token,
                greedy=params.greedy,
            ),
            num_vq=1,
            eos=self.eos,
            seed=seed,
        )
        prompt = model.encode([text_prompt(t, params.prompt) for t in texts], None)
        mask = prompt.attention_mask
        positions = np.cumsum(mask, axis=1) - 1
        positions[mask == 0] = 1
        embeds = prompt.embeds
        cache = model.new_cache(batch)
        tokens = np.zeros((batch, params.max_new_token), dtype=np.int64)
        lengths = np.zeros(batch, dtype=np.int64)
        finished = row_budget <= 0
        for step in range(params.max_new_token):
            check_interrupt()
            _code_logits, hidden = model.step(embeds, mask, positions, cache)
            (logits,) = self._head.run(None, {"hidden": np.ascontiguousarray(hidden)})
            picked = sampler(np.asarray(logits, dtype=np.float32), tokens[:, :step], step)
            tokens[:, step] = picked
            finished |= picked == self.eos
            lengths += ~finished
            finished |= lengths >= row_budget
            if finished.all():
                break
            embeds = np.asarray(self._emb_text[picked], dtype=np.float32)[:, None, :]
            mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
            positions = mask.sum(axis=1, keepdims=True) - 1
        return [tokens[row, : lengths[row]].copy() for row in range(batch)]

    def decode(self, ids: npt.NDArray[np.int64] | Sequence[int]) -> str:
        """Refined ids -> text as ChatTTS's ``_infer`` decodes them (see the module docs)."""
        kept = [int(i) for i in ids if int(i) < self.first_dropped]
        text: str = self._tokenizer.decode(kept, skip_special_tokens=False)
        return clean_up_tokenization(text) if self._cleanup else text


def _clean_up_spaces(config_path: Path) -> bool:
    """The tokenizer's ``clean_up_tokenization_spaces`` (transformers' default: False)."""
    try:
        config: Any = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineError(f"{config_path}: unreadable ({exc})") from exc
    if not isinstance(config, dict):
        raise EngineError(f"{config_path}: expected a JSON object")
    return bool(config.get("clean_up_tokenization_spaces", False))
