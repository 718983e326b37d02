"""ChatTTS voices served by their ONNX export (FP32) when one exists, torch otherwise.

Real models only: the tiny random checkpoint (tests/support/chattts_tiny.py) is trusted with the
model
manifest and exported with the real exporter, as `models add` and `models export` do; the pool
then chooses the backend, onnxruntime and ChatTTS (torch) really load, and the bridge answers
over a real mosquitto. The audio is noise; which engine made it, and under which cache key, is
what these tests check.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest
import yaml

from tests.support.chattts_tiny import NEEDS_CHATTTS_ONNX, tiny_hashes
from tests.support.harness import BridgeFactory, ProbeFactory, RunningBridge, threads_started_niced
from tts_bridge.cli.main import main
from tts_bridge.config import ConfigError, Settings, load_settings
from tts_bridge.engines import manifests
from tts_bridge.engines.base import EngineError
from tts_bridge.engines.chattts.common import ChatTTSOptions
from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
from tts_bridge.engines.chattts.onnx_format import MANIFEST_FILE
from tts_bridge.engines.chattts.pool import find_chattts_exports
from tts_bridge.engines.registry import EnginePool, manifest_hashes
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.synthesis import Synthesizer
from tts_bridge.system.hardware import Hardware
from tts_bridge.system.threads import plan_threads

BASE = "tts_bridge"
TEXT = "你好。"
WAIT_S = 120.0

pytestmark = NEEDS_CHATTTS_ONNX


@pytest.fixture(scope="module")
def library(
    tiny_checkpoint: Path, tiny_export_fp32: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A models folder as a user has it after `models add chattts` and `models export
    chattts --to models/chattts-onnx` (treat as read-only; copy it to change it)."""
    folder = tmp_path_factory.mktemp("onnx-backend") / "models"
    checkpoint = Path(shutil.copytree(tiny_checkpoint, folder / "chattts"))
    manifests.add_model("chattts", checkpoint, folder)
    # What `tts-bridge models export` does: verify the source against the manifest, export,
    # record the export. The session's export of the same checkpoint is that export.
    assert manifest_hashes(checkpoint, folder) == tiny_hashes(tiny_checkpoint)
    shutil.copytree(tiny_export_fp32, folder / "chattts-onnx")
    manifests.add_model("chattts-onnx", folder / "chattts-onnx", folder)
    return folder


@pytest.fixture
def copied(library: Path, tmp_path: Path) -> Path:
    """A private copy of the models folder (the user manifest's roots are relative)."""
    return Path(shutil.copytree(library, tmp_path / "models"))


def settings_for(models_dir: Path, tmp_path: Path, **voice: Any) -> Settings:
    return load_settings(
        None,
        {
            "models": {"dir": str(models_dir)},
            "cache": {"dir": str(tmp_path / "cache")},
            "synthesis": {"onnx_threads": 1},
            "voices": {"xiaoyu": {"engine": "chattts", "model": "chattts", **voice}},
            "default_voice": "xiaoyu",
            "voices_file": str(tmp_path / "voices.yaml"),
        },
        environ={},
    )


def say_over_mqtt(
    models_dir: Path,
    bridge_factory: BridgeFactory,
    probe_factory: ProbeFactory,
    request: dict[str, Any],
) -> tuple[RunningBridge, dict[str, Any], dict[str, Any]]:
    """Start the bridge with `models_dir` and the ChatTTS voice xiaoyu, wait for its
    bridge/info, send `request` to say/living; returns the bridge, the info and the answer."""
    bridge = bridge_factory(
        models={"dir": str(models_dir)},
        synthesis={"onnx_threads": 1, "onnx_spinning": "off"},
        voices={"xiaoyu": {"engine": "chattts", "model": "chattts"}},
        default_voice="xiaoyu",
        scheduler={"idle_enabled": False},
    )
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    info = probe.wait_for(lambda m: m.topic == f"{BASE}/bridge/info", WAIT_S).json()
    since = probe.mark()
    probe.publish(f"{BASE}/say/living", json.dumps(request))
    answer = probe.wait_for(
        lambda m: m.topic == f"{BASE}/bridge/response/say" and m.json()["id"] == request["id"],
        WAIT_S,
        since=since,
    ).json()
    return bridge, info, answer


# -- choosing the backend -------------------------------------------------------------------------


def test_export_of_the_checkpoint_is_found(library: Path) -> None:
    (export,) = find_chattts_exports(library)
    assert (export.name, export.recorded, export.folder) == (
        "chattts-onnx",
        True,
        (library / "chattts-onnx").resolve(),
    )
    assert export.source == manifest_hashes(library / "chattts", library)


