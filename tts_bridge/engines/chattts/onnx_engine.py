"""ChatTTS on ONNX Runtime: the same voices as the torch engine, without torch.

The model folder is what ``tts_bridge.engines.chattts.export.export_chattts`` writes (ONNX graphs
for
the GPT step, the hidden-state decoder and Vocos; numpy arrays for the embeddings and the ISTFT
window; ChatTTS's tokenizer) and, after ``tts_bridge.engines.chattts.quantize.quantize_onnx``, INT8
variants of the graphs. ``manifest.json`` holds the sha256 of every file; every file a precision
uses is verified before onnxruntime sees it.

This module imports onnxruntime, numpy and ``tokenizers`` only (and those lazily, in ``load``):
a test asserts that loading and running the engine never imports torch.

The code-generation loop reproduces ChatTTS 0.2.5 (``Chat._infer_code`` and ``GPT.generate``):

* prompt ``[Stts][spk_emb][speed_N]{text}[Ptts]`` (``[empty_spk]`` without a speaker), left
  padded, position ids ``cumsum(mask) - 1``; the speaker vector, L2-normalised in float16 as
  ChatTTS does, replaces the embedding at ``[spk_emb]``;
* each step: logits (B*4, 626) / per-codebook temperature, repetition penalty over the last 16
  codes, top-P then top-K (each keeping at least 3), EOS forbidden before ``min_new_token``,
  softmax, one sample per codebook; EOS on any codebook ends that text and drops its hidden
  state;
* the hidden states of every step (the prefill's last position included) go through the
  decoder and Vocos, and numpy inverts the spectrum (``torch.istft`` with ``center=True``);
  streamed, through the streaming step graphs and ``StatefulStreamingDecoder`` when the
  export has them, else through ``StreamingDecoder``'s windows.

Sampling uses numpy's generator, so a seed gives repeatable audio here but not the same audio as
torch's sampler; under greedy decoding both produce identical codes (see the parity tests).
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import re
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from tts_bridge.engines.base import (
    EngineError,
    FloatAudio,
    SynthesisOptions,
    Tier,
    check_interrupt,
)
from tts_bridge.engines.chattts.common import (
    DEFAULT_SPEAKER_SEED,
    ChatTTSEngineBase,
    ChatTTSOptions,
    SpeakerStats,
    decode_spk_emb,
    expected_seconds,
    max_new_tokens,
    read_json,
    read_spk_stat_file,
    sample_spk_emb,
    strip_control_tags,
    validate_spk_emb,
)
from tts_bridge.manifests import sha256_file
from tts_bridge.text.sentences import is_speakable
from tts_bridge.textlog import short

if TYPE_CHECKING:
    from tts_bridge.engines.chattts.refine import TextRefiner

_LOGGER = logging.getLogger(__name__)

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

Precision = Literal["fp32", "int8"]
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


SAMPLE_RATE = 24_000
# ChatTTS's sampling constants (ChatTTS/model/processors.py and core.py).
PENALTY_WINDOW = 16
MIN_TOKENS_TO_KEEP = 3
REPETITION_PENALTY = 1.05
SILENCE_THRESHOLD = np.float32(1e-5)
"""Chat.infer drops every sample at or below this magnitude; done here too for equal output."""
SAMPLES_PER_CODE = 512
"""One audio code is two mel frames of 256 samples (21.3 ms at 24 kHz)."""
STREAM_CHUNK_CODES = (8, 12, 16, 24, 32, 48, 64, 96, 128)
"""Codes of final audio per streamed piece with the streaming graphs
(``StatefulStreamingDecoder``): the first early, then growing (the last size repeats).

