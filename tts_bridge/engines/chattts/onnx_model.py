"""The loaded ChatTTS ONNX export and its code loop, in numpy around onnxruntime sessions.

``ChatTTSOnnxModel`` holds one export's sessions, embeddings and tokenizer and reproduces
ChatTTS 0.2.5's ``Chat._infer_code`` and ``GPT.generate``:

* prompt ``[Stts][spk_emb][speed_N]{text}[Ptts]`` (``[empty_spk]`` without a speaker), left
  padded, position ids ``cumsum(mask) - 1``; the speaker vector, L2-normalised in float16 as
  ChatTTS does, replaces the embedding at ``[spk_emb]``;
* each step (``CodeSampler``): logits / per-codebook temperature, repetition penalty over the
  last codes, top-P then top-K (each keeping at least 3), EOS forbidden before
  ``min_new_token``, softmax, one sample per codebook; EOS on any codebook ends that text and
  drops its hidden state;
* the keys and values stay in a two-part ``KVCache`` bound to the GPT step graph, so a step
  copies only the recent part (the exporter's docs say why);
* the hidden states of every step (the prefill's last position included) are decoded to audio
  (``onnx_stream``).

Sampling uses numpy's generator, so a seed gives repeatable audio here but not the same audio as
torch's sampler; under greedy decoding both produce identical codes (see the parity tests).
``TextCleaner`` is ChatTTS's text clean-up without its torch import. onnxruntime and
``tokenizers`` are imported when a model is built, never at import time.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tts_bridge.engines.base import EngineError, FloatAudio, check_interrupt, record_stage
from tts_bridge.engines.chattts.common import read_json
from tts_bridge.engines.chattts.onnx_format import (
    CONFIG_FILE,
    EMB_CODE_FILE,
    EMB_TEXT_FILE,
    HOMOPHONES_FILE,
    TOKENIZER_DIR,
    WINDOW_FILE,
    loaded_roles,
)
from tts_bridge.engines.chattts.onnx_stream import (
    Reach,
    StatefulStreamingDecoder,
    StreamingDecoder,
    StreamStage,
    istft,
    measure_reach,
)
from tts_bridge.engines.chattts.speaker import decode_spk_emb
from tts_bridge.engines.onnx_voice import options_for

__all__ = [
    "FOLD_EVERY",
    "MIN_TOKENS_TO_KEEP",
    "PENALTY_WINDOW",
    "REPETITION_PENALTY",
    "ChatTTSOnnxModel",
    "CodeSampler",
    "Generated",
    "KVCache",
    "Prompt",
    "SamplingParams",
    "StepTimes",
    "TextCleaner",
    "code_prompt",
    "normalized_speaker",
    "session_options",
]

_LOGGER = logging.getLogger(__name__)

# ChatTTS's sampling constants (ChatTTS/model/processors.py and core.py).
PENALTY_WINDOW = 16
MIN_TOKENS_TO_KEEP = 3
REPETITION_PENALTY = 1.05

# -- text clean-up (ChatTTS's Normalizer, no torch) ---------------------------------------------


class TextCleaner:
    """ChatTTS's ``Normalizer.__call__`` with no language normalizer registered (as the engines
    use it): full-width punctuation for Chinese, punctuation folding and deletion of characters
    the model never saw, homophone replacement. ChatTTS's own class imports torch.
    """

    _REJECT = re.compile(r"[^\u4e00-\u9fffA-Za-z，。、,\. ]")
    _TAG = re.compile(r"\[[\w_]+\]")
    _CJK = re.compile(r"[\u4e00-\u9fff]")
    _ENGLISH_WORD = re.compile(r"\b[A-Za-z]+\b")
    _SIMPLIFY = str.maketrans(
        {
            **dict.fromkeys("：；（）【】『』「」《》－", "，"),
            "！": "。",
            **dict.fromkeys(":;()><-", ","),
            "!": ".",
        }
    )
    _FULL_WIDTH = str.maketrans(
        {
            "!": "！", '"': "“", "'": "‘", "#": "＃", "$": "＄", "%": "％", "&": "＆",
            "(": "（", ")": "）", ",": "，", "-": "－", "*": "＊", "+": "＋", ".": "。",
            "/": "／", ":": "：", ";": "；", "<": "＜", "=": "＝", ">": "＞", "?": "？",
            "@": "＠", "\\": "＼", "^": "＾", "`": "｀", "{": "｛", "|": "｜", "}": "｝",
            "~": "～",
        }
    )  # fmt: skip

    def __init__(self, homophones: Path) -> None:
        try:
            table = json.loads(homophones.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise EngineError(f"{homophones}: unreadable ({exc})") from exc
        # ChatTTS replaces UTF-16 code units, so only characters of the basic plane ever match.
        self._homophones = str.maketrans(
            {k: v for k, v in table.items() if ord(k) <= 0xFFFF and ord(v) <= 0xFFFF}
        )

    def __call__(self, text: str) -> str:
        chinese = len(self._CJK.findall(text))
        if chinese > len(self._ENGLISH_WORD.findall(text)):
            text = text.translate(self._FULL_WIDTH)
        invalid = set(self._REJECT.findall(self._TAG.sub("", text)))
        if invalid:
            text = text.translate(self._SIMPLIFY)
        text = text.translate(self._homophones)
        if invalid:
            texts, tags = _split_tags(text)
            texts = [self._REJECT.sub("", t) for t in texts]
            text = _combine_tags(texts, tags) if tags else texts[0]
        return text


def _split_tags(text: str) -> tuple[list[str], list[str]]:
    """ChatTTS's _split_tags, quirks included (an unclosed tag is lost, a stray ']' adds '')."""
    texts: list[str] = []
    tags: list[str] = []
    current_text = ""
    current_tag = ""
    for c in text:
        if c == "[":
            texts.append(current_text)
            current_text = ""
            current_tag = c
        elif current_tag != "":
            current_tag += c
        else:
            current_text += c
        if c == "]":
            tags.append(current_tag)
            current_tag = ""
    if current_text != "":
        texts.append(current_text)
    return texts, tags