def test_pool_serves_a_chattts_voice_with_the_fp32_export(library: Path, tmp_path: Path) -> None:
    settings = settings_for(library, tmp_path)
    pool = EnginePool(settings)
    voice = pool.voice("xiaoyu")
    assert isinstance(voice.engine, ChatTTSOnnxEngine)
    assert (voice.backend, voice.engine.name, voice.tier) == (
        "onnx",
        "chattts-onnx",
        "quality",
    )
    assert voice.engine.precision == "fp32"
    assert "chattts-onnx" in voice.backend_note and voice.backend_note.startswith("auto:")
    # Only the engine in use is listed: torch stays a fallback until it is needed.
    assert [e.name for e in pool.engines()] == ["chattts-onnx"]
    synth = Synthesizer(settings, pool, SentenceCache(settings.cache))
    try:
        rendering = synth.render(TEXT, "xiaoyu")
        assert (rendering.engine, rendering.tier, rendering.cached) == (
            "chattts-onnx",
            "quality",
            False,
        )
        assert synth.is_cached(voice, TEXT)
        assert pool.loaded() == [voice.engine.identity]
    finally:
        synth.cache.close()
        pool.unload_all()


def test_explicit_onnx_backend_uses_the_export(library: Path, tmp_path: Path) -> None:
    voice = EnginePool(settings_for(library, tmp_path, backend="onnx")).voice("xiaoyu")
    assert (voice.backend, voice.engine.name) == ("onnx", "chattts-onnx")
    assert voice.backend_note.startswith("onnx:")


def test_backend_torch_is_torch(library: Path, tmp_path: Path) -> None:
    voice = EnginePool(settings_for(library, tmp_path, backend="torch")).voice("xiaoyu")
    assert (voice.backend, voice.engine.name) == ("torch", "chattts")


