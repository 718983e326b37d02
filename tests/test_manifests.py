"""The model manifest: bundled and user manifests, streamed hashing, verification, CLI handlers.

Everything runs on real files: the installed Piper and hibari packages, the tiny ChatTTS
checkpoint (tests/support/chattts_tiny.py) copied to a temporary models.dir, and a sparse 200 MB
file
for the memory bound of hashing.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tts_bridge.cli.models import cmd_models_add, cmd_models_list, cmd_models_verify
from tts_bridge.config import Settings, load_settings
from tts_bridge.engines.manifests import (
    USER_MANIFEST,
    FileHasher,
    ManifestError,
    ModelFileError,
    add_model,
    bundled_manifests,
    expected_hashes,
    find_manifest,
    load_manifests,
    sha256_file,
    verify_all,
    verify_file,
)

MiB = 1 << 20
REPO_ROOT = Path(__file__).resolve().parents[1]


def _settings(models_dir: Path) -> Settings:
    return load_settings(None, {"models": {"dir": str(models_dir)}}, environ={})


def _counting(calls: list[Path]) -> Callable[[Path], str]:
    """The real streamed hasher, recording which files it was asked to read."""

    def hasher(path: Path) -> str:
        calls.append(path)
        return sha256_file(path)

    return hasher


def _flip_last_byte(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 0xFF]))


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


# -- bundled models -------------------------------------------------------------------------------


def test_bundled_piper_and_hibari_verify_clean(models_dir: Path) -> None:
    manifests = load_manifests(models_dir)
    assert {"piper-en_US-joe-medium", "hibari-heart"} <= set(manifests)
    assert all(m.origin == "bundled" for m in manifests.values())
    assert verify_all(models_dir) == []


def test_bundled_manifests_cover_the_files_the_engines_load(models_dir: Path) -> None:
    from tts_bridge.engines import hibari, piper

    joe = find_manifest(piper.bundled_model(), models_dir)
    assert joe is not None and joe.name == "piper-en_US-joe-medium"
    config = Path(f"{piper.bundled_model()}.json")
    assert find_manifest(config, models_dir) == joe
    heart = find_manifest(hibari.bundled_model(), models_dir)
    assert heart is not None and heart.name == "hibari-heart"
    # hibari reads its G2P data from the same assets folder; all of it is recorded.
    assets = hibari.bundled_model().parent
    recorded = {heart.folder(models_dir) / f.path for f in heart.files}
    assert recorded == {p for p in assets.iterdir() if p.is_file()}


def test_bundled_manifests_agree_with_the_wheels_own_record() -> None:
    """An independent source: the hashes pip recorded when it installed each package."""
    for manifest in bundled_manifests().values():
        assert manifest.root.distribution is not None and manifest.root.package is not None
        record = {str(f): f for f in importlib.metadata.files(manifest.root.distribution) or []}
        for entry in manifest.files:
            installed = record[f"{manifest.root.package}/{entry.path}"]
            assert installed.hash is not None
            digest = base64.urlsafe_b64decode(installed.hash.value + "==").hex()
            assert (digest, installed.size) == (entry.sha256, entry.size), entry.path


# -- adding user models ---------------------------------------------------------------------------


def test_add_folder_records_every_file(models_dir: Path) -> None:
    folder = models_dir / "voice-pack"
    contents = {
        "model.onnx": b"\x00\x01" * 5000,
        "model.onnx.json": b'{"audio": {"sample_rate": 22050}}',
        "sub/deeper/weights.bin": bytes(range(256)) * 10,
        "sub/empty.txt": b"",
        "manifest.json": b'{"a model": "may ship its own file of this name"}',
    }
    for rel, data in contents.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)

    manifest = add_model("voice-pack", folder, models_dir)

    assert manifest.root.dir == "voice-pack"  # relative: models.dir can move as a whole
    assert {f.path: (f.size, f.sha256) for f in manifest.files} == {
        rel: (len(data), hashlib.sha256(data).hexdigest()) for rel, data in contents.items()
    }
    assert verify_all(models_dir) == []

    # models.dir itself as a model: its files, but not the manifest's own bookkeeping.
    everything = add_model("everything", models_dir, models_dir)
    assert {f.path for f in everything.files} == {f"voice-pack/{rel}" for rel in contents}


def test_add_outside_models_dir_records_an_absolute_root(tmp_path: Path, models_dir: Path) -> None:
    outside = tmp_path / "elsewhere" / "voice.onnx"
    outside.parent.mkdir()
    outside.write_bytes(b"onnx")
    (outside.parent / "voice.onnx.json").write_text("{}", encoding="utf-8")
    (outside.parent / "unrelated.txt").write_text("not part of the model", encoding="utf-8")

    manifest = add_model("amy", outside, models_dir)

    assert manifest.root.dir == str(outside.parent.resolve())
    # A Piper voice is loaded with the .onnx.json beside it; both are recorded, nothing else.
    assert [f.path for f in manifest.files] == ["voice.onnx", "voice.onnx.json"]
    assert find_manifest(outside, models_dir) == manifest


def test_user_manifest_survives_a_reopen(tmp_path: Path, models_dir: Path) -> None:
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.bin").write_bytes(name.encode() * 100)
    first = add_model("first", tmp_path / "first", models_dir)
    second = add_model("second", tmp_path / "second", models_dir)

    reopened = load_manifests(models_dir)

    assert reopened["first"] == first
    assert reopened["second"] == second
    data = json.loads((models_dir / USER_MANIFEST).read_text(encoding="utf-8"))
    assert sorted(data["models"]) == ["first", "second"]
    # The atomic write leaves no temporary file behind.
    assert sorted(p.name for p in models_dir.iterdir() if not p.name.startswith(".")) == [
        USER_MANIFEST
    ]
    assert not list(models_dir.glob("*.tmp"))


def test_adding_a_name_again_replaces_its_entry(tmp_path: Path, models_dir: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"version one")
    add_model("mine", model, models_dir)
    model.write_bytes(b"version two, re-trusted")
    assert verify_all(models_dir)  # changed since it was recorded

    again = add_model("mine", model, models_dir)

    assert verify_all(models_dir) == []
    assert expected_hashes("mine", models_dir) == {
        "model.bin": hashlib.sha256(b"version two, re-trusted").hexdigest()
    }
    assert load_manifests(models_dir)["mine"] == again


def test_add_refuses_bad_names_bundled_names_and_missing_paths(
    tmp_path: Path, models_dir: Path
) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"x")
    with pytest.raises(ManifestError, match="must match"):
        add_model("../escape", model, models_dir)
    with pytest.raises(ManifestError, match="bundled model"):
        add_model("hibari-heart", model, models_dir)
    with pytest.raises(ManifestError, match="no such file or folder"):
        add_model("ghost", tmp_path / "nothing-here", models_dir)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ManifestError, match="holds no files"):
        add_model("empty", tmp_path / "empty", models_dir)
    assert not (models_dir / USER_MANIFEST).exists()


def test_damaged_or_crafted_user_manifests_are_refused(models_dir: Path) -> None:
    models_dir.mkdir()
    path = models_dir / USER_MANIFEST
    path.write_text('{"format": "tts-bridge-models", "version": 1, "models": {', "utf-8")
    with pytest.raises(ManifestError, match="not valid JSON") as caught:
        load_manifests(models_dir)
    assert str(path) in str(caught.value)

    def entry(file_path: str) -> dict[str, object]:
        return {"root": {"dir": "x"}, "files": [{"path": file_path, "size": 1, "sha256": "0" * 64}]}

    for bad in ("../../etc/passwd", "/etc/passwd"):
        manifest = {"format": "tts-bridge-models", "version": 1, "models": {"x": entry(bad)}}
        path.write_text(json.dumps(manifest), "utf-8")
        with pytest.raises(ManifestError, match="relative path inside"):
            load_manifests(models_dir)
    clash = {"format": "tts-bridge-models", "version": 1, "models": {"hibari-heart": entry("a")}}
    path.write_text(json.dumps(clash), "utf-8")
    with pytest.raises(ManifestError, match="name of a bundled model"):
        load_manifests(models_dir)


def test_unknown_model_names_the_known_ones(models_dir: Path) -> None:
    with pytest.raises(ManifestError, match=r"known: hibari-heart, kokoro-v1\.0-int8-part1, "):
        expected_hashes("nope", models_dir)


# -- verification -----------------------------------------------------------------------------


def test_size_mismatch_is_caught_without_hashing(tmp_path: Path, models_dir: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"a" * 4096)
    digest = sha256_file(model)
    calls: list[Path] = []

    with pytest.raises(ModelFileError) as caught:
        verify_file(model, digest, 4095, hasher=_counting(calls))
    assert caught.value.kind == "size differs"
    assert "expected 4095 bytes, actual 4096 bytes" in str(caught.value)
    assert str(model) in str(caught.value)
    assert calls == []

    add_model("mine", model, models_dir)
    with model.open("r+b") as handle:
        handle.truncate(1000)  # a download cut short
    problems = verify_all(models_dir, hasher=_counting(calls))
    assert [(p.model, p.path, p.kind) for p in problems] == [("mine", model, "size differs")]
    assert model not in calls  # only the bundled files were hashed


def test_missing_file_is_reported(tmp_path: Path, models_dir: Path) -> None:
    folder = tmp_path / "pack"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"a")
    (folder / "b.bin").write_bytes(b"b")
    add_model("pack", folder, models_dir)
    (folder / "b.bin").unlink()

    problems = verify_all(models_dir)

    assert [(p.path, p.kind) for p in problems] == [(folder / "b.bin", "missing")]
    assert hashlib.sha256(b"b").hexdigest() in problems[0].expected


def test_hash_mismatch_names_file_expected_and_actual(tmp_path: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"good")
    good = sha256_file(model)
    model.write_bytes(b"evil")
    bad = sha256_file(model)
    with pytest.raises(ModelFileError) as caught:
        verify_file(model, good, 4)
    message = str(caught.value)
    assert caught.value.kind == "sha256 mismatch"
    assert str(model) in message and good in message and bad in message


def test_hashing_never_reads_a_whole_file_into_memory(tmp_path: Path, models_dir: Path) -> None:
    """A sparse 200 MB file costs no disk; hashing it must still stay within a few MiB."""
    big = tmp_path / "big" / "weights.bin"
    big.parent.mkdir()
    with big.open("wb") as handle:
        handle.truncate(200 * MiB)
    digest = hashlib.sha256()
    for _ in range(200):
        digest.update(bytes(MiB))
    expected = digest.hexdigest()

    # In a fresh interpreter: tracemalloc counts every thread's allocations, and a test process
    # (a parallel worker above all) may still have another test's threads winding down.
    code = f"""