def _combine_tags(texts: list[str], tags: list[str]) -> str:
    out = ""
    for t in texts:
        out += t + (tags.pop(0) if tags else "")
    return out


def code_prompt(text: str, speed_level: int, with_speaker: bool) -> str:
    """ChatTTS's Speaker.decorate_code_prompts for one text (no text sample)."""
    for tag in ("[Stts]", "[spk_emb]", "[empty_spk]"):
        text = text.replace(tag, "")
    speaker = "[spk_emb]" if with_speaker else "[empty_spk]"
    return f"[Stts]{speaker}[speed_{speed_level}]{text.strip()}[Ptts]"


def normalized_speaker(spk_emb: str, hidden_size: int) -> npt.NDArray[np.float32]:
    """The vector ChatTTS writes at [spk_emb]: F.normalize of the float16 embedding, in float16.

    torch normalises a float16 tensor in float16 (the norm accumulates in float32 and is rounded
    to float16, then each value is divided and rounded); the result is widened to float32 when it
    is written into the float32 embeddings.
    """
    values = decode_spk_emb(spk_emb, hidden_size)
    if values.size != hidden_size:
        raise EngineError(f"spk_emb has {values.size} values, this model needs {hidden_size}")
    wide = values.astype(np.float32)
    norm = np.float16(np.sqrt(np.sum(wide * wide, dtype=np.float32)))
    norm = max(norm, np.float16(np.finfo(np.float16).tiny))
    return (wide / np.float32(norm)).astype(np.float16).astype(np.float32)


# -- sampling -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """ChatTTS's InferCodeParams that shape sampling (its defaults)."""

    temperature: float | tuple[float, ...] = 0.3
    """One temperature, or one per codebook."""
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = REPETITION_PENALTY
    min_new_token: int = 0
    max_new_token: int = 2048
    greedy: bool = False
    """Take the most likely code instead of sampling (after penalty, top-P/K and EOS rules)."""


