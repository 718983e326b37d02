"""``tts-bridge models download chattts``: the ChatTTS checkpoint from ``2Noise/ChatTTS`` at a
revision the project has checked, verified against ChatTTS's own ``sha256_map.json`` before it
is trusted, recorded in the manifest, then -- with the torch extra -- exported to ONNX,
quantized to INT8 and given a default voice, in one command with one progress display.

The checkpoint goes to ``models.dir/chattts`` and the export to ``models.dir/chattts-onnx``,
exactly where the manual steps put them, so the engine pool finds the export by itself and the
voice gets its INT8 fast tier (``fast_voice: auto``). Each step is skipped when its result is
already there and verified, so running the command again after a failure (or after installing
the torch extra) goes on from where it stopped.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from tts_bridge.config import Settings
from tts_bridge.engines import manifests
from tts_bridge.engines.chattts.torch_engine import CHECKPOINT_FILES, SPK_STAT_FILE
from tts_bridge.engines.manifests import ModelFileError
from tts_bridge.engines.settings import AUTO_FAST_VOICE
from tts_bridge.hub.fetch import (
    HubError,
    RemoteFile,
    Staging,
    check_space,
    confirm,
    endpoint,
    mb,
    remote_files,
    remove_empty_staging,
)
from tts_bridge.hub.layout import CHATTTS_DIR, CHATTTS_ONNX_DIR, STAGING_DIR
from tts_bridge.hub.progress import Progress

_LOGGER = logging.getLogger(__name__)

REPO = "2Noise/ChatTTS"
REVISION = "1a3c04a8b0651689bd9242fbb55b1f4b5a9aef84"
"""The commit of the asset repository whose files match ChatTTS 0.2.5's sha256_map.json (the
safetensors layout); a newer one is chosen with --revision and must still match the map."""
DEFAULT_VOICE = "xiaoyu"
DEFAULT_SEED = 42
EXPORT_FACTOR = 1.3
"""Disk an ONNX export plus its INT8 graphs takes per byte of checkpoint (an estimate: the FP32
graphs hold the same weights, the INT8 GPT a quarter of its own)."""

SHA256_MAP_FILE = ("res", "sha256_map.json")
"""Where the ChatTTS package keeps its hashes of the official files."""
OFFICIAL_SHA256_MAP: Mapping[str, str] = {
    # ChatTTS 0.2.5's ChatTTS/res/sha256_map.json, for a download without the chattts extra;
    # when ChatTTS is installed its own file is read instead (a test keeps the two equal).
    "sha256_asset_Decoder_safetensors": (
        "77aa55e0a977949c4733df3c6f876fa85860d3298cba63295a7bc6901729d4e0"
    ),
    "sha256_asset_DVAE_safetensors": (
        "1d0b044a8368c0513100a2eca98456b289e6be6a18b7a63be1bcaa315ea874d9"
    ),
    "sha256_asset_Embed_safetensors": (
        "2ff0be7134934155741b643b74e32fb6bf3eec41257984459b2ed60cdb4c48b0"
    ),
    "sha256_asset_Vocos_safetensors": (
        "07e5561491cce41f7f90cfdb94b2ff263ff5742c3d89339db99b17ad82cc3f44"
    ),
    "sha256_asset_gpt_config_json": (
        "0aaa1ecd96c49ad4f473459eb1982fa7ad79fa5de08cde2781bf6ad1f9a0c236"
    ),
    "sha256_asset_gpt_model_safetensors": (
        "cd0806fd971f52f6a22c923ec64982b305e817bcc41ca83417fcf9141b984a0f"
    ),
    "sha256_asset_tokenizer_special_tokens_map_json": (
        "bd0ac9d9bb1657996b5c5fbcaa7d80f8de530d01a283da97f89deae5b1b8d011"
    ),
    "sha256_asset_tokenizer_tokenizer_config_json": (
        "43e9d658b554fa5ee8d8e1d763349323bfef1ed7a89c0794220ab8861387d421"
    ),
    "sha256_asset_tokenizer_tokenizer_json": (
        "843838a64e121e23e774cc75874c6fe862198d9f7dd43747914633a8fd89c20e"
    ),
}

INSTALL_TORCH = ".venv/bin/pip install -e '.[chattts]'"


def map_key(rel: str) -> str:
    """ChatTTS's key for a file: 'asset/gpt/config.json' -> 'sha256_asset_gpt_config_json'."""
    return "sha256_" + rel.replace("/", "_").replace(".", "_")


def installed_sha256_map() -> Path | None:
    """The installed ChatTTS package's sha256_map.json (found without importing ChatTTS)."""
    spec = importlib.util.find_spec("ChatTTS")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*SHA256_MAP_FILE)
    return path if path.is_file() else None


