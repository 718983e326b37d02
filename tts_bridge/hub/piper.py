"""``tts-bridge models download piper NAME`` and ``models search piper [LANG]``: Piper voices
from ``rhasspy/piper-voices`` at a pinned revision.

The repository's ``voices.json`` lists every voice with its language and, per file, the size
and MD5 digest; a voice's ``.onnx`` and ``.onnx.json`` are checked against both before they
are moved to ``models.dir/piper/<key>/`` and recorded in the manifest (with their SHA-256, as
``models add`` records any model). The voice list itself is fetched at the same pinned revision
and kept in staging, so ``search`` after the first time costs one metadata request.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from tts_bridge.config import Settings
from tts_bridge.engines import manifests
from tts_bridge.hub.fetch import (
    HubError,
    RemoteFile,
    Staging,
    check_space,
    confirm,
    endpoint,
    mb,
)
from tts_bridge.hub.layout import PIPER_DIR, piper_model, piper_model_name
from tts_bridge.hub.progress import Progress
from tts_bridge.settings_base import NAME_PATTERN

_LOGGER = logging.getLogger(__name__)

REPO = "rhasspy/piper-voices"
REVISION = "v1.0.0"
"""The tagged release of the voice list (the one wyoming-piper and Home Assistant read)."""
VOICES_JSON = "voices.json"
_INDEX = "piper-voices-index"
_KEY = re.compile(r"^[a-z]{2,3}_[A-Z]{2}-[A-Za-z0-9_]+-(x_low|low|medium|high)$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class VoiceFile:
    path: str
    """Path in the repository, e.g. zh/zh_CN/huayan/medium/zh_CN-huayan-medium.onnx."""
    size: int
    md5: str


@dataclass(frozen=True)
class PiperVoiceInfo:
    """One voice of voices.json."""

    key: str
    """e.g. zh_CN-huayan-medium."""
    name: str
    language: str
    """Piper's code, e.g. zh_CN."""
    language_name: str
    quality: str
    files: tuple[VoiceFile, ...]
    """The .onnx and the .onnx.json (the model card is not needed to speak)."""

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def parse_voices(data: Any, source: str) -> dict[str, PiperVoiceInfo]:
    """voices.json -> the voices with both model files; a malformed entry is an error."""
    if not isinstance(data, dict):
        raise HubError(f"{source}: not a Piper voice list (expected a JSON object)")
    voices = {}
    for key, entry in data.items():
        try:
            files = entry["files"]
            wanted = []
            for suffix in (".onnx", ".onnx.json"):
                (path,) = [p for p in files if p.endswith(f"/{key}{suffix}")]
                info = files[path]
                wanted.append(VoiceFile(path, int(info["size_bytes"]), str(info["md5_digest"])))
            language = entry["language"]
            voices[key] = PiperVoiceInfo(
                key=str(key),
                name=str(entry["name"]),
                language=str(language["code"]),
                language_name=f"{language.get('name_english', '')} "
                f"({language.get('name_native', '')}, {language.get('country_english', '')})",
                quality=str(entry["quality"]),
                files=tuple(wanted),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise HubError(f"{source}: voice {key!r} is malformed ({exc!r})") from exc
    return voices


def voice_list(settings: Settings, revision: str = REVISION) -> dict[str, PiperVoiceInfo]:
    """The voice list at ``revision`` (fetched, or kept from the last time if unchanged)."""
    from tts_bridge.hub import fetch

    staging = Staging(settings.models.dir, _INDEX, revision)
    if not staging.resumable():
        staging.open([])
    (remote,) = fetch.remote_files(REPO, revision, [VOICES_JSON])
    check_space(settings.models.dir, remote.size)
    progress = Progress(0, quiet=True)
    path = staging.download(REPO, remote, progress)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        staging.discard(remote)
        raise HubError(f"the voice list {REPO}/{VOICES_JSON} is unreadable: {exc}") from exc
    return parse_voices(data, f"{REPO}/{VOICES_JSON}@{revision}")


def search(
    settings: Settings, language: str | None, *, revision: str = REVISION, stream: TextIO | None
) -> int:
    """Print the voices whose language starts with ``language`` (zh, zh_CN, de...); the count."""
    voices = voice_list(settings, revision)
    wanted = (language or "").lower().replace("-", "_")
    found = [v for v in voices.values() if v.language.lower().startswith(wanted)]
    for voice in sorted(found, key=lambda v: v.key):
        here = " (downloaded)" if (settings.models.dir / piper_model(voice.key)).is_file() else ""
        print(
            f"{voice.key:<36} {mb(voice.size):>9}  {voice.language_name}{here}",
            file=stream,
        )
    if not found:
        languages = sorted({v.language for v in voices.values()})
        print(f"no Piper voice for {language!r}; languages: {', '.join(languages)}", file=stream)
    return len(found)


def md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)  # the voice list publishes MD5 digests
    with path.open("rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _problem(path: Path, file: VoiceFile) -> str | None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"{file.path}: {exc.strerror or exc}"
    if size != file.size:
        return f"{file.path}: size differs: expected {file.size} bytes, actual {size} bytes"
    actual = md5_file(path)
    if actual != file.md5.lower():
        return f"{file.path}: md5 mismatch: expected {file.md5.lower()}, actual {actual}"
    return None


def voice_name(info: PiperVoiceInfo) -> str:
    """A configuration name for the voice: its speaker name, made to fit NAME_PATTERN."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", info.name)[:64] or info.key
    return name if re.match(NAME_PATTERN, name) else re.sub(r"[^A-Za-z0-9_-]", "_", info.key)


def download_piper(
    settings: Settings,
    key: str,
    *,
    revision: str = REVISION,
    yes: bool = False,
    add_voice: str | None = None,
    stream: TextIO | None = None,
    stdin: TextIO | None = None,
) -> Path:
    """Download, verify and record one voice; print how to use it. Returns the .onnx path."""
    if not _KEY.match(key):
        raise HubError(
            f"{key!r} is not a Piper voice name (language_REGION-name-quality, e.g. "
            "zh_CN-huayan-medium); list them with 'tts-bridge models search piper zh'"
        )
    models_dir = settings.models.dir
    voices = voice_list(settings, revision)
    info = voices.get(key)
    if info is None:
        close = difflib.get_close_matches(key, voices, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise HubError(f"{REPO}@{revision} has no voice {key!r}{hint}")
    if piper_model_name(key) in manifests.bundled_manifests():
        raise HubError(f"{key} comes with tts-bridge already (a default voice); nothing to fetch")
    dest = models_dir / PIPER_DIR / key
    names = {f.path: Path(f.path).name for f in info.files}
    if dest.exists():
        problems = [p for f in info.files if (p := _problem(dest / names[f.path], f))]
        if problems:
            raise HubError(
                f"{dest} exists but is not the published voice ({problems[0]}); move it away "
                "to download again"
            )
        print(f"{dest}: already downloaded and verified", file=stream)
    else:
        _download(settings, info, revision, names, yes=yes, stream=stream, stdin=stdin)
    model = models_dir / piper_model(key)
    manifest = manifests.add_model(piper_model_name(key), model, models_dir)
    print(
        f"recorded model {manifest.name} ({len(manifest.files)} files) in the manifest", file=stream
    )
    name = add_voice or voice_name(info)
    entry = {
        "engine": "piper",
        "model": piper_model(key).as_posix(),
        "description": f"Piper {info.language} {info.name} {info.quality}",
    }
    if add_voice is not None:
        _write_voice(settings, add_voice, entry)
        print(f"voice {add_voice!r} written to {settings.voices_file}", file=stream)
    else:
        snippet = yaml.safe_dump({"voices": {name: entry}}, sort_keys=False, allow_unicode=True)
        print(
            "To use it, add this voice to the voices of your configuration (a voices section "
            "replaces the default voices, so keep joe and heart listed there), or run again "
            f"with --add-voice {name} to put it in the voices file:\n\n{snippet}",
            file=stream,
        )
    return model


def _download(
    settings: Settings,
    info: PiperVoiceInfo,
    revision: str,
    names: Mapping[str, str],
    *,
    yes: bool,
    stream: TextIO | None,
    stdin: TextIO | None,
) -> None:
    models_dir = settings.models.dir
    files = [RemoteFile(f.path, f.size) for f in info.files]
    staging = Staging(models_dir, piper_model_name(info.key), revision)
    print(f"Piper voice {info.key} from {endpoint()}/{REPO} at {revision}", file=stream)
    for file in files:
        print(f"  {file.size / 1e6:>10.1f} MB  {file.path}", file=stream)
    pending = [f for f in files if not staging.has(f)] if staging.resumable() else files
    check_space(models_dir, sum(f.size for f in pending))
    confirm(f"Download {mb(info.size)} from {endpoint()}?", yes, stdin)
    print(staging.open(files), file=stream)
    progress = Progress(info.size, stream=stream)
    try:
        for file in files:
            staging.download(REPO, file, progress)
    finally:
        progress.close()
    problems = []
    for file, published in zip(files, info.files, strict=True):
        problem = _problem(staging.path(file), published)
        if problem:
            staging.discard(file)
            problems.append(problem)
    if problems:
        raise HubError(
            "refused, not the published voice files (deleted; nothing was trusted): "
            + "; ".join(problems)
        )
    staging.promote(dict(names), models_dir / PIPER_DIR / info.key)


def _write_voice(settings: Settings, name: str, entry: Mapping[str, str]) -> None:
    """Add the voice to the voices file (merged with the configured voices, as `voices new`)."""
    from tts_bridge.engines.voices_file import VoicesFileError, write_voice

    try:
        write_voice(settings.voices_file, name, entry)
    except VoicesFileError as exc:
        raise HubError(str(exc)) from exc