class CodeSampler:
    """One step of ChatTTS's logits pipeline in numpy, on (rows = batch x num_vq, codes)."""

    def __init__(self, params: SamplingParams, num_vq: int, eos: int, seed: int) -> None:
        temps = params.temperature
        per_vq = (temps,) * num_vq if isinstance(temps, int | float) else tuple(temps)
        if len(per_vq) != num_vq or min(per_vq) <= 0:
            raise ValueError(f"need {num_vq} positive temperatures, got {temps}")
        self._temperature = np.asarray(per_vq, dtype=np.float32)
        self._params = params
        self._eos = eos
        self._rng = np.random.default_rng(seed)

    def __call__(
        self, logits: npt.NDArray[np.float32], history: npt.NDArray[np.int64], step: int
    ) -> npt.NDArray[np.int64]:
        """Next code per row; ``history`` (rows, generated so far) feeds the penalty."""
        rows, codes = logits.shape
        scores = logits / np.tile(self._temperature, rows // self._temperature.size)[:, None]
        scores = self._penalize(scores, history)
        scores = self._top_p_k(scores)
        if step < self._params.min_new_token:
            scores[:, self._eos] = -np.inf
        if self._params.greedy:
            best: npt.NDArray[np.int64] = np.argmax(scores, axis=1).astype(np.int64)
            return best
        shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs = shifted / shifted.sum(axis=1, keepdims=True)
        cumulative = np.cumsum(probs, axis=1)
        draws = self._rng.random(rows) * cumulative[:, -1]
        picked: npt.NDArray[np.int64] = (cumulative <= draws[:, None]).sum(axis=1)
        # Rounding can leave the last cumulative sum a hair below a draw: clamp to a real code.
        clamped: npt.NDArray[np.int64] = np.minimum(picked, codes - 1).astype(np.int64)
        return clamped

    def _penalize(
        self, scores: npt.NDArray[np.float32], history: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        penalty = self._params.repetition_penalty
        if penalty == 1.0 or history.shape[1] == 0:
            return scores
        window = history[:, -PENALTY_WINDOW:]
        freq = np.zeros(scores.shape, dtype=np.float32)
        np.add.at(freq, (np.arange(scores.shape[0])[:, None], window), 1.0)
        alpha = np.power(np.float32(penalty), freq)
        return np.where(scores < 0, scores * alpha, scores / alpha).astype(np.float32)

    def _top_p_k(self, scores: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """transformers' TopPLogitsWarper then TopKLogitsWarper (each keeping >= 3 codes).

        Top-P keeps a code when the probability of the codes ranked above it is below P; top-K
        then keeps the K best of those. Both keep a prefix of the ranking, so only the K best
        codes need sorting (ChatTTS sorts all 626 per row; the same codes survive).
        """
        codes = scores.shape[1]
        k = min(max(self._params.top_k, MIN_TOKENS_TO_KEEP), codes)
        candidates = np.argpartition(scores, codes - k, axis=1)[:, codes - k :]
        values = np.take_along_axis(scores, candidates, axis=1)
        order = np.argsort(-values, axis=1, kind="stable")
        ranked = np.take_along_axis(candidates, order, axis=1)
        best = np.take_along_axis(values, order, axis=1)
        peak = best[:, :1]
        probs = np.exp(best - peak) / np.exp(scores - peak).sum(axis=1, keepdims=True)
        above = np.cumsum(probs, axis=1) - probs
        keep = above < np.float32(self._params.top_p)
        keep[:, :MIN_TOKENS_TO_KEEP] = True
        out = np.full_like(scores, -np.inf)
        kept = np.where(keep, ranked, ranked[:, :1])  # dropped slots repeat the best code
        np.put_along_axis(out, kept, np.take_along_axis(scores, kept, axis=1), axis=1)
        return out


# -- the model ----------------------------------------------------------------------------------


@dataclass
class Generated:
    """One text's result of the code loop: its codes and the hidden state of each step."""

    codes: npt.NDArray[np.int64]
    """(steps, num_vq) audio codes, EOS step excluded."""
    hiddens: npt.NDArray[np.float32]
    """(steps, hidden) GPT hidden states that produced ``codes``."""


@dataclass
class Prompt:
    """Left-padded prompt embeddings for a batch of texts."""

    input_ids: npt.NDArray[np.int64]
    embeds: npt.NDArray[np.float32]
    attention_mask: npt.NDArray[np.int64]


@dataclass
class StepTimes:
    """Where the time of the last generation went (seconds), for the benchmark."""

    gpt: float = 0.0
    sampling: float = 0.0
    steps: int = 0
    prefill: float = 0.0
    """The first step's GPT time (the whole prompt at once), also counted in ``gpt``."""


def session_options(threads: int, *, arena: bool = True, spinning: bool = True) -> Any:
    """onnxruntime session options: intra-op ``threads``, inter-op 1, sequential execution;
    the ones every ONNX voice gets (``engines.onnx_voice``, where spinning is explained)."""
    return options_for(threads, spinning=spinning, arena=arena)


class ChatTTSOnnxModel:
    """The loaded graphs, embeddings and tokenizer of one export; not thread-safe."""

    def __init__(
        self,
        folder: Path,
        graphs: Mapping[str, str],
        *,
        threads: int = 1,
        arena: bool = True,
        spinning: bool = True,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        config = read_json(folder / CONFIG_FILE)
        try:
            self.hidden_size = int(config["hidden_size"])
            self.num_layers = int(config["num_hidden_layers"])
            self.num_heads = int(config["num_attention_heads"])
            self.head_dim = int(config["head_dim"])
            self.num_vq = int(config["num_vq"])
            self.num_codes = int(config["num_audio_tokens"])
            self.hop_length = int(config["hop_length"])
            self.n_fft = int(config["n_fft"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{folder / CONFIG_FILE}: missing or bad field {exc}") from exc
        self.eos = self.num_codes - 1
        options = session_options(threads, arena=arena, spinning=spinning)
        providers = ["CPUExecutionProvider"]
        try:
            self._gpt = ort.InferenceSession(str(folder / graphs["gpt"]), options, providers)
            self._decoder: Any = None
            self._vocos: Any = None
            self._stream_stages: tuple[StreamStage, StreamStage] | None = None
            if "decoder" in loaded_roles(graphs):
                self._decoder = ort.InferenceSession(
                    str(folder / graphs["decoder"]), options, providers
                )
                self._vocos = ort.InferenceSession(
                    str(folder / graphs["vocos"]), options, providers
                )
                self._mels = int(self._vocos.get_inputs()[0].shape[1])
            else:
                self._stream_stages = (
                    StreamStage(
                        ort.InferenceSession(
                            str(folder / graphs["decoder_stream"]), options, providers
                        ),
                        frames_per_input=2,
                    ),
                    StreamStage(
                        ort.InferenceSession(
                            str(folder / graphs["vocos_stream"]), options, providers
                        ),
                        frames_per_input=1,
                    ),
                )
                self._mels = self._stream_stages[1].channels[0]
        except Exception as exc:  # onnxruntime raises its own untyped exception classes
            raise EngineError(f"onnxruntime cannot load {folder}: {exc}") from exc
        # The text table is large and only a prompt's rows are read: leave it on disk.
        self._emb_text = np.load(folder / EMB_TEXT_FILE, mmap_mode="r", allow_pickle=False)
        self._emb_code = np.load(folder / EMB_CODE_FILE, allow_pickle=False)
        self.window: npt.NDArray[np.float32] = np.load(
            folder / WINDOW_FILE, allow_pickle=False
        ).astype(np.float32)
        self._tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_DIR / "tokenizer.json"))
        spk_id = self._tokenizer.token_to_id("[spk_emb]")
        if spk_id is None:
            raise EngineError(f"{folder}: the tokenizer has no [spk_emb] token")
        self.spk_emb_id = int(spk_id)
        self.cleaner = TextCleaner(folder / HOMOPHONES_FILE)
        self._step = _BoundGptStep(
            self._gpt,
            [i.name for i in self._gpt.get_inputs()],
            [o.name for o in self._gpt.get_outputs()],
        )
        self.times = StepTimes()
        self._reach: tuple[Reach, Reach] | None = None

    # -- prompt -----------------------------------------------------------------------------

    def encode(self, prompts: Sequence[str], spk_emb: str | None) -> Prompt:
        """Tokenize and embed ChatTTS prompts (left padding); insert the speaker vector."""
        ids = [self._tokenizer.encode(p, add_special_tokens=False).ids for p in prompts]
        width = max(len(i) for i in ids)
        input_ids = np.zeros((len(ids), width), dtype=np.int64)
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for row, row_ids in enumerate(ids):
            input_ids[row, width - len(row_ids) :] = row_ids
            mask[row, width - len(row_ids) :] = 1
        embeds = np.asarray(self._emb_text[input_ids], dtype=np.float32)
        # ChatTTS's Embed treats every position outside its text mask, padding included, as
        # audio codes (all code 0 here). Masked out either way; kept equal to torch's inputs.
        embeds[mask == 0] = self._emb_code[:, 0].sum(axis=0)
        if spk_emb is not None:
            vector = normalized_speaker(spk_emb, self.hidden_size)
            embeds[input_ids == self.spk_emb_id] = vector
        return Prompt(input_ids, embeds, mask)

    def embed_codes(self, codes: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """(B, num_vq) codes -> (B, hidden): the sum of the codebooks' embeddings."""
        picked = self._emb_code[np.arange(self.num_vq)[None, :], codes]
        return np.asarray(picked.sum(axis=1), dtype=np.float32)

    # -- the code loop ----------------------------------------------------------------------

    def new_cache(self, batch: int) -> KVCache:
        """An empty KV cache for ``batch`` rows (what the prefill step starts from)."""
        return KVCache(batch, self.num_layers, self.num_heads, self.head_dim)

    def step(
        self,
        embeds: npt.NDArray[np.float32],
        attention_mask: npt.NDArray[np.int64],
        position_ids: npt.NDArray[np.int64],
        cache: KVCache,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """One GPT step: logits (B, num_vq, codes) and hidden state (B, H); extends ``cache``.

        ``attention_mask`` covers the cached positions and the new ones.
        """
        return self._step(embeds, attention_mask, position_ids, cache)

    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams,
        seed: int,
        budgets: Sequence[int] | None = None,
    ) -> list[Generated]:
        """ChatTTS's GPT.generate for audio codes with return_hidden=True.

        ``budgets`` optionally caps each row below ``params.max_new_token`` (a batched short
        text then ends at its own budget instead of running as long as its longest mate).
        """
        steps = self.generate_steps(prompt, params, seed, budgets)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                results: list[Generated] = done.value
                return results

    def generate_steps(
        self,
        prompt: Prompt,
        params: SamplingParams,
        seed: int,
        budgets: Sequence[int] | None = None,
    ) -> Generator[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]], None, list[Generated]]:
        """``generate`` one step at a time, for streaming: after each step it yields each row's
        code count so far and the (batch, max_new_token, hidden) hidden-state buffer (row r's
        first count[r] states are final); it returns what ``generate`` returns.

        The time spent between steps is the caller's and is not counted in ``times``.
        """
        batch = prompt.embeds.shape[0]
        row_budget = np.full(batch, params.max_new_token, dtype=np.int64)
        if budgets is not None:
            row_budget = np.minimum(row_budget, np.asarray(budgets, dtype=np.int64))
        sampler = CodeSampler(params, self.num_vq, self.eos, seed)
        mask = prompt.attention_mask
        positions = np.cumsum(mask, axis=1) - 1
        positions[mask == 0] = 1
        embeds = prompt.embeds
        cache = self.new_cache(batch)
        codes = np.zeros((batch, params.max_new_token, self.num_vq), dtype=np.int64)
        hiddens = np.zeros((batch, params.max_new_token, self.hidden_size), dtype=np.float32)
        lengths = np.zeros(batch, dtype=np.int64)
        finished = np.zeros(batch, dtype=bool)
        times = self.times = StepTimes()  # live: a streaming caller may read it mid-loop
        for step in range(params.max_new_token):
            check_interrupt()  # background work gives way to a live request within one step
            started = time.perf_counter()
            logits, hidden = self._step(embeds, mask, positions, cache)
            between = time.perf_counter()
            hiddens[:, step] = hidden
            # (B, num_vq, steps) -> (B*num_vq, steps): ChatTTS's logits_token row order.
            # Only the penalty window: copying all codes so far made each step grow with it.
            recent = codes[:, max(0, step - PENALTY_WINDOW) : step]
            history = recent.transpose(0, 2, 1).reshape(batch * self.num_vq, recent.shape[1])
            flat = logits.reshape(batch * self.num_vq, self.num_codes)
            picked = sampler(flat, history, step).reshape(batch, self.num_vq)
            codes[:, step] = picked
            finished |= (picked == self.eos).any(axis=1)
            lengths += ~finished
            finished |= lengths >= row_budget
            times.gpt += between - started
            if step == 0:
                times.prefill = between - started
            done = time.perf_counter()
            times.sampling += done - between
            record_stage("prefill" if step == 0 else "codes", done - started)
            times.steps += 1
            yield lengths.copy(), hiddens
            if finished.all():
                break
            embeds = self.embed_codes(picked)[:, None, :]
            mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
            positions = mask.sum(axis=1, keepdims=True) - 1
        else:
            _LOGGER.debug("code loop hit max_new_token %d", params.max_new_token)
        return [
            Generated(codes[row, : lengths[row]].copy(), hiddens[row, : lengths[row]].copy())
            for row in range(batch)
        ]

    # -- decoding ---------------------------------------------------------------------------

    def spectrum(
        self, hiddens: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """(steps, hidden) -> Vocos magnitude and phase, each (1, n_fft/2 + 1, 2 x steps)."""
        batch = np.ascontiguousarray(hiddens.T[None, :, :], dtype=np.float32)
        return self.run_vocos(self.run_decoder(batch))

    def run_decoder(self, hidden: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The decoder, one shot: (1, hidden, steps) -> mel (1, mels, 2 x steps)."""
        started = time.perf_counter()
        if self._stream_stages is not None:
            (mel,) = self._stream_stages[0].once(hidden)
        else:
            (mel,) = self._decoder.run(None, {"hidden": hidden})
        record_stage("decoder", time.perf_counter() - started)
        return _as_float32(mel)

    def run_vocos(
        self, mel: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Vocos, one shot: mel (1, mels, frames) -> magnitude and phase, each
        (1, n_fft/2 + 1, frames)."""
        started = time.perf_counter()
        if self._stream_stages is not None:
            magnitude, phase = self._stream_stages[1].once(mel)
        else:
            magnitude, phase = self._vocos.run(None, {"mel": mel})
        record_stage("vocoder", time.perf_counter() - started)
        return _as_float32(magnitude), _as_float32(phase)

    def decode(self, hiddens: npt.NDArray[np.float32]) -> FloatAudio:
        """Hidden states of one text -> waveform (ChatTTS's _decode_to_wavs for one text)."""
        if hiddens.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        magnitude, phase = self.spectrum(hiddens)
        return istft(magnitude[0], phase[0], self.window, self.hop_length)

    @property
    def reach(self) -> tuple[Reach, Reach]:
        """The decoder's and Vocos's reach in mel frames (two per code), measured on first use
        (a few decodes of a long probe; the engine does it at load)."""
        if self._reach is None:
            decoder = measure_reach(
                lambda hidden: (self.run_decoder(hidden),), self.hidden_size, 2, inputs=96
            )
            vocos = measure_reach(self.run_vocos, self._mels, 1)
            self._reach = (decoder, vocos)
        return self._reach

    @property
    def has_stream_graphs(self) -> bool:
        """Whether the export has the streaming step graphs (``StatefulStreamingDecoder``)."""
        return self._stream_stages is not None

    def stream_decoder(self) -> StreamingDecoder | StatefulStreamingDecoder:
        """A decoder for one text whose hidden states arrive while they are generated: the
        stateful one when the export has the streaming graphs, else the windowed one."""
        if self._stream_stages is not None:
            decoder, vocos = self._stream_stages
            return StatefulStreamingDecoder(decoder.start(), vocos.start(), self)
        return StreamingDecoder(self)


FOLD_EVERY = 32
"""Steps the recent KV part may grow before it is folded into the settled part: each step
copies the recent part once (in the graph) and each fold copies the settled part once, so a few
dozen balances the two for generations of a few hundred steps."""


class KVCache:
    """Per-layer keys and values in the GPT graph's two parts (see the exporter's docs).

    ``settled`` holds numpy arrays read in place by onnxruntime; ``recent`` holds the last
    step's ``present`` outputs, still onnxruntime's own tensors, until they are folded.
    """

    def __init__(self, batch: int, layers: int, heads: int, head_dim: int) -> None:
        empty = np.zeros((batch, heads, 0, head_dim), dtype=np.float32)
        self.settled: list[npt.NDArray[np.float32]] = [empty] * (2 * layers)
        self.recent: list[Any] = [empty] * (2 * layers)

    @property
    def length(self) -> int:
        return int(self.settled[0].shape[2]) + _length(self.recent[0])

    def extend(self, presents: list[Any]) -> None:
        self.recent = list(presents)
        if _length(presents[0]) >= FOLD_EVERY:
            self.fold()

    def fold(self) -> None:
        batch, heads, _, head_dim = self.settled[0].shape
        empty = np.zeros((batch, heads, 0, head_dim), dtype=np.float32)
        # One layer at a time, dropping each old array as its successor exists: the transient
        # is one layer's cache, not a second copy of the whole cache.
        for index, recent in enumerate(self.recent):
            self.settled[index] = np.concatenate((self.settled[index], _as_numpy(recent)), axis=2)
            self.recent[index] = empty


def _length(value: Any) -> int:
    shape = value.shape() if callable(value.shape) else value.shape
    return int(shape[2])


def _as_float32(value: Any) -> npt.NDArray[np.float32]:
    return np.asarray(value, dtype=np.float32)


def _as_numpy(value: Any) -> npt.NDArray[np.float32]:
    return value if isinstance(value, np.ndarray) else np.asarray(value.numpy())


class _BoundGptStep:
    """The GPT step through an IOBinding: the recent KV part stays in onnxruntime's tensors
    from one step to the next, and the settled part is read from numpy without a copy."""

    def __init__(self, session: Any, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self._session = session
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._cache_names = self._inputs[3:]

    def __call__(
        self,
        embeds: npt.NDArray[np.float32],
        attention_mask: npt.NDArray[np.int64],
        position_ids: npt.NDArray[np.int64],
        cache: KVCache,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        binding = self._session.io_binding()
        # Bound arrays are read in place by run_with_iobinding: keep them referenced until then.
        arrays = [np.ascontiguousarray(a) for a in (embeds, attention_mask, position_ids)]
        for name, array in zip(self._inputs[:3], arrays, strict=True):
            binding.bind_cpu_input(name, array)
        # Graph order per layer: past key, past value, recent key, recent value.
        values: list[Any] = []
        for layer in range(len(cache.settled) // 2):
            values += cache.settled[2 * layer : 2 * layer + 2]
            values += cache.recent[2 * layer : 2 * layer + 2]
        for name, value in zip(self._cache_names, values, strict=True):
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        for name in self._outputs:
            binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        # Drop this step's references to the settled cache before a fold replaces it, or old
        # and new cache would both be alive at the fold (the peak memory doubled the cache).
        del binding, values, arrays
        cache.extend(list(outputs[2:]))
        return outputs[0].numpy(), outputs[1].numpy()