def read_sha256_map(path: Path | None = None) -> dict[str, str]:
    """Checkpoint path -> SHA-256 of every file the map lists (``path``: a map in ChatTTS's
    format; default: the installed ChatTTS's, else the copy above).

    The keys flatten the path, so they are matched against the files a checkpoint can have; a
    key this version does not know is refused rather than silently not downloaded."""
    path = path or installed_sha256_map()
    if path is None:
        raw: Mapping[str, object] = OFFICIAL_SHA256_MAP
        source = "ChatTTS 0.2.5's sha256_map.json (built in)"
    else:
        source = str(path)
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise HubError(f"cannot read the sha256 map {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise HubError(f"{path}: not a sha256 map (expected a JSON object)")
        raw = loaded
    by_key = {map_key(rel): rel for rel in (*CHECKPOINT_FILES, SPK_STAT_FILE)}
    hashes: dict[str, str] = {}
    for key, digest in raw.items():
        rel = by_key.get(key)
        if rel is None:
            raise HubError(f"{source} lists {key!r}, a file this version does not know")
        if not isinstance(digest, str) or len(digest) != 64:
            raise HubError(f"{source}: {key!r} is not a SHA-256")
        hashes[rel] = digest.lower()
    missing = [rel for rel in CHECKPOINT_FILES if rel not in hashes]
    if missing:
        raise HubError(f"{source} has no hash for {', '.join(missing)}")
    return hashes


def torch_extra_present() -> bool:
    """The export needs torch, ChatTTS and onnx; the quantizer onnxruntime (always there)."""
    return all(importlib.util.find_spec(name) for name in ("torch", "ChatTTS", "onnx"))


def _problems(folder: Path, hashes: Mapping[str, str], sizes: Mapping[str, int]) -> list[str]:
    """Why the files under ``folder`` are not exactly the ones in ``hashes`` (empty: they are)."""
    problems = []
    for rel, digest in sorted(hashes.items()):
        path = folder / rel
        size = sizes.get(rel)
        try:
            if size is None:
                size = path.stat().st_size
            manifests.verify_file(path, digest, size)
        except ModelFileError as exc:
            problems.append(f"{rel}: {exc.kind}: expected {exc.expected}, actual {exc.actual}")
        except OSError as exc:
            problems.append(f"{rel}: {exc}")
    return problems


def download_chattts(
    settings: Settings,
    *,
    revision: str = REVISION,
    yes: bool = False,
    sha256_map: Path | None = None,
    stream: TextIO | None = None,
    stdin: TextIO | None = None,
) -> None:
    """The whole command: download, verify, record, export, quantize, voice. HubError (or an
    EngineError of a later step) says what went wrong; whatever was not verified is not used."""
    models_dir = settings.models.dir
    hashes = read_sha256_map(sha256_map)
    checkpoint = models_dir / CHATTTS_DIR
    export = torch_extra_present()
    say = _Say(stream)

    if checkpoint.exists():
        problems = _problems(checkpoint, hashes, {})
        if problems:
            raise HubError(
                f"{checkpoint} exists but is not the verified ChatTTS release "
                f"({problems[0]}); move it away to download again, or trust it as it is with "
                f"'tts-bridge models add {CHATTTS_DIR} {checkpoint}'"
            )
        say(f"{checkpoint}: already downloaded and verified ({len(hashes)} files)")
    else:
        say(f"ChatTTS from {endpoint()}/{REPO} at revision {revision}")
        files = remote_files(REPO, revision, sorted(hashes))
        _download(
            settings, files, hashes, revision, export=export, yes=yes, stream=stream, stdin=stdin
        )
    if _recorded_as(models_dir, hashes):
        say(f"model {CHATTTS_DIR} is recorded in the manifest")
    else:
        manifest = manifests.add_model(CHATTTS_DIR, checkpoint, models_dir)
        say(f"recorded model {manifest.name} ({len(manifest.files)} files) in the manifest")
    if not export:
        say(
            "the ONNX export and a voice need the torch extra: "
            f"{INSTALL_TORCH}, then run 'tts-bridge models download chattts' again "
            "(nothing is downloaded twice)"
        )
        return
    _export_and_quantize(settings, checkpoint, say)
    _default_voice(settings, say)


def _recorded_as(models_dir: Path, hashes: Mapping[str, str]) -> bool:
    """The manifest already records exactly these files for the checkpoint."""
    try:
        recorded = manifests.get_manifest(CHATTTS_DIR, models_dir).expected_hashes()
    except manifests.ManifestError:
        return False
    return recorded == dict(hashes)


class _Say:
    """Lines of the command's report (the progress bar has its own stream handling)."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream

    def __call__(self, text: str) -> None:
        print(text, file=self._stream, flush=True)


def _download(
    settings: Settings,
    files: list[RemoteFile],
    hashes: Mapping[str, str],
    revision: str,
    *,
    export: bool,
    yes: bool,
    stream: TextIO | None,
    stdin: TextIO | None,
) -> None:
    models_dir = settings.models.dir
    say = _Say(stream)
    staging = Staging(models_dir, CHATTTS_DIR, revision)
    total = sum(f.size for f in files)
    for file in files:
        say(f"  {file.size / 1e6:>10.1f} MB  {file.path}")
    pending = [f for f in files if not staging.has(f)] if staging.resumable() else files
    need = sum(f.size for f in pending)
    line = f"  {total / 1e6:>10.1f} MB  in {len(files)} files to {models_dir / CHATTTS_DIR}"
    if export:
        extra = int(total * EXPORT_FACTOR)
        need += extra
        line += f", and about {mb(extra)} for the ONNX export"
    say(line)
    check_space(models_dir, need)
    confirm(f"Download {mb(total)} from {endpoint()}?", yes, stdin)
    say(staging.open(files))
    progress = Progress(total, stream=stream)
    try:
        for file in files:
            staging.download(REPO, file, progress)
    finally:
        progress.close()
    say(f"verifying {len(files)} files against ChatTTS's sha256 map")
    sizes = {f.path: f.size for f in files}
    problems = _problems(staging.folder, hashes, sizes)
    if problems:
        for file in files:
            if any(p.startswith(f"{file.path}:") for p in problems):
                staging.discard(file)
        raise HubError(
            "refused, not the official ChatTTS files (deleted; nothing was trusted): "
            + "; ".join(problems)
        )
    staging.promote({f.path: f.path for f in files}, models_dir / CHATTTS_DIR)


def _export_and_quantize(settings: Settings, checkpoint: Path, say: _Say) -> None:
    """ONNX FP32 graphs, then INT8, built in staging and moved into place, then recorded."""
    from tts_bridge.engines.chattts.export import export_chattts
    from tts_bridge.engines.chattts.quantize import quantize_onnx

    models_dir = settings.models.dir
    dest = models_dir / CHATTTS_ONNX_DIR
    if dest.exists():
        try:
            recorded = manifests.get_manifest(CHATTTS_ONNX_DIR, models_dir)
        except manifests.ManifestError:
            recorded = None
        if recorded is not None and not manifests.verify_model(recorded, models_dir):
            say(f"{dest}: the ONNX export is already there and verified")
            return
        raise HubError(
            f"{dest} exists but is not a recorded, verified export; move it away and run again"
        )
    work = models_dir / STAGING_DIR / CHATTTS_ONNX_DIR
    if work.exists():
        say(f"removing an unfinished export in {work}")
        shutil.rmtree(work)
    expected = manifests.get_manifest(CHATTTS_DIR, models_dir).expected_hashes()
    say(f"exporting {checkpoint} to ONNX (once; this takes a while)")
    export_chattts(checkpoint, work, expected_sha256=expected)
    say("quantizing the GPT to INT8")
    written = quantize_onnx(work)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work.replace(dest)
    remove_empty_staging(models_dir)
    manifest = manifests.add_model(CHATTTS_ONNX_DIR, dest, models_dir)
    say(
        f"recorded model {manifest.name}: FP32 and INT8 graphs "
        f"({', '.join(p.name for p in written)})"
    )


def _default_voice(settings: Settings, say: _Say) -> None:
    """The voice ``voices new`` would make, unless a voice of that name exists."""
    if DEFAULT_VOICE in settings.voices:
        say(f"voice {DEFAULT_VOICE!r} exists; kept as it is")
        return
    from tts_bridge.engines.base import EngineError
    from tts_bridge.engines.voices_file import VoicesFileError, chattts_voice_from_seed, write_voice

    try:
        entry = chattts_voice_from_seed(settings, DEFAULT_SEED, Path(CHATTTS_DIR), AUTO_FAST_VOICE)
        write_voice(
            settings.voices_file, DEFAULT_VOICE, entry.model_dump(mode="json", exclude_none=True)
        )
    except (EngineError, VoicesFileError, OSError) as exc:
        raise HubError(f"making the voice {DEFAULT_VOICE!r} failed: {exc}") from exc
    say(f"voice {DEFAULT_VOICE!r} (seed {DEFAULT_SEED}) written to {settings.voices_file}")
    say(
        f"ready: voice {DEFAULT_VOICE!r} (ChatTTS on the ONNX export, its INT8 fast tier "
        f"{DEFAULT_VOICE}_int8); start the bridge, or try: "
        f"tts-bridge say --voice {DEFAULT_VOICE} '你好。' -o hello.wav"
    )
