"""The kokoro engine on the real INT8 model (the four wheels the bridge installs) and the
shipped voice vectors: lazy loading, the hash checks, speed, silence trimming."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tts_bridge.config import ConfigError, Settings, load_settings
from tts_bridge.engines import kokoro
from tts_bridge.engines.base import EngineError, FloatAudio, SynthesisOptions
from tts_bridge.engines.catalog import EngineContext
from tts_bridge.engines.registry import EnginePool

TEXT = "明天早上七点半提醒我开会。"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> EnginePool:
    models = tmp_path_factory.mktemp("kokoro-models")
    settings = Settings.model_validate(
        {"models": {"dir": str(models)}, "synthesis": {"onnx_threads": 1}}
    )
    return EnginePool(settings)


def _engine(pool: EnginePool) -> kokoro.KokoroEngine:
    """A new engine of the bundled model, outside the pool."""
    context = EngineContext(
        kokoro.bundled_model(), "int8", None, lambda _: "", pool.session, pool.on_loader
    )
    return kokoro.KokoroEngine(context)


def _speak(pool: EnginePool, text: str, speed: float = 1.0) -> FloatAudio:
    voice = pool.voice("xiaobei")
    pool.ensure_loaded(voice.engine)
    chunks = list(voice.engine.synthesize(text, voice.speaker, SynthesisOptions(speed=speed)))
    return np.concatenate(chunks)


def test_default_install_has_a_chinese_voice_that_loads_lazily(pool: EnginePool) -> None:
    voice = pool.voice("xiaobei")
    assert voice.engine.name == "kokoro" and voice.engine.languages == {"zh"}
    assert voice.speaker == "zf_xiaobei"
    assert voice.engine.sample_rate == 24_000
    # The identity names the joined model's published hash (it goes into cache keys).
    assert voice.engine.identity == f"kokoro:v1.0-int8:{kokoro.MODEL_SHA256[:16]}"
    assert pool.engine("kokoro", None, "int8") is voice.engine
    assert not _engine(pool).loaded  # building an engine loads nothing


def test_speaks_chinese_trimmed_and_at_the_requested_speed(pool: EnginePool) -> None:
    normal = _speak(pool, TEXT)
    assert pool.voice("xiaobei").engine.loaded
    assert normal.dtype == np.float32 and np.abs(normal).max() <= 1.0
    seconds = len(normal) / kokoro.SAMPLE_RATE
    assert 1.0 < seconds < 10.0, seconds
    # Trimmed: sound starts and ends within the kept margin of each edge.
    edge = int(0.06 * kokoro.SAMPLE_RATE)
    assert np.abs(normal[:edge]).max() > 0.01
    assert np.abs(normal[-edge:]).max() > 0.01
    fast = _speak(pool, TEXT, speed=1.5)
    assert len(fast) < 0.85 * len(normal)


def test_trim_silence_keeps_a_margin_and_empties_silence() -> None:
    rate = kokoro.SAMPLE_RATE
    audio = np.zeros(rate, dtype=np.float32)
    audio[rate // 2 : rate // 2 + 100] = 0.5
    trimmed = kokoro.trim_silence(audio)
    margin = int(0.03 * rate)
    assert len(trimmed) == 100 + 2 * margin
    assert kokoro.trim_silence(np.zeros(100, dtype=np.float32)).size == 0


def test_long_phonemes_are_split_at_punctuation() -> None:
    phonemes = ", ".join(["ni↓xau↓"] * 200)
    pieces = kokoro.split_phonemes(phonemes, limit=100)
    assert all(len(p) <= 100 for p in pieces)
    assert "".join(p.replace(" ", "") for p in pieces) == phonemes.replace(" ", "")
    assert kokoro.split_phonemes("abc") == ["abc"]


def test_damaged_model_part_is_refused(
    pool: EnginePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = {}
    for package in kokoro.MODEL_PARTS:
        copy = tmp_path / package / "part.bin"
        copy.parent.mkdir()
        shutil.copyfile(kokoro._part_path(package), copy)
        parts[package] = copy
    damaged = bytearray(parts[kokoro.MODEL_PARTS[2]].read_bytes())
    damaged[1000] ^= 0xFF
    parts[kokoro.MODEL_PARTS[2]].write_bytes(bytes(damaged))
    bundled = kokoro.bundled_model()
    monkeypatch.setattr(kokoro, "_part_path", lambda package: parts[package])
    monkeypatch.setattr(kokoro, "bundled_model", lambda: bundled)
    engine = _engine(pool)
    with pytest.raises(EngineError, match=f"damaged: expected sha256 {kokoro.MODEL_SHA256}"):
        engine.load()
    assert not engine.loaded


def test_changed_voice_file_is_refused(
    pool: EnginePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = Path(shutil.copytree(kokoro.voice_dir(), tmp_path / "voices"))
    vectors = bytearray((folder / "zf_xiaobei.bin").read_bytes())
    vectors[0] ^= 0x01
    (folder / "zf_xiaobei.bin").write_bytes(bytes(vectors))
    monkeypatch.setattr(kokoro, "voice_dir", lambda: folder)
    engine = pool.voice("xiaobei").engine
    assert isinstance(engine, kokoro.KokoroEngine)
    engine._styles.clear()
    with pytest.raises(EngineError, match=r"zf_xiaobei\.bin was changed: expected sha256"):
        engine.style("zf_xiaobei")
    assert engine.style("zf_xiaoxiao").shape == (510, 256)  # the other voices still load


def test_unknown_speaker_is_refused_by_the_configuration(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("voices:\n  x:\n    engine: kokoro\n    speaker: zf_nobody\n", "utf-8")
    with pytest.raises(ConfigError, match="kokoro has no speaker 'zf_nobody'; shipped: zf_xiaobei"):
        load_settings(config, environ={})


def test_english_voices_are_their_own_kind(tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "models": {"dir": str(tmp_path)},
            "synthesis": {"onnx_threads": 1},
            "voices": {"af_heart": {"engine": "kokoro-en", "speaker": "af_heart"}},
            "default_voice": "af_heart",
        }
    )
    pool = EnginePool(settings)
    voice = pool.voice("af_heart")
    assert voice.engine.name == "kokoro-en" and voice.engine.languages == {"en"}
    assert voice.engine.identity.startswith("kokoro-en:v1.0-int8:")
    pool.ensure_loaded(voice.engine)
    chunks = list(voice.engine.synthesize("The door is open.", voice.speaker, SynthesisOptions()))
    assert len(np.concatenate(chunks)) / kokoro.SAMPLE_RATE > 0.5


def test_a_voice_of_the_other_language_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("voices:\n  x:\n    engine: kokoro-en\n    speaker: zf_xiaobei\n", "utf-8")
    with pytest.raises(ConfigError, match="kokoro-en has no speaker 'zf_xiaobei'"):
        load_settings(config, environ={})
    config.write_text("voices:\n  x:\n    engine: kokoro\n    speaker: af_heart\n", "utf-8")
    with pytest.raises(ConfigError, match="kokoro has no speaker 'af_heart'"):
        load_settings(config, environ={})
