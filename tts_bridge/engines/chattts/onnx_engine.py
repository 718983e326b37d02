"""ChatTTS on ONNX Runtime: the same voices as the torch engine, without torch.

The engine serves a folder that ``export.export_chattts`` wrote (``onnx_format`` describes it),
FP32 or, after ``quantize.quantize_onnx``, INT8. Every file a precision uses is verified
against the expected hashes before onnxruntime sees it. The engine is the policy around the
runtime: it splits text into generations, holds one lock over the model, runs the code loop of
``onnx_model`` for a text, a batch or a stream, picks the piece sizes of a stream
(``onnx_stream`` says which samples are final), applies ChatTTS's output filter and loads the
refine pass (``refine``) on the first request that asks for it.

onnxruntime and ``tokenizers`` are imported when the model loads: a test asserts that loading
and running the engine never imports torch.
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tts_bridge.engines.base import EngineError, FloatAudio, SynthesisOptions, Tier
from tts_bridge.engines.chattts.common import (
    ChatTTSEngineBase,
    ChatTTSOptions,
    expected_seconds,
    max_new_tokens,
    read_json,
    read_spk_stat_file,
    strip_control_tags,
)
from tts_bridge.engines.chattts.onnx_early import (
    SAMPLES_PER_CODE,
    EarlyReport,
    EarlyStart,
    EarlyStream,
)
from tts_bridge.engines.chattts.onnx_format import (
    CONFIG_FILE,
    SPK_STAT_NAME,
    Precision,
    cpu_has_vnni,
    loaded_files,
    precision_files,
    read_manifest,
)
from tts_bridge.engines.chattts.onnx_model import ChatTTSOnnxModel, SamplingParams, code_prompt
from tts_bridge.engines.chattts.onnx_stream import StatefulStreamingDecoder, StreamingDecoder
from tts_bridge.engines.chattts.refine import TextRefiner, engine_params
from tts_bridge.engines.chattts.speaker import (
    DEFAULT_SPEAKER_SEED,
    SpeakerStats,
    sample_spk_emb,
    validate_spk_emb,
)
from tts_bridge.engines.manifests import sha256_file
from tts_bridge.text.sentences import is_speakable
from tts_bridge.textlog import short, size

__all__ = [
    "SAMPLES_PER_CODE",
    "SILENCE_THRESHOLD",
    "STREAM_CHUNK_CODES",
    "WINDOWED_CHUNK_CODES",
    "ChatTTSOnnxEngine",
    "audible",
]

_LOGGER = logging.getLogger(__name__)

SILENCE_THRESHOLD = np.float32(1e-5)
"""Chat.infer drops every sample at or below this magnitude; done here too for equal output."""
STREAM_CHUNK_CODES = (8, 12, 16, 24, 32, 48, 64, 96, 128)
"""Codes of final audio per streamed piece with the streaming graphs
(``StatefulStreamingDecoder``): the first early, then growing (the last size repeats).