import json, sys, tracemalloc
from pathlib import Path
from tts_bridge.engines.manifests import add_model, sha256_file, verify_file
big, models_dir = Path(sys.argv[1]), Path(sys.argv[2])
tracemalloc.start()
digest = sha256_file(big)
verify_file(big, {expected!r}, {200 * MiB})
manifest = add_model("big", big.parent, models_dir)
_, peak = tracemalloc.get_traced_memory()
print(json.dumps({{"digest": digest, "recorded": manifest.files[0].sha256, "peak": peak}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code, str(big), str(models_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["digest"] == expected
    assert result["recorded"] == expected
    peak = result["peak"]
    assert peak < 8 * MiB, f"peak {peak / MiB:.1f} MiB while hashing 200 MiB"


# -- ChatTTS checkpoints ------------------------------------------------------------------------


def test_tampered_chattts_checkpoint_is_reported(
    tiny_checkpoint: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tts_bridge.engines.base import EngineError
    from tts_bridge.engines.chattts.torch_engine import (
        CHECKPOINT_FILES,
        SPK_STAT_FILE,
        ChatTTSEngine,
    )

    folder = models_dir / "chattts-tiny"
    shutil.copytree(tiny_checkpoint, folder)
    settings = _settings(models_dir)
    assert cmd_models_add(settings, "chattts-tiny", Path("chattts-tiny")) == 0  # in models.dir

    hashes = expected_hashes("chattts-tiny", models_dir)
    # Exactly the keys the engine checks, relative to the checkpoint folder.
    assert set(hashes) == {*CHECKPOINT_FILES, SPK_STAT_FILE}
    ChatTTSEngine(folder, expected_sha256=hashes).verify()
    assert cmd_models_verify(settings) == 0

    target = folder / "asset" / "gpt" / "model.safetensors"
    _flip_last_byte(target)
    actual = sha256_file(target)
    rel = "asset/gpt/model.safetensors"

    problems = verify_all(models_dir)
    assert [(p.model, p.path, p.kind) for p in problems] == [
        ("chattts-tiny", target, "sha256 mismatch")
    ]
    text = str(problems[0])
    assert str(target) in text and hashes[rel] in text and actual in text

    with pytest.raises(EngineError, match="sha256 mismatch") as refused:
        ChatTTSEngine(folder, expected_sha256=expected_hashes("chattts-tiny", models_dir)).verify()
    assert hashes[rel] in str(refused.value) and actual in str(refused.value)

    capsys.readouterr()
    assert cmd_models_verify(settings) == 1
    err = capsys.readouterr().err
    assert str(target) in err and hashes[rel] in err and actual in err


# -- command-line handlers ------------------------------------------------------------------------


def test_cli_handlers_add_list_and_verify(
    tmp_path: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = _settings(models_dir)
    voice = tmp_path / "en_US-amy-medium.onnx"
    voice.write_bytes(b"onnx model bytes")
    (tmp_path / "en_US-amy-medium.onnx.json").write_text("{}", encoding="utf-8")

    assert cmd_models_add(settings, "amy", voice) == 0
    out = capsys.readouterr().out
    assert "recorded model amy: 2 files" in out and sha256_file(voice) in out

    assert cmd_models_list(settings) == 0
    listing = capsys.readouterr().out
    for name in ("amy", "hibari-heart", "piper-en_US-joe-medium"):
        assert name in listing

    assert cmd_models_verify(settings) == 0
    assert "ok    amy (2 files)" in capsys.readouterr().out

    voice.write_bytes(b"short")
    assert cmd_models_verify(settings) == 1
    err = capsys.readouterr().err
    assert f"amy: {voice}: size differs: expected 16 bytes, actual 5 bytes" in err

    assert cmd_models_add(settings, "ghost", tmp_path / "missing.onnx") == 1
    assert "cannot add model 'ghost'" in capsys.readouterr().err


# -- verification at every load ----------------------------------------------------------------


def _model(tmp_path: Path, content: bytes = b"weights v1" * 1000) -> tuple[Path, str]:
    path = tmp_path / "voice.onnx"
    path.write_bytes(content)
    return path, hashlib.sha256(content).hexdigest()


def test_unchanged_files_are_verified_by_stat_alone(tmp_path: Path) -> None:
    path, digest = _model(tmp_path)
    hasher = FileHasher()
    assert hasher.verify(path, digest) == digest
    for _ in range(5):
        assert hasher.verify(path, digest) == digest
    assert hasher.hashed == 1


def test_a_file_swapped_after_start_is_refused_at_the_next_load(tmp_path: Path) -> None:
    path, digest = _model(tmp_path)
    hasher = FileHasher()
    hasher.verify(path, digest)
    before = path.stat()
    # Same size, same mtime: written in place and the timestamp set back.
    with path.open("r+b") as handle:
        handle.write(b"X")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(ModelFileError, match="sha256 mismatch"):
        hasher.verify(path, digest)
    # Replaced by another file (a rename over it), again with the same size and mtime.
    other = tmp_path / "other.onnx"
    other.write_bytes(b"weights v2" * 1000)
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, path)
    with pytest.raises(ModelFileError, match="sha256 mismatch"):
        hasher.verify(path, digest)
    # Restored: trusted again, under the restored hash.
    path.write_bytes(b"weights v1" * 1000)
    assert hasher.verify(path, digest) == digest
    path.unlink()
    with pytest.raises(ModelFileError, match="missing"):
        hasher.verify(path, digest)


def test_a_model_folder_verifies_to_one_digest(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root / "asset").mkdir(parents=True)
    (root / "asset" / "gpt.pt").write_bytes(b"gpt")
    (root / "config.json").write_bytes(b"{}")
    expected = {
        "asset/gpt.pt": hashlib.sha256(b"gpt").hexdigest(),
        "config.json": hashlib.sha256(b"{}").hexdigest(),
    }
    hasher = FileHasher()
    first = hasher.verify_tree(root, expected)
    assert first == hasher.verify_tree(root, dict(reversed(expected.items())))
    (root / "config.json").write_bytes(b"[]")
    with pytest.raises(ModelFileError, match=r"config\.json"):
        hasher.verify_tree(root, expected)