Each piece must be ready before the audio already sent has played. Measured at full size
(INT8, 2 threads): 8-8.5 ms to generate a code and, with the layers' caches, about 10 ms per
piece plus 1 ms per code to decode (1 code 10 ms, 8 codes 15 ms, 12-24 codes 20-30 ms), for
21.3 ms of audio per code. So a piece of c codes is ready about 9.5c + 10 ms after the one
before it: the first piece (8 codes, 170 ms of audio) covers the second (12 codes, ~125 ms),
and from then on each piece adds ~12c - 10 ms of lead, so the sizes can grow by ~1.5x. The
lookahead (52 codes at full size) is paid once, before the first piece, whose push decodes
those ~60 codes in one go (35-45 ms)."""
WINDOWED_CHUNK_CODES = (16, 20, 28, 40, 56, 80, 112, 160)
"""The same for exports without the streaming graphs (``StreamingDecoder``). Measured at full
size (INT8, 2 threads): about 9 ms to generate a code and 150 ms to decode a piece (its context
included), for 21.3 ms of audio per code; so a piece of c codes buys about 12c - 150 ms of lead
over playback, and sizes grow by ~1.4x to stay ahead of it."""


def audible(wave: FloatAudio) -> FloatAudio:
    """Chat.infer's output filter: samples at or below ``SILENCE_THRESHOLD`` in magnitude are
    dropped (not zeroed), the rest clipped to [-1, 1]. Sample by sample, so filtering streamed
    pieces and joining them equals filtering the whole."""
    return np.clip(wave[np.abs(wave) > SILENCE_THRESHOLD], -1.0, 1.0)


# -- manifest -----------------------------------------------------------------------------------


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
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
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
        hint = " (run: tts-bridge models quantize)" if precision == "int8" else ""
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


def session_options(threads: int, *, arena: bool = True, spinning: bool = True) -> Any:
    """onnxruntime session options: intra-op ``threads``, inter-op 1, sequential execution.

    ``spinning`` lets idle worker threads busy-wait for the next operator (onnxruntime's
    default). A GPT step is a thousand small operators, so on an idle 2-core machine spinning
    made the INT8 loop 37 % faster (67 vs 49 tokens/s, 2 threads). When other processes want
    the cores it is a cliff instead: the pool waits on descheduled threads, and with a second
    process busy the same loop fell to 10 tokens/s with spinning, 25 without. Turn it off
    where the thread plan expects to share the cores.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = arena
    options.log_severity_level = 3  # warnings about unused initializers are noise here
    return options


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
            times.sampling += time.perf_counter() - between
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
        if self._stream_stages is not None:
            (mel,) = self._stream_stages[0].once(hidden)
            return mel
        (mel,) = self._decoder.run(None, {"hidden": hidden})
        return _as_float32(mel)

    def run_vocos(
        self, mel: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Vocos, one shot: mel (1, mels, frames) -> magnitude and phase, each
        (1, n_fft/2 + 1, frames)."""
        if self._stream_stages is not None:
            magnitude, phase = self._stream_stages[1].once(mel)
            return magnitude, phase
        magnitude, phase = self._vocos.run(None, {"mel": mel})
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
        (at full size about 200 ms; the engine does it at load)."""
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


def istft(
    magnitude: npt.NDArray[np.float32],
    phase: npt.NDArray[np.float32],
    window: npt.NDArray[np.float32],
    hop_length: int,
) -> FloatAudio:
    """``torch.istft(mag * e^(i phase), n_fft, hop, window=window, center=True)`` in numpy.

    Frames are inverse-FFT'd, windowed and overlap-added; the sum is divided by the overlapped
    squared window and ``n_fft // 2`` samples are trimmed from each end (``center=True``).
    """
    n_fft = window.size
    frames = magnitude.shape[1]
    chunks = _frames(magnitude, phase, window)
    total = n_fft + hop_length * (frames - 1)
    signal = np.zeros(total, dtype=np.float32)
    envelope = np.zeros(total, dtype=np.float32)
    squared = window * window
    for index in range(frames):
        start = index * hop_length
        signal[start : start + n_fft] += chunks[:, index]
        envelope[start : start + n_fft] += squared
    half = n_fft // 2
    body = slice(half, total - half)
    return np.asarray(signal[body] / envelope[body], dtype=np.float32)


def _frames(
    magnitude: npt.NDArray[np.float32],
    phase: npt.NDArray[np.float32],
    window: npt.NDArray[np.float32],
) -> npt.NDArray[np.float32]:
    """Spectrum frames (bins, frames) -> windowed time frames (n_fft, frames)."""
    spectrum = (magnitude * np.cos(phase)) + 1j * (magnitude * np.sin(phase))
    chunks = np.fft.irfft(spectrum.astype(np.complex64), n=window.size, axis=0).astype(np.float32)
    chunks *= window[:, None]
    return chunks


# -- streaming ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reach:
    """How many frames one output frame of a convolution stack reads on each side of itself."""

    left: int
    right: int


def measure_reach(
    run: Callable[[npt.NDArray[np.float32]], Sequence[npt.NDArray[np.float32]]],
    channels: int,
    frames_per_input: int,
    inputs: int = 64,
) -> Reach:
    """A graph's reach, read from how NaN spreads through it.

    ``run`` maps (1, channels, n) inputs to outputs (1, *, n x frames_per_input). The first and
    the last input of a sequence are NaN; every output that reads one of them, however small
    its weight, turns NaN, so the reach is the architecture's own (a changed value would be
    lost in rounding behind a residual connection: on random weights that measured 56 of the
    decoder's 75 frames). The sequence doubles until the two NaN regions are apart.
    """
    while True:
        probe = np.zeros((1, channels, inputs), dtype=np.float32)
        probe[:, :, [0, -1]] = np.nan
        reached = np.zeros(inputs * frames_per_input, dtype=bool)
        with np.errstate(invalid="ignore"):
            for output in run(probe):
                reached |= np.asarray(np.isnan(output[0]).any(axis=0), dtype=bool)
        clean = np.flatnonzero(~reached)
        if clean.size:
            # Outputs 0 .. clean[0] - 1 read the first input's frames (0 .. per - 1), and
            # clean[-1] + 1 .. end the last input's frames (n - per .. n - 1).
            left = int(clean[0]) - frames_per_input
            right = reached.size - frames_per_input - int(clean[-1]) - 1
            return Reach(left=left, right=right)
        inputs *= 2


class _OverlapAdd:
    """The ISTFT of spectrum frames that arrive in order: frames are overlap-added into a
    running buffer as the one-shot ``istft`` adds them, and samples leave once complete."""

    def __init__(self, model: ChatTTSOnnxModel) -> None:
        self._hop: int = model.hop_length
        self._window = model.window
        self._squared = self._window * self._window
        self._half: int = self._window.size // 2
        self._frames_done = 0
        """Spectrum frames overlap-added so far."""
        n_fft = self._window.size
        self._signal = np.zeros(n_fft, dtype=np.float32)
        self._envelope = np.zeros(n_fft, dtype=np.float32)
        self._origin = 0
        """Index (in the centre-padded signal) of ``_signal[0]``."""
        self._emitted = self._half
        """Padded index of the next sample to return: output sample 0 is padded index n_fft/2."""

    def _overlap(self, magnitude: npt.NDArray[np.float32], phase: npt.NDArray[np.float32]) -> None:
        """Add the next spectrum frames, each (bins, frames)."""
        chunks = _frames(magnitude, phase, self._window)
        target = self._frames_done + chunks.shape[1]
        n_fft = self._window.size
        needed = target * self._hop + n_fft - self._hop - self._origin
        if needed > self._signal.size:
            grow = needed - self._signal.size
            self._signal = np.concatenate([self._signal, np.zeros(grow, dtype=np.float32)])
            self._envelope = np.concatenate([self._envelope, np.zeros(grow, dtype=np.float32)])
        for index in range(chunks.shape[1]):
            at = (self._frames_done + index) * self._hop - self._origin
            self._signal[at : at + n_fft] += chunks[:, index]
            self._envelope[at : at + n_fft] += self._squared
        self._frames_done = target

    def _limit(self, codes: int, final: bool) -> int:
        """Padded index up to which the samples are complete."""
        if final:
            return self._window.size + self._hop * (2 * codes - 1) - self._half if codes else 0
        return self._frames_done * self._hop

    def _take(self, limit: int) -> FloatAudio:
        if limit <= self._emitted:
            return np.zeros(0, dtype=np.float32)
        begin, end = self._emitted - self._origin, limit - self._origin
        out = np.asarray(self._signal[begin:end] / self._envelope[begin:end], dtype=np.float32)
        self._signal = self._signal[end:]
        self._envelope = self._envelope[end:]
        self._origin = self._emitted = limit
        return out


class StreamingDecoder(_OverlapAdd):
    """Hidden states that arrive a few at a time -> the audio samples that can no longer change
    (for exports without the streaming graphs; see ``StatefulStreamingDecoder``).

    The decoder and Vocos are stacks of non-causal convolutions (zero padded at both ends) and
    the ISTFT overlaps frames, so the last samples decoded from a prefix change when more codes
    arrive. Only final samples are returned: those whose whole receptive field, mel frame to
    waveform, lies in the prefix (``ChatTTSOnnxModel.reach``, about 52 codes at full size).
    Each graph runs on a window, the new frames plus the context on either side they read, so
    the cost of a generation stays linear in its length. Mel frames once final are kept for
    Vocos's left context; spectrum frames are overlap-added into a running buffer as the one-shot
    ``istft`` adds them, in the same order.

    The concatenated output equals ``ChatTTSOnnxModel.decode`` of the full sequence (up to
    float rounding in the graphs' window sizes; the tests hold it to 1e-5).
    """

    def __init__(self, model: ChatTTSOnnxModel) -> None:
        super().__init__(model)
        self._model = model
        self._decoder_reach, self._vocos_reach = model.reach
        self._mel: npt.NDArray[np.float32] | None = None
        """Final mel frames from ``_mel_start`` to ``_mel_done`` (1, mels, frames)."""
        self._mel_start = 0
        self._mel_done = 0

    @property
    def lookahead_codes(self) -> float:
        """How many codes the final audio trails the generated codes by (52 at full size)."""
        frames = self._decoder_reach.right + self._vocos_reach.right
        return (frames * self._hop + self._half) / (2 * self._hop)

    def ready(self, codes: int) -> int:
        """How many samples in all are final once ``codes`` codes exist (more may follow)."""
        frames = 2 * codes - self._decoder_reach.right - self._vocos_reach.right
        return max(0, frames * self._hop - self._half)

    def push(self, hiddens: npt.NDArray[np.float32], *, final: bool = False) -> FloatAudio:
        """The samples that became final with ``hiddens`` (every state so far, (steps, hidden));
        ``final`` says no state will follow, so every remaining sample is returned."""
        codes = hiddens.shape[0]
        total = 2 * codes
        mel_target = total if final else max(0, total - self._decoder_reach.right)
        if mel_target > self._mel_done:
            self._extend_mel(hiddens, mel_target)
        frame_target = mel_target if final else max(0, mel_target - self._vocos_reach.right)
        if frame_target > self._frames_done:
            self._add_frames(frame_target, mel_end=mel_target)
        return self._take(self._limit(codes, final))

    def _extend_mel(self, hiddens: npt.NDArray[np.float32], target: int) -> None:
        # The window starts on a code (two mel frames each) far enough left that the decoder's
        # zero padding there does not reach the first new frame.
        first_code = max(0, self._mel_done - self._decoder_reach.left) // 2
        window = np.ascontiguousarray(hiddens[first_code:].T[None, :, :], dtype=np.float32)
        mel = self._model.run_decoder(window)
        offset = 2 * first_code
        new = mel[:, :, self._mel_done - offset : target - offset]
        keep_from = max(0, self._frames_done - self._vocos_reach.left)
        if self._mel is None:
            self._mel = new
        else:
            old = self._mel[:, :, keep_from - self._mel_start :]
            self._mel = np.concatenate([old, new], axis=2)
            self._mel_start = keep_from
        self._mel_done = target

    def _add_frames(self, target: int, mel_end: int) -> None:
        assert self._mel is not None
        # From far enough left that Vocos's zero padding does not reach the first new frame, to
        # the last final mel frame (which the newest spectrum frame reads, and no further).
        start = max(0, self._frames_done - self._vocos_reach.left)
        mel = self._mel[:, :, start - self._mel_start : mel_end - self._mel_start]
        magnitude, phase = self._model.run_vocos(np.ascontiguousarray(mel))
        begin, stop = self._frames_done - start, target - start
        self._overlap(magnitude[0, :, begin:stop], phase[0, :, begin:stop])


class StreamStage:
    """One streaming step graph (``decoder_stream.onnx`` or ``vocos_stream.onnx``, see the
    exporter's docs): its session, and each cache's channels and padding."""

    def __init__(self, session: Any, frames_per_input: int) -> None:
        self._session = session
        self.frames_per_input = frames_per_input
        inputs = session.get_inputs()
        self._input_names = [i.name for i in inputs]
        meta = session.get_modelmeta().custom_metadata_map
        try:
            self.pads = [int(p) for p in meta[STREAM_PADS_KEY].split(",")]
        except (KeyError, ValueError) as exc:
            raise EngineError(f"a streaming graph lacks its '{STREAM_PADS_KEY}' metadata") from exc
        self.channels = [int(i.shape[1]) for i in inputs[2:]]
        if len(self.channels) != len(self.pads):
            raise EngineError("a streaming graph's caches do not match its 'pads' metadata")
        self.delay = sum(self.pads)
        """Frames the stack's output trails its input by (its one-sided reach)."""
        self._outputs = len(session.get_outputs()) - len(self.pads)

    def start(self) -> StreamState:
        """Fresh state for one text: each cache holds its p zero frames of left padding."""
        caches = [
            np.zeros((1, c, p), dtype=np.float32)
            for c, p in zip(self.channels, self.pads, strict=True)
        ]
        return StreamState(self, caches)

    def once(self, data: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
        """The one-shot graph's outputs for ``data`` (1, channels, n >= 1): one flushed push."""
        outputs = self.start().push(data, final=True)
        if outputs is None:
            raise EngineError("nothing to decode")
        return outputs

    def run(
        self, data: npt.NDArray[np.float32], caches: list[Any], final: bool
    ) -> tuple[list[npt.NDArray[np.float32]], list[Any]]:
        flush = np.zeros((1, 1 if final else 0), dtype=np.float32)
        feeds = dict(zip(self._input_names, [data, flush, *caches], strict=True))
        outputs = self._session.run(None, feeds)
        return [_as_float32(o) for o in outputs[: self._outputs]], outputs[self._outputs :]


class StreamState:
    """One text's pass through a ``StreamStage``: inputs are held back until the first push
    covers the stack's delay (every layer must then get more frames than its padding)."""

    def __init__(self, stage: StreamStage, caches: list[Any]) -> None:
        self.stage = stage
        self._caches = caches
        self._pending: list[npt.NDArray[np.float32]] = []
        self._pending_frames = 0
        self._started = False
        self._done = False

    def push(
        self, data: npt.NDArray[np.float32] | None, final: bool
    ) -> list[npt.NDArray[np.float32]] | None:
        """Feed new inputs (1, channels, n), if any; the outputs that became final, or None."""
        if self._done:
            raise EngineError("this stream has already been flushed")
        if data is not None and data.shape[2]:
            self._pending.append(data)
            self._pending_frames += data.shape[2] * self.stage.frames_per_input
        if final:
            self._done = True
            if not self._started and not self._pending_frames:
                return None
        elif not self._pending_frames or (
            not self._started and self._pending_frames <= self.stage.delay
        ):
            return None
        if not self._pending:  # a flush with nothing new: only the right padding is decoded
            width = self.stage.channels[0] * self.stage.frames_per_input
            joined = np.zeros((1, width, 0), dtype=np.float32)
        elif len(self._pending) == 1:
            joined = self._pending[0]
        else:
            joined = np.concatenate(self._pending, axis=2)
        outputs, self._caches = self.stage.run(np.ascontiguousarray(joined), self._caches, final)
        self._pending = []
        self._pending_frames = 0
        self._started = True
        return outputs


class StatefulStreamingDecoder(_OverlapAdd):
    """``StreamingDecoder``'s job on the streaming step graphs: each push runs the decoder on
    the new hidden states only and Vocos on the new mel frames only, the layers' caches carrying
    the context, so streaming costs about what decoding the text whole does. The final push
    flushes both stacks (each layer's right padding). Same interface and output as
    ``StreamingDecoder`` (the one-shot ``decode`` up to float rounding; tests hold it to 1e-5).
    """

    def __init__(self, decoder: StreamState, vocos: StreamState, model: ChatTTSOnnxModel) -> None:
        super().__init__(model)
        self._decoder = decoder
        self._vocos = vocos
        self._fed = 0
        """Hidden states given to the decoder so far."""

    @property
    def lookahead_codes(self) -> float:
        """How many codes the final audio trails the generated codes by (52 at full size)."""
        frames = self._decoder.stage.delay + self._vocos.stage.delay
        return (frames * self._hop + self._half) / (2 * self._hop)

    def ready(self, codes: int) -> int:
        """How many samples in all are final once ``codes`` codes exist (more may follow)."""
        frames = 2 * codes - self._decoder.stage.delay - self._vocos.stage.delay
        return max(0, frames * self._hop - self._half)

    def push(self, hiddens: npt.NDArray[np.float32], *, final: bool = False) -> FloatAudio:
        """The samples that became final with ``hiddens`` (every state so far, (steps, hidden));
        ``final`` says no state will follow, so every remaining sample is returned."""
        codes = hiddens.shape[0]
        new = np.ascontiguousarray(hiddens[self._fed :].T[None, :, :], dtype=np.float32)
        self._fed = codes
        mel = self._decoder.push(new, final)
        if mel is not None or final:
            spectrum = self._vocos.push(mel[0] if mel is not None else None, final)
            if spectrum is not None:
                magnitude, phase = spectrum
                self._overlap(magnitude[0], phase[0])
        return self._take(self._limit(codes, final))


# -- the engine ---------------------------------------------------------------------------------


@dataclass
class _Loaded:
    model: ChatTTSOnnxModel
    stats: SpeakerStats
    default_speaker: str
    refiner: TextRefiner | None = None
    """The refine pass, loaded on the first request with refine_text."""


class ChatTTSOnnxEngine(ChatTTSEngineBase[_Loaded]):
    """ChatTTS from an ONNX export, on onnxruntime (FP32 or INT8). Cheap to construct.

    ``expected_sha256`` maps each file of the export (relative path) to its hex sha256, as the
    project's model registry records it; None trusts the export's own ``manifest.json`` (which
    still catches a damaged or half-copied file, not a deliberately replaced one).
    ``threads`` is onnxruntime's intra-op thread count (inter-op is 1, execution sequential);
    ``arena`` its CPU memory arena (faster, keeps peak memory); ``spinning`` see
    ``session_options``. ``tier`` is "fast" by default; set the attribute to serve quality.
    ``on_loader`` runs a function on a normal-priority thread and returns its result (the
    model pool's loader thread); the refine pass's session, made on first use, is created
    there: onnxruntime's worker threads keep the nice value of the thread that creates them,
    and the first refine may come from the niced idle thread. None: the calling thread.
    """

    name = "chattts-onnx"
    tier: Tier = "fast"
    _label = "ChatTTS ONNX"
    _artifact = "export"

    def __init__(
        self,
        folder: Path,
        *,
        precision: Precision = "int8",
        expected_sha256: Mapping[str, str] | None = None,
        threads: int = 1,
        arena: bool = True,
        spinning: bool = True,
        defaults: ChatTTSOptions | None = None,
        default_speaker: str | None = None,
        hasher: Callable[[Path], str] = sha256_file,
        on_loader: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        super().__init__(
            folder,
            expected_sha256=expected_sha256,
            threads=threads,
            defaults=defaults,
            default_speaker=default_speaker,
            hasher=hasher,
        )
        self._precision: Precision = precision
        self._arena = arena
        self._spinning = spinning
        self._on_loader = on_loader or (lambda make: make())

    # -- metadata --------------------------------------------------------------------------

    @property
    def precision(self) -> Precision:
        return self._precision

    def _identity_fields(self) -> tuple[str, ...]:
        return (self._precision,)

    @functools.cached_property
    def hidden_size(self) -> int:
        config = read_json(self._folder / CONFIG_FILE)
        try:
            return int(config["hidden_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineError(f"{self._folder / CONFIG_FILE}: no hidden_size") from exc

    def files(self) -> tuple[str, ...]:
        """Relative paths of every file this precision loads."""
        manifest = read_manifest(self._folder)
        roles = precision_files(manifest, self._precision)
        graphs = {roles[role] for role in loaded_roles(roles)}
        # The text head (FP32 in both precisions) serves refine_text: verified and in the identity.
        graphs.add(HEAD_TEXT_FILE)
        data = {external_data_path(Path(g)).as_posix() for g in graphs}
        return (*COMMON_FILES, *sorted(graphs | (data & set(manifest["files"]))))

    def _required_files(self, expected: Mapping[str, str]) -> tuple[str, ...]:
        return self.files()

    def speaker_stats(self) -> SpeakerStats:
        loaded = self._loaded
        if loaded is not None:
            return loaded.stats
        self._verify_file(SPK_STAT_NAME, self._expected_hashes())
        return read_spk_stat_file(self._folder / SPK_STAT_NAME, self.hidden_size)

    # -- load / unload ---------------------------------------------------------------------

    def _load_locked(self) -> _Loaded:
        started = time.monotonic()
        self.verify()
        manifest = read_manifest(self._folder)
        graphs = precision_files(manifest, self._precision)
        quantization = manifest.get("quantization") or {}
        if (
            self._precision == "int8"
            and quantization.get("weight_type") == "qint8"
            and not cpu_has_vnni()
        ):
            _LOGGER.warning(
                "%s: QInt8 weights on a CPU without VNNI can saturate and garble the audio; "
                "re-quantize on this machine (tts-bridge models quantize)",
                self._folder,
            )
        # The speaker first: encoding one runs LZMA at preset 9 (a 64 MB dictionary), and done
        # before the graphs load, that transient does not add to the process's peak RSS.
        hidden_size = self.hidden_size
        stats = read_spk_stat_file(self._folder / SPK_STAT_NAME, hidden_size)
        default_speaker = self._default_speaker or sample_spk_emb(stats, DEFAULT_SPEAKER_SEED)
        validate_spk_emb(default_speaker, hidden_size)
        model = ChatTTSOnnxModel(
            self._folder,
            graphs,
            threads=self._threads,
            arena=self._arena,
            spinning=self._spinning,
        )
        # Measured now rather than on the first streamed request (~200 ms at full size).
        lookahead = model.stream_decoder().lookahead_codes
        _LOGGER.info(
            "Loaded ChatTTS ONNX %s (%s, hidden %d x %d layers, %d threads, streaming "
            "lookahead %.0f codes) in %.1f s",
            self._folder,
            self._precision,
            model.hidden_size,
            model.num_layers,
            self._threads,
            lookahead,
            time.monotonic() - started,
        )
        return _Loaded(model, stats, default_speaker)

    def unload(self) -> None:
        with self._lock:
            if self._loaded is None:
                return
            self._loaded = None
        gc.collect()
        _LOGGER.info("Unloaded ChatTTS ONNX %s", self._folder)

    # -- synthesis -------------------------------------------------------------------------

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        """Speak ``text``: one float32 chunk per generation of at most ~25 s expected audio."""
        chosen = self._options(options)
        if speaker is not None:
            self.validate_speaker(speaker)
        for chunk in self.generations(text, chosen):
            (audio,) = self.synthesize_batch([chunk], speaker, chosen)
            if audio.size:
                yield audio

    def synthesize_stream(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        """``synthesize``, streaming: each generation yields its audio in pieces while the codes
        are generated (``STREAM_CHUNK_CODES``), each piece the samples no later code can change
        (see ``StatefulStreamingDecoder`` and ``StreamingDecoder``). Joined, the pieces are
        ``synthesize``'s audio of the same codes (silence filter included) up to float rounding.

        After a piece that is not the last, an empty chunk follows at once: a consumer that
        looks one chunk ahead to mark the last piece (the bridge's stream topic) can send the
        piece then instead of when the next one is ready.

        With the streaming graphs, decoding in pieces costs about what decoding whole does
        (each piece decodes only its own frames). Exports without them decode each piece's
        context again (at full size a 106-code sentence took 490 ms to decode streamed, 200 ms
        whole), so the synthesizer uses this only for streamed requests.
        """
        chosen = self._options(options)
        if speaker is not None:
            self.validate_speaker(speaker)
        texts = self.generations(text, chosen)
        for number, chunk in enumerate(texts):
            for audio, more in self._stream(chunk, speaker, chosen):
                if audio.size:
                    yield audio
                    if more or number < len(texts) - 1:
                        yield np.zeros(0, dtype=np.float32)

    def _stream(
        self, text: str, speaker: str | None, chosen: ChatTTSOptions
    ) -> Iterator[tuple[FloatAudio, bool]]:
        """One generation of one text (from ``generations``): (audio, more follows) as the
        samples become final.

        Holds the engine's lock until the generation ends (or the iterator is closed).
        """
        spoken = [text]
        params, budgets = self._sampling(spoken, chosen)
        with self._lock:
            loaded = self._loaded_locked()
            model = loaded.model
            _LOGGER.debug(
                "ChatTTS ONNX, streaming: %s (max %d tokens, seed %d)",
                short(spoken[0]),
                params.max_new_token,
                chosen.seed,
            )
            try:
                prompts = self._code_prompts(loaded, spoken, chosen)
                prompt = model.encode(prompts, speaker or loaded.default_speaker)
                decoder = model.stream_decoder()
                steps = model.generate_steps(prompt, params, chosen.seed, budgets)
                schedule = (
                    STREAM_CHUNK_CODES
                    if isinstance(decoder, StatefulStreamingDecoder)
                    else WINDOWED_CHUNK_CODES
                )
                sizes = iter(schedule)
                emitted = 0
                due = next(sizes) * SAMPLES_PER_CODE
                while True:
                    try:
                        counts, hiddens = next(steps)
                    except StopIteration as done:
                        (result,) = done.value
                        break
                    count = int(counts[0])
                    if decoder.ready(count) - emitted >= due:
                        audio = decoder.push(hiddens[0, :count])
                        emitted += audio.size
                        due = next(sizes, schedule[-1]) * SAMPLES_PER_CODE
                        yield audible(audio), True
                audio = decoder.push(result.hiddens, final=True)
            except EngineError:
                raise
            except Exception as exc:  # onnxruntime's errors have no common public base class
                raise EngineError(f"ChatTTS ONNX failed on {short(spoken[0])}: {exc}") from exc
        yield audible(audio), False

    def synthesize_batch(
        self, texts: Sequence[str], speaker: str | None, options: SynthesisOptions
    ) -> list[FloatAudio]:
        """Speak several short texts in one code loop (left-padded, each ends on its own EOS).

        Each text must fit one generation (see ``split_for_generation``); background work
        such as idle pre-rendering uses this to keep both cores busy. The seed of ``options``
        applies to the batch as a whole, so a text's audio depends on its batch-mates.
        """
        chosen = self._options(options)
        if speaker is not None:
            self.validate_speaker(speaker)
        clips = [np.zeros(0, dtype=np.float32) for _ in texts]
        # Punctuation or emoji alone would make ChatTTS babble: such texts stay silent.
        wanted = [i for i, t in enumerate(texts) if is_speakable(strip_control_tags(t))]
        if not wanted:
            return clips
        spoken = [strip_control_tags(texts[i]) for i in wanted]
        params, budgets = self._sampling(spoken, chosen)
        budget = params.max_new_token
        with self._lock:
            loaded = self._loaded_locked()
            model = loaded.model
            prompts = self._code_prompts(loaded, spoken, chosen)
            _LOGGER.debug(
                "ChatTTS ONNX: %s (max %d tokens, seed %d)",
                short(" | ".join(spoken)),
                budget,
                chosen.seed,
            )
            try:
                prompt = model.encode(prompts, speaker or loaded.default_speaker)
                results = model.generate(prompt, params, chosen.seed, budgets)
                audio = [model.decode(r.hiddens) for r in results]
            except EngineError:
                raise  # SynthesisInterruptedError among them: not a failure
            except Exception as exc:  # onnxruntime's errors have no common public base class
                raise EngineError(f"ChatTTS ONNX failed on {short(spoken[0])}: {exc}") from exc
        for index, wave in zip(wanted, audio, strict=True):
            clips[index] = audible(wave)
        return clips

    @staticmethod
    def _sampling(
        spoken: Sequence[str], chosen: ChatTTSOptions
    ) -> tuple[SamplingParams, list[int]]:
        """Sampling parameters for one code loop over ``spoken`` and each text's token budget."""
        budgets = [max_new_tokens(expected_seconds(t, chosen.speed_level)) for t in spoken]
        params = SamplingParams(
            temperature=chosen.temperature,
            top_p=chosen.top_P,
            top_k=chosen.top_K,
            # As the torch engine: at least one code, so a generation is never empty.
            min_new_token=1,
            max_new_token=max(budgets),
        )
        return params, budgets

    def _code_prompts(
        self, loaded: _Loaded, spoken: list[str], chosen: ChatTTSOptions
    ) -> list[str]:
        """The code prompts for ``spoken``: cleaned, refined when asked (call under the lock)."""
        cleaned = [loaded.model.cleaner(t) for t in spoken]
        if chosen.refine_text:
            cleaned = self._refine(loaded, cleaned, spoken, chosen)
        return [code_prompt(t, chosen.speed_level, True) for t in cleaned]

    def _refine(
        self, loaded: _Loaded, cleaned: list[str], spoken: list[str], chosen: ChatTTSOptions
    ) -> list[str]:
        """ChatTTS's refine pass over the cleaned texts (call under the lock); the refined text
        goes into the code prompt as it is, as in ChatTTS. The text head loads on first use."""
        from tts_bridge.engines.chattts.refine import TextRefiner, engine_params

        if loaded.refiner is None:
            loaded.refiner = self._on_loader(
                lambda: TextRefiner(
                    loaded.model,
                    self._folder,
                    threads=self._threads,
                    arena=self._arena,
                    spinning=self._spinning,
                )
            )
        params, budgets = engine_params(chosen, spoken)
        return loaded.refiner.refine(cleaned, params, chosen.seed, budgets)

    def _expected_hashes(self) -> dict[str, str]:
        if self._expected is not None:
            return self._expected
        files: dict[str, str] = read_manifest(self._folder)["files"]
        return files