def test_without_an_export_auto_is_torch_and_onnx_is_refused(copied: Path, tmp_path: Path) -> None:
    # An export of another checkpoint: its source hashes are not this checkpoint's.
    other = copied / "chattts-onnx"
    manifest = json.loads((other / MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest["source"]["sha256"]["asset/gpt/model.safetensors"] = "0" * 64
    (other / MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")

    voice = EnginePool(settings_for(copied, tmp_path)).voice("xiaoyu")
    assert (voice.backend, voice.engine.name) == ("torch", "chattts")
    assert "no ONNX export of this checkpoint" in voice.backend_note

    with pytest.raises(EngineError) as caught:
        EnginePool(settings_for(copied, tmp_path, backend="onnx"))
    message = str(caught.value)
    assert message.startswith("voices.xiaoyu.backend: onnx needs an ONNX export of")
    assert f"run: tts-bridge models export chattts --from {copied / 'chattts'}" in message

    shutil.rmtree(other)
    voice = EnginePool(settings_for(copied, tmp_path)).voice("xiaoyu")
    assert (voice.backend, voice.engine.name) == ("torch", "chattts")


def test_pool_passes_the_session_plan_to_the_onnx_engine(library: Path, tmp_path: Path) -> None:
    settings = settings_for(library, tmp_path)
    plan = plan_threads(
        # A container: 1.5 CPUs of 2, so automatic spinning is off.
        Hardware(
            architecture="x86_64",
            logical_cpus=2,
            usable_cpus=1,
            cpu_quota=1.5,
            memory_total_bytes=None,
            memory_limit_bytes=None,
            memory_available_bytes=None,
            board_model=None,
            cpu_model=None,
        ),
        arena=False,
    )
    pool = EnginePool(settings, plan=plan)
    assert (pool.session.intra_op_threads, pool.session.spinning, pool.session.arena) == (
        1,
        False,
        False,
    )
    engine = pool.voice("xiaoyu").engine
    # White-box: the engine keeps what it will give onnxruntime's SessionOptions.
    assert (engine._threads, engine._spinning, engine._arena) == (1, False, False)  # type: ignore[attr-defined]


# -- falling back to torch ---------------------------------------------------------------------


def test_tampered_graph_falls_back_to_torch_under_torch_cache_keys(
    copied: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graph = copied / "chattts-onnx" / "gpt.onnx"
    blob = bytearray(graph.read_bytes())
    blob[-1] ^= 0xFF
    graph.write_bytes(bytes(blob))

    settings = settings_for(copied, tmp_path)
    pool = EnginePool(settings)
    onnx_voice = pool.voice("xiaoyu")
    assert onnx_voice.backend == "onnx"  # chosen by the manifests; the graphs load later
    changes: list[str] = []
    # The bridge republishes its retained bridge/info through this hook.
    pool.on_change = lambda: changes.append(pool.voice("xiaoyu").backend or "")
    synth = Synthesizer(settings, pool, SentenceCache(settings.cache))
    try:
        options = synth.options_for(onnx_voice)
        with caplog.at_level(logging.ERROR, logger="tts_bridge.engines.registry"):
            piece = synth.sentence(onnx_voice, 0, TEXT, options, True)
        assert piece.pcm.size > 0 and not piece.cached
        assert "gpt.onnx" in caplog.text and "fall back to torch" in caplog.text
        assert changes == ["torch"]  # told once, after the switch

        torch_voice = pool.voice("xiaoyu")
        assert (torch_voice.backend, torch_voice.engine.name) == ("torch", "chattts")
        assert "failed to load" in torch_voice.backend_note
        assert "gpt.onnx: sha256 mismatch" in torch_voice.backend_note
        # Torch's audio is cached under torch's identity, never under the ONNX engine's.
        assert synth.is_cached(torch_voice, TEXT, options)
        assert not synth.is_cached(onnx_voice, TEXT, options)
        assert pool.loaded() == [torch_voice.engine.identity]
        assert synth.stats.rtf().keys() == {torch_voice.engine.identity}

        # A request validated before the switch still holds the ONNX voice: it is served by
        # torch too (from the cache here) and the failed graph is not loaded again.
        again = synth.sentence(onnx_voice, 0, TEXT, options, True)
        assert again.cached
        other = synth.sentence(onnx_voice, 0, "再见。", options, True)
        assert not other.cached and synth.is_cached(torch_voice, "再见。", options)
        assert not synth.is_cached(onnx_voice, "再见。", options)
        assert caplog.text.count("fall back to torch") == 1
    finally:
        synth.cache.close()
        pool.unload_all()


def test_explicit_onnx_backend_does_not_fall_back(copied: Path, tmp_path: Path) -> None:
    graph = copied / "chattts-onnx" / "gpt.onnx"
    with graph.open("ab") as handle:
        handle.write(b"\0")
    settings = settings_for(copied, tmp_path, backend="onnx")
    pool = EnginePool(settings)
    synth = Synthesizer(settings, pool, SentenceCache(settings.cache))
    try:
        with pytest.raises(EngineError, match=r"gpt\.onnx"):
            synth.render(TEXT, "xiaoyu")
        assert pool.voice("xiaoyu").backend == "onnx"
    finally:
        synth.cache.close()


# -- what users see -------------------------------------------------------------------------------


def test_voices_command_shows_the_backend(
    library: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    data = settings_for(library, tmp_path).model_dump(mode="json", exclude_defaults=True)
    data["voices"]["plain"] = {"engine": "chattts", "model": "chattts", "backend": "torch"}
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["voices", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    rows = {
        line.lstrip("* ").split()[0]: line.lstrip("* ").split()
        for line in out.splitlines()
        if not line.startswith("    ")
    }
    assert rows["xiaoyu"][1:4] == ["chattts-onnx", "onnx", "quality"]
    assert rows["plain"][1:4] == ["chattts", "torch", "quality"]
    assert "    backend onnx: auto: FP32 graphs of the ONNX export chattts-onnx" in out
    assert "    backend torch: set by the voice (backend: torch)" in out


def test_chattts_voice_with_an_export_answers_as_onnx_over_mqtt(
    copied: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge, info, answer = say_over_mqtt(
        copied, bridge_factory, probe_factory, {"text": TEXT, "id": "zh-onnx"}
    )
    assert info["voices"]["xiaoyu"]["engine"] == "chattts-onnx"
    assert info["voices"]["xiaoyu"]["tier"] == "quality"
    assert answer["status"] == "ok", answer
    assert (answer["data"]["engine"], answer["data"]["tier"], answer["data"]["voice"]) == (
        "chattts-onnx",
        "quality",
        "xiaoyu",
    )
    log = bridge.log_path.read_text(encoding="utf-8", errors="replace")
    assert "Voice xiaoyu: ChatTTS on onnx (auto: FP32 graphs" in log
    assert "onnxruntime sessions: sequential execution, spinning off" in log


# -- the INT8 fast tier of the same speaker ---------------------------------------------------


@pytest.fixture
def quantized(copied: Path) -> Path:
    """The copied models folder after `tts-bridge models quantize chattts-onnx`."""
    from tts_bridge.engines.chattts.quantize import quantize_onnx

    quantize_onnx(copied / "chattts-onnx")
    manifests.add_model("chattts-onnx", copied / "chattts-onnx", copied)
    return copied


def test_int8_variant_becomes_the_voices_fast_tier(quantized: Path, tmp_path: Path) -> None:
    pool = EnginePool(settings_for(quantized, tmp_path))
    quality, fast = pool.voice("xiaoyu"), pool.voice("xiaoyu_int8")
    assert quality.settings.fast_voice == "xiaoyu_int8"
    assert isinstance(fast.engine, ChatTTSOnnxEngine)
    assert isinstance(quality.engine, ChatTTSOnnxEngine)
    assert (fast.engine.precision, fast.tier, quality.engine.precision) == (
        "int8",
        "fast",
        "fp32",
    )
    # The same speaker: same embedding, same export.
    assert fast.speaker == quality.speaker
    assert fast.engine.identity != quality.engine.identity
    assert "fast tier xiaoyu_int8" in quality.backend_note


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_fast_voice_auto_is_the_int8_tier_or_heart(
    quantized: Path, tmp_path: Path, backend: str
) -> None:
    """What `voices new` writes: the INT8 tier when the voice is on its export, else heart."""
    settings = load_settings(
        None,
        {
            "models": {"dir": str(quantized)},
            "cache": {"dir": str(tmp_path / "cache")},
            "voices": {
                "xiaoyu": {
                    "engine": "chattts",
                    "model": "chattts",
                    "fast_voice": "auto",
                    "backend": backend,
                },
                "heart": {"engine": "hibari"},
            },
            "default_voice": "xiaoyu",
            "voices_file": str(tmp_path / "voices.yaml"),
        },
        environ={},
    )
    pool = EnginePool(settings)
    expected = "xiaoyu_int8" if backend == "auto" else "heart"
    assert pool.voice("xiaoyu").settings.fast_voice == expected
    assert ("xiaoyu_int8" in {v.name for v in pool}) is (backend == "auto")


def test_fast_voice_auto_is_only_for_chattts_voices(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump({"voices": {"joe": {"engine": "piper", "fast_voice": "auto"}}}),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"voices\.joe\.fast_voice: 'auto' is not a voice"):
        load_settings(config, {}, environ={})


def test_configured_fast_voice_or_torch_gets_no_int8_tier(quantized: Path, tmp_path: Path) -> None:
    configured = load_settings(
        None,
        {
            "models": {"dir": str(quantized)},
            "cache": {"dir": str(tmp_path / "cache")},
            "voices": {
                "xiaoyu": {"engine": "chattts", "model": "chattts", "fast_voice": "heart"},
                "heart": {"engine": "hibari"},
            },
            "default_voice": "xiaoyu",
            "voices_file": str(tmp_path / "voices.yaml"),
        },
        environ={},
    )
    pool = EnginePool(configured)
    assert pool.voice("xiaoyu").settings.fast_voice == "heart"
    assert "xiaoyu_int8" not in {v.name for v in pool}
    on_torch = EnginePool(settings_for(quantized, tmp_path, backend="torch"))
    assert {v.name for v in on_torch} == {"xiaoyu"}


def test_busy_chattts_voice_answers_with_its_int8_tier_over_mqtt(
    quantized: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    # A budget nothing can meet: the fast tier answers, in the same speaker.
    request = {"text": TEXT, "id": "zh-int8", "latency_budget_ms": 1}
    _bridge, info, answer = say_over_mqtt(quantized, bridge_factory, probe_factory, request)
    assert info["voices"]["xiaoyu"]["fast_voice"] == "xiaoyu_int8"
    assert answer["status"] == "ok", answer
    data = answer["data"]
    assert (data["engine"], data["tier"], data["voice"], data["requested_voice"]) == (
        "chattts-onnx",
        "fast",
        "xiaoyu_int8",
        "xiaoyu",
    )


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux only")
def test_refine_session_made_from_the_idle_thread_runs_at_normal_priority(
    library: Path, tmp_path: Path
) -> None:
    """The refine pass's onnxruntime session is made on first use, which may be idle work on
    the niced idle thread: its worker threads must not inherit that nice value (every later
    live request with refine_text would compute on them)."""
    settings = load_settings(
        None,
        {
            "models": {"dir": str(library)},
            "cache": {"dir": str(tmp_path / "cache")},
            # Two intra-op threads: onnxruntime starts a worker thread per session.
            "synthesis": {"onnx_threads": 2, "onnx_spinning": "off"},
            "voices": {"xiaoyu": {"engine": "chattts", "model": "chattts"}},
            "default_voice": "xiaoyu",
        },
        environ={},
    )
    pool = EnginePool(settings)
    engine = pool.voice("xiaoyu").engine
    assert isinstance(engine, ChatTTSOnnxEngine)
    pool.ensure_loaded(engine)
    normal = os.getpriority(os.PRIO_PROCESS, 0)
    outcome: list[int] = []

    def first_refine() -> None:
        options = ChatTTSOptions(refine_text=True, seed=3)
        outcome.append(len(engine.synthesize_batch(["the door is open"], None, options)))

    new = threads_started_niced(first_refine)
    assert outcome == [1]
    assert new, "the refine session started no thread (2 intra-op threads were asked for)"
    assert set(new.values()) == {normal}, new
    pool.unload_all()


def _cli_config(models_dir: Path, tmp_path: Path) -> Path:
    """A config file for the `models` commands on ``models_dir``."""
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump({"models": {"dir": str(models_dir)}, "cache": {"dir": str(tmp_path / "c")}}),
        encoding="utf-8",
    )
    return config


def _precision_voice(models_dir: Path, tmp_path: Path, name: str, precision: str) -> Settings:
    """Settings with one chattts-onnx voice ``name`` of the export at ``precision``."""
    voice = {"engine": "chattts-onnx", "model": "chattts-onnx", "precision": precision}
    return load_settings(
        None,
        {
            "models": {"dir": str(models_dir)},
            "cache": {"dir": str(tmp_path / "cache")},
            "synthesis": {"onnx_threads": 1},
            "voices": {name: voice},
            "default_voice": name,
            "voices_file": str(tmp_path / "voices.yaml"),
        },
        environ={},
    )


def test_models_quantize_int4_makes_a_voice_with_precision_int4_speak(
    copied: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`models quantize --int4 NAME`, then a chattts-onnx voice with precision int4 (the option
    for boards short of memory) is built by the pool and speaks."""
    config = _cli_config(copied, tmp_path)
    assert main(["models", "quantize", "--int4", "chattts-onnx", "--config", str(config)]) == 0
    assert "gpt.int4.onnx" in capsys.readouterr().out
    pool = EnginePool(_precision_voice(copied, tmp_path, "small", "int4"))
    voice = pool.voice("small")
    assert isinstance(voice.engine, ChatTTSOnnxEngine)
    assert voice.engine.precision == "int4" and ":int4:" in voice.engine.identity
    pool.ensure_loaded(voice.engine)
    (audio,) = voice.engine.synthesize("你好。", voice.speaker, ChatTTSOptions(seed=3))
    assert np.isfinite(audio).all() and audio.size > 0


def test_models_quantize_int8_all_makes_a_voice_with_precision_int8_all_speak(
    copied: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`models quantize --int8-all NAME` (on an FP32-only export: the INT8 GPT is made too),
    then a chattts-onnx voice with precision int8-all is built by the pool and speaks."""
    config = _cli_config(copied, tmp_path)
    args = ["models", "quantize", "chattts-onnx", "--config", str(config)]
    assert main([*args, "--int4", "--int8-all"]) == 2  # one variant per run
    assert main([*args, "--int8-all"]) == 0
    out = capsys.readouterr().out
    assert "gpt.int8.onnx" in out and "decoder_stream.int8.onnx" in out
    pool = EnginePool(_precision_voice(copied, tmp_path, "lean", "int8-all"))
    voice = pool.voice("lean")
    assert isinstance(voice.engine, ChatTTSOnnxEngine)
    assert voice.engine.precision == "int8-all" and ":int8-all:" in voice.engine.identity
    pool.ensure_loaded(voice.engine)  # verified against the re-recorded model manifest
    (audio,) = voice.engine.synthesize("你好。", voice.speaker, ChatTTSOptions(seed=3))
    assert np.isfinite(audio).all() and audio.size > 0
    pool.unload_all()


def test_models_quantize_of_hard_linked_files_is_one_line(
    copied: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """onnx refuses external data with more than one link; the command says what to do."""
    config = _cli_config(copied, tmp_path)
    export = copied / "chattts-onnx"
    for data in export.glob("*.onnx.data"):
        os.link(data, tmp_path / data.name)  # a second link, as a `cp -al` backup leaves
    assert main(["models", "quantize", "--int8-all", "chattts-onnx", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "hard links" in err and "cp -r" in err
    assert len(err.strip().splitlines()) == 1, err
