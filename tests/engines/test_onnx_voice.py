"""Every ONNX voice engine (piper, hibari, kokoro) builds its session from the pool's whole
thread plan: the real bundled models load, and the ``SessionOptions`` their sessions hold are
read back from onnxruntime."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tts_bridge.config import Settings
from tts_bridge.engines import hibari, kokoro, piper
from tts_bridge.engines.onnx_voice import OnnxVoice
from tts_bridge.engines.registry import EnginePool

SPINNING = "session.intra_op.allow_spinning"


def _sessions(engine: OnnxVoice) -> tuple[Any, ...]:
    """The onnxruntime sessions inside the engine's loaded runtime (Piper's model in halves)."""
    runtime = engine.runtime()
    if isinstance(engine, piper.PiperEngine):
        return tuple(runtime.sessions)
    if isinstance(engine, hibari.HibariEngine):
        return (runtime.sess,)
    return (runtime,)


@pytest.mark.parametrize(
    ("threads", "spinning", "arena"),
    [(2, "off", False), (1, "on", True)],
    ids=["2-threads-no-spin-no-arena", "1-thread-spin-arena"],
)
@pytest.mark.parametrize("kind", ["piper", "hibari", "kokoro"])
def test_the_whole_plan_reaches_the_session(
    kind: str, threads: int, spinning: str, arena: bool, tmp_path: Path
) -> None:
    settings = Settings.model_validate(
        {
            "models": {"dir": str(tmp_path / "models")},
            "synthesis": {
                "onnx_threads": threads,
                "onnx_spinning": spinning,
                "onnx_arena": arena,
            },
        }
    )
    pool = EnginePool(settings)
    engine = pool.engine(kind, None, "int8")
    assert isinstance(engine, OnnxVoice)
    assert engine.plan == pool.session
    assert not engine.loaded
    sessions = _sessions(engine)
    assert len(sessions) == (2 if kind == "piper" else 1)
    for number, session in enumerate(sessions):
        options = session.get_session_options()
        assert options.intra_op_num_threads == threads
        assert options.inter_op_num_threads == pool.session.inter_op_threads == 1
        # Piper's first half never spins (the second runs right after it on the same cores).
        spins = spinning == "on" and not (kind == "piper" and number == 0)
        assert options.get_session_config_entry(SPINNING) == ("1" if spins else "0")
        assert options.enable_cpu_mem_arena is arena
    engine.unload()
    assert not engine.loaded


def test_identity_names_the_model_files_hash(tmp_path: Path) -> None:
    pool = EnginePool(Settings.model_validate({"models": {"dir": str(tmp_path)}}))
    for kind, bundled in (("piper", piper.bundled_model()), ("hibari", hibari.bundled_model())):
        digest = hashlib.sha256(bundled.read_bytes()).hexdigest()
        assert pool.engine(kind, None, "int8").identity == f"{kind}:{bundled.stem}:{digest[:16]}"
    assert pool.engine("kokoro", None, "int8").identity == (
        f"kokoro:v1.0-int8:{kokoro.MODEL_SHA256[:16]}"
    )
