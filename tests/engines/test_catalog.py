"""The engine catalog: one declaration per kind, read by the config, the pool, routing, doctor.

A kind registered here, in the test, goes the whole way a built-in one does: the configuration
accepts it, the pool builds and verifies its model, the synthesizer speaks and caches with it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

from tts_bridge.cli.doctor import Status, check_voice
from tts_bridge.config import ConfigError, Settings, load_settings
from tts_bridge.engines import catalog
from tts_bridge.engines.base import EngineError, FloatAudio, SynthesisOptions
from tts_bridge.engines.catalog import EngineContext, EngineSpec
from tts_bridge.engines.manifests import add_model
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.routing import CostEstimator
from tts_bridge.speech.synthesis import RequestError, Synthesizer

RATE = 8000


@dataclass(frozen=True)
class ToneOptions(SynthesisOptions):
    octave: int = 0
    """Up this many octaves."""


class ToneEngine:
    """Speaks every sentence as a beep whose pitch (Hz) the model file holds."""

    name = "tone"
    languages = frozenset({"en"})

    def __init__(self, model: Path, sha256: str, threads: int) -> None:
        self.model = model
        self.threads = threads
        self._sha256 = sha256
        self._hz: float | None = None
        self._lock = threading.Lock()

    @property
    def sample_rate(self) -> int:
        return RATE

    @property
    def identity(self) -> str:
        return f"tone:{self.model.stem}:{self._sha256[:16]}"

    @property
    def loaded(self) -> bool:
        return self._hz is not None

    def load(self) -> None:
        with self._lock:
            self._hz = float(self.model.read_text(encoding="utf-8"))

    @staticmethod
    def prepare_text(text: str) -> str:
        return text

    def synthesize(
        self, text: str, speaker: str | None, options: SynthesisOptions
    ) -> Iterator[FloatAudio]:
        assert self._hz is not None and isinstance(options, ToneOptions)
        seconds = 0.05 * len(text) / options.speed
        t = np.arange(int(RATE * seconds), dtype=np.float32) / RATE
        yield (0.5 * np.sin(2 * np.pi * self._hz * 2**options.octave * t)).astype(np.float32)

    def unload(self) -> None:
        with self._lock:
            self._hz = None


class ToneVoiceOptions(BaseModel):
    """The voice keys only tone takes."""

    model_config = ConfigDict(extra="forbid")

    waveform: Literal["sine", "square"] = "sine"
    detune_hz: float = Field(0.0, ge=-50.0, le=50.0)


def _build(context: EngineContext) -> ToneEngine:
    return ToneEngine(
        context.model, context.sha256(context.model), context.session.intra_op_threads
    )


@pytest.fixture
def bundled(tmp_path: Path) -> Path:
    path = tmp_path / "bundled" / "a440.tone"
    path.parent.mkdir()
    path.write_text("440", encoding="utf-8")
    return path


@pytest.fixture
def tone(bundled: Path) -> Iterator[EngineSpec]:
    spec = catalog.register(
        EngineSpec(
            kind="tone",
            build=_build,
            tier="fast",
            seed_seconds_per_char=0.125,
            languages=frozenset({"en"}),
            bundled_model=lambda: bundled,
            options=ToneOptions,
            voice_options=ToneVoiceOptions,
        )
    )
    yield spec
    catalog.unregister("tone")


def _settings(tmp_path: Path, voices: dict[str, object]) -> Settings:
    return load_settings(
        None,
        {
            "models": {"dir": str(tmp_path / "models")},
            "cache": {"dir": str(tmp_path / "cache")},
            "voices": voices,
            "default_voice": next(iter(voices)),
            "voices_file": str(tmp_path / "voices.yaml"),
        },
        environ={},
    )


def test_unknown_engine_lists_the_known_kinds(tmp_path: Path) -> None:
    with pytest.raises(catalog.UnknownEngineError) as caught:
        catalog.spec("espeak")
    assert (
        str(caught.value)
        == "unknown engine 'espeak'; known: chattts, chattts-onnx, hibari, kokoro, kokoro-en, piper"
    )
    with pytest.raises(
        ConfigError, match=r"voices\.x\.engine: .*unknown engine 'espeak'; known: ch"
    ):
        _settings(tmp_path, {"x": {"engine": "espeak"}})


def test_builtin_kinds_are_declared() -> None:
    assert catalog.kinds() == ["chattts", "chattts-onnx", "hibari", "kokoro", "kokoro-en", "piper"]
    tiers = {kind: catalog.spec(kind).tier for kind in catalog.kinds()}
    assert tiers == {
        "chattts": "quality",
        "chattts-onnx": "fast",
        "hibari": "fast",
        "kokoro": "fast",
        "kokoro-en": "fast",
        "piper": "quality",
    }
    # Only the engines that ship a model have one to fall back to.
    assert [k for k in catalog.kinds() if catalog.spec(k).bundled_model] == [
        "hibari",
        "kokoro",
        "kokoro-en",
        "piper",
    ]


def test_a_kind_is_registered_once(tone: EngineSpec) -> None:
    assert catalog.register(tone) is tone  # the same declaration again: a no-op
    with pytest.raises(ValueError, match="'tone' is registered twice"):
        catalog.register(EngineSpec("tone", _build, "quality", 0.1, None))


def test_a_registered_kind_is_configured_built_and_spoken(
    tone: EngineSpec, bundled: Path, tmp_path: Path
) -> None:
    settings = _settings(
        tmp_path,
        {"beep": {"engine": "tone"}, "loud": {"engine": "tone", "tier": "quality"}},
    )
    pool = EnginePool(settings, threads=3)
    beep, loud = pool.voice("beep"), pool.voice("loud")
    engine = beep.engine
    assert isinstance(engine, ToneEngine)
    assert (engine.model, engine.threads) == (bundled, 3)  # the bundled model, the pool's plan
    assert loud.engine is engine  # one engine per model, shared by its voices
    assert (beep.tier, loud.tier) == ("fast", "quality")  # each voice reports its own tier
    # Its declared seed cost routes the first request.
    assert CostEstimator().seconds("tone", engine.identity, 8) == 1.0
    # Its model file goes through the same manifest check as Piper's.
    with pytest.raises(EngineError, match="not in the model manifest"):
        pool.ensure_loaded(engine)
    add_model("a440", bundled, settings.models.dir)
    pool = EnginePool(settings)
    synth = Synthesizer(settings, pool, SentenceCache(settings.cache))
    try:
        rendering = synth.render("Beep beep.", "beep")
        assert (rendering.engine, rendering.tier, rendering.sample_rate) == ("tone", "fast", RATE)
        assert rendering.duration_ms == pytest.approx(500, abs=5)
        assert synth.render("Beep beep.", "beep").cached
        # Its options are the declared type: its own field is taken, others refused.
        higher = synth.options_for(pool.voice("beep"), {"octave": 1})
        assert isinstance(higher, ToneOptions) and higher.octave == 1
        with pytest.raises(RequestError, match="tone options are speed, octave") as caught:
            synth.options_for(pool.voice("beep"), {"temperature": 0.5})
        # In the bridge's words: the option and the voice named, no Python wording.
        assert "unknown option 'temperature' for voice beep" in str(caught.value)
        assert "keyword argument" not in str(caught.value)
    finally:
        synth.cache.close()


def test_engine_specific_voice_keys_are_refused_for_other_kinds(
    tone: EngineSpec, tmp_path: Path
) -> None:
    with pytest.raises(
        ConfigError, match=r"voices\.x\.backend: 'torch' is only for engine chattts"
    ):
        _settings(tmp_path, {"x": {"engine": "tone", "backend": "torch"}})
    with pytest.raises(
        ConfigError, match=r"voices\.x\.spk_emb: is only for engine chattts or chattts-onnx"
    ):
        _settings(tmp_path, {"x": {"engine": "tone", "spk_emb": "x", "spk_emb_sha256": "0"}})
    with pytest.raises(ConfigError, match=r"voices\.x\.fast_voice: 'auto' is not a voice"):
        _settings(tmp_path, {"x": {"engine": "tone", "fast_voice": "auto"}})


def test_a_kind_declares_its_own_voice_options(tone: EngineSpec, tmp_path: Path) -> None:
    # Written beside the keys every voice has, read through the kind's own schema.
    settings = _settings(tmp_path, {"beep": {"engine": "tone", "waveform": "square"}})
    assert settings.voices["beep"].engine_options() == {"waveform": "square"}
    # From the environment too: the kind's schema converts the text.
    voices = {"beep": {"engine": "tone"}, "joe": {"engine": "piper"}}
    from_env = load_settings(
        None,
        {"voices": voices, "default_voice": "beep", "voices_file": str(tmp_path / "v.yaml")},
        environ={"TTS_BRIDGE_VOICES__BEEP__DETUNE_HZ": "2.5"},
    )
    given = ToneVoiceOptions.model_validate(from_env.voices["beep"].engine_options())
    assert (given.waveform, given.detune_hz) == ("sine", 2.5)
    # Errors name the key, in the schema's words or the bridge's.
    for voice, match in (
        ({"engine": "tone", "waveform": "saw"}, r"voices\.x\.waveform: Input should be 'sine'"),
        ({"engine": "tone", "detune_hz": 99}, r"voices\.x\.detune_hz: Input should be less"),
        (
            {"engine": "piper", "waveform": "square"},
            r"voices\.x\.waveform: 'square' is only for engine tone",
        ),
        (
            {"engine": "tone", "wavefrom": "sine"},
            r"voices\.x\.wavefrom: unknown key \(did you mean 'waveform'\?\)",
        ),
    ):
        with pytest.raises(ConfigError, match=match):
            _settings(tmp_path, {"x": voice})
    # Another kind's key at its default means "not set" (the example file writes every key).
    quiet = _settings(tmp_path, {"x": {"engine": "piper", "waveform": "sine", "backend": "auto"}})
    assert quiet.voices["x"].engine_options() == {}


def test_a_kind_without_a_bundled_model_needs_one(tmp_path: Path) -> None:
    settings = _settings(tmp_path, {"x": {"engine": "chattts-onnx"}})
    with pytest.raises(EngineError, match="a chattts-onnx voice needs 'model': the export folder"):
        EnginePool(settings)


def test_doctor_checks_a_registered_kind(tone: EngineSpec, tmp_path: Path) -> None:
    settings = _settings(
        tmp_path, {"beep": {"engine": "tone"}, "named": {"engine": "tone", "model": "x.tone"}}
    )
    result, voice = check_voice(settings, "beep", threads=1)
    assert result.status is Status.PASS and voice is not None
    assert result.detail.startswith("tone, fast tier, en, 8000 Hz (default); model a440.tone")
    # A model the voice names is looked for under models.dir, as the pool does.
    assert catalog.model_path(settings.voices["named"], settings.models.dir) == (
        settings.models.dir / "x.tone"
    )
    missing, none = check_voice(settings, "named", threads=1)
    assert (missing.status, none) == (Status.FAIL, None)
    assert f"{settings.models.dir / 'x.tone'} does not exist" in missing.detail


def test_a_model_file_swapped_after_start_is_refused_at_the_next_load(
    tone: EngineSpec, bundled: Path, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, {"beep": {"engine": "tone"}})
    add_model("a440", bundled, settings.models.dir)
    pool = EnginePool(settings)
    synth = Synthesizer(settings, pool, SentenceCache(settings.cache))
    try:
        assert not synth.render("Beep.", "beep").cached
        pool.unload_all()  # as after an idle unload
        before = bundled.stat()
        bundled.write_text("880", encoding="utf-8")  # same size, and the mtime set back
        os.utime(bundled, ns=(before.st_atime_ns, before.st_mtime_ns))
        with pytest.raises(EngineError, match=rf"{bundled}: sha256 mismatch"):
            synth.render("Beep again.", "beep", use_cache=False)
        assert not pool.loaded(), "a swapped model must not be loaded"
        # What is cached was made by the verified model: still served, without a load.
        assert synth.render("Beep.", "beep").cached
        bundled.write_text("440", encoding="utf-8")  # restored: trusted again
        assert synth.render("Beep again.", "beep", use_cache=False).duration_ms > 0
        assert pool.loaded() == [pool.voice("beep").engine.identity]
    finally:
        synth.cache.close()


class _ChineseTone(ToneEngine):
    name = "zhtone"
    languages = frozenset({"zh"})


class _BilingualTone(ToneEngine):
    name = "bigtone"
    languages = frozenset({"zh", "en"})


@pytest.fixture
def auto_kinds(bundled: Path) -> Iterator[None]:
    """A slow bilingual kind whose voices may say fast_voice: auto, and a quick Chinese one."""

    def build(cls: type[ToneEngine]) -> Callable[[EngineContext], ToneEngine]:
        def make(context: EngineContext) -> ToneEngine:
            return cls(
                context.model, context.sha256(context.model), context.session.intra_op_threads
            )

        return make

    catalog.register(
        EngineSpec(
            kind="bigtone",
            build=build(_BilingualTone),
            tier="quality",
            seed_seconds_per_char=1.0,
            languages=frozenset({"zh", "en"}),
            bundled_model=lambda: bundled,
            options=ToneOptions,
            auto_fast_voice=True,
        )
    )
    catalog.register(
        EngineSpec(
            kind="zhtone",
            build=build(_ChineseTone),
            tier="fast",
            seed_seconds_per_char=0.01,
            languages=frozenset({"zh"}),
            bundled_model=lambda: bundled,
            options=ToneOptions,
            voice_options=ToneVoiceOptions,
        )
    )
    yield
    catalog.unregister("bigtone")
    catalog.unregister("zhtone")


def test_fast_voice_auto_picks_a_quick_voice_that_speaks_the_language(
    auto_kinds: None, tmp_path: Path
) -> None:
    settings = _settings(
        tmp_path,
        {"big": {"engine": "bigtone", "fast_voice": "auto"}, "huayan": {"engine": "zhtone"}},
    )
    pool = EnginePool(settings)
    big, huayan = pool.voice("big"), pool.voice("huayan")
    assert pool.fast_voice_for(big, "zh") is huayan
    assert pool.fast_voice_for(big, "en") is None  # nothing quicker speaks English
    assert pool.fast_voice_for(huayan, "zh") is None  # no fast voice configured: none
    # A voice that names its fast voice keeps it, whatever the language.
    named = _settings(
        tmp_path,
        {"big": {"engine": "bigtone", "fast_voice": "huayan"}, "huayan": {"engine": "zhtone"}},
    )
    pool = EnginePool(named)
    assert pool.fast_voice_for(pool.voice("big"), "en") is pool.voice("huayan")