Each piece must be ready before the audio already sent has played. A code is generated in
less time than the audio it becomes, and with the layers' caches a piece costs a small fixed
decode plus a little per code, so each piece adds lead over playback and the next may be about
half as large again. The first is small because the listener waits for it; the decoders'
lookahead is paid once, before it. The bench (``tts-bridge bench --chattts``) times the first
piece; docs/benchmarks.md has the figures these sizes were chosen from."""
WINDOWED_CHUNK_CODES = (16, 20, 28, 40, 56, 80, 112, 160)
"""The same for exports without the streaming graphs (``StreamingDecoder``): each piece decodes
its context again, a large fixed cost per piece, so the pieces start larger and grow a little
slower to stay ahead of playback."""


def audible(wave: FloatAudio) -> FloatAudio:
    """Chat.infer's output filter: samples at or below ``SILENCE_THRESHOLD`` in magnitude are
    dropped (not zeroed), the rest clipped to [-1, 1]. Sample by sample, so filtering streamed
    pieces and joining them equals filtering the whole."""
    return np.clip(wave[np.abs(wave) > SILENCE_THRESHOLD], -1.0, 1.0)


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
    ``early_start`` starts a stream with approximate audio before its first samples are final
    (``onnx_early``; the configuration's ``synthesis.chattts_early_start``); None streams exact
    pieces only, which joined equal the one-shot audio.
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
        early_start: EarlyStart | None = None,
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
        self.early_start = early_start
        """The early start of streamed generations (may be changed between requests)."""
        self.last_early_start: EarlyReport | None = None
        """What the early start of the last streamed generation did (None: it had none; no
        previews: its pieces were all exact)."""

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
        return loaded_files(read_manifest(self._folder), self._precision)

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
        # int8-all runs int8's GPT and its own INT8 decoder and Vocos: both records count.
        records = {"int8": ("quantization",), "int8-all": ("quantization", "int8_all_quantization")}
        weight_types = {
            (manifest.get(key) or {}).get("weight_type") for key in records.get(self._precision, ())
        }
        if "qint8" in weight_types and not cpu_has_vnni():
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
        # Measured now rather than inside the first streamed request, which would wait for it.
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
    ) -> Generator[FloatAudio, None, FloatAudio | None]:
        """``synthesize``, streaming: each generation yields its audio in pieces while the codes
        are generated (``STREAM_CHUNK_CODES``), each piece the samples no later code can change
        (see ``StatefulStreamingDecoder`` and ``StreamingDecoder``). Joined, the pieces are
        ``synthesize``'s audio of the same codes (silence filter included) up to float rounding.

        After a piece that is not the last, an empty chunk follows at once: a consumer that
        looks one chunk ahead to mark the last piece (the bridge's stream topic) can send the
        piece then instead of when the next one is ready.

        With the streaming graphs, decoding in pieces costs about what decoding whole does
        (each piece decodes only its own frames). Exports without them decode each piece's
        context again (streaming a sentence then costs a multiple of decoding it whole), so the
        synthesizer uses this only for streamed requests.

        With an early start (``early_start``) the first pieces of a generation are approximate
        (``EarlyStream``) and the rest exact; the generator then returns the exact audio of
        the whole text (what ``synthesize`` gives, up to float rounding), decoded on the way,
        for whoever keeps it (the sentence cache). Without approximate pieces it returns None:
        the pieces joined are that audio.
        """
        chosen = self._options(options)
        if speaker is not None:
            self.validate_speaker(speaker)
        texts = self.generations(text, chosen)
        exact: list[FloatAudio] = []
        approximate = False
        for number, chunk in enumerate(texts):
            stream = self._stream(chunk, speaker, chosen, exact)
            for audio, more in stream:
                if audio.size:
                    yield audio
                    if more or number < len(texts) - 1:
                        yield np.zeros(0, dtype=np.float32)
            report = self.last_early_start
            approximate |= report is not None and report.previews > 0
        if not approximate:
            return None
        return np.concatenate(exact) if exact else np.zeros(0, dtype=np.float32)

    def _stream(
        self, text: str, speaker: str | None, chosen: ChatTTSOptions, exact: list[FloatAudio]
    ) -> Iterator[tuple[FloatAudio, bool]]:
        """One generation of one text (from ``generations``): (audio, more follows) as the
        samples become final, or earlier with an early start; the generation's exact audio
        (filtered, when not empty) is appended to ``exact`` at the end, and
        ``last_early_start`` says whether the pieces were approximate.

        Holds the engine's lock until the generation ends (or the iterator is closed).
        """
        self.last_early_start = None
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
                early = self._early(decoder, schedule)
                if early is not None:
                    yield from self._stream_early(early, steps, exact)
                    return
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
                raise EngineError(f"ChatTTS ONNX failed on {size(spoken[0])}: {exc}") from exc
        yield audible(audio), False

    def _early(
        self, decoder: StatefulStreamingDecoder | StreamingDecoder, schedule: Sequence[int]
    ) -> EarlyStream | None:
        """The early start for this generation, when there is one and it starts sooner than
        the first exact piece would (with little lookahead, exact pieces come soon enough)."""
        early = self.early_start
        if early is None or not isinstance(decoder, StatefulStreamingDecoder):
            return None
        if early.first_codes >= schedule[0] + math.ceil(decoder.lookahead_codes):
            return None
        return EarlyStream(decoder, early, schedule, sample_rate=self.sample_rate)

    def _stream_early(
        self,
        early: EarlyStream,
        steps: Generator[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]], None, list[Any]],
        exact: list[FloatAudio],
    ) -> Iterator[tuple[FloatAudio, bool]]:
        """``_stream``'s loop with an early start (call inside its lock and error handling)."""
        while True:
            try:
                counts, hiddens = next(steps)
            except StopIteration as done:
                (result,) = done.value
                break
            audio = early.push(hiddens[0, : int(counts[0])])
            if audio.size:
                yield audible(audio), True
        audio = early.finish(result.hiddens)
        whole = audible(early.exact)
        if whole.size:
            exact.append(whole)
        self.last_early_start = early.report
        _LOGGER.debug(
            "ChatTTS ONNX, early start: first piece after %d codes, %d previews, %d "
            "approximate samples at %.1f dB against the exact audio",
            early.report.first_codes,
            early.report.previews,
            early.report.approximate,
            early.report.snr_db if early.report.snr_db is not None else math.nan,
        )
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
                raise EngineError(f"ChatTTS ONNX failed on {size(spoken[0])}: {exc}") from exc
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
