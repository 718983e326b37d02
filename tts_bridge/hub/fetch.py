"""The hub side of ``models download``: file sizes, downloads into a staging folder, the disk
check, the confirmation prompt and one error type whose message says what to do.

``huggingface_hub`` does the transfers: it honours ``HF_ENDPOINT`` (a mirror), retries a dropped
connection with a Range request from where it stopped, and keeps every finished file of a
``local_dir`` with its ETag, so a second run does not fetch a finished file again. What it
does not do is decide what to trust: every file lands in ``models.dir/.downloads/<name>/``
first, is verified there against the digests the project trusts, and only then is moved into
place (a rename within models.dir). A failure at any point -- the network, a full disk, a
digest mismatch, Ctrl-C -- leaves the finished files in staging and nothing in place; the next
run resumes from them (and says so), or starts clean when they belong to another revision.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, cast

from tts_bridge.hub.layout import STAGING_DIR
from tts_bridge.hub.progress import Progress

_LOGGER = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
_REVISION_FILE = ".revision"
_HUB_METADATA = ".cache"  # huggingface_hub's bookkeeping inside a local_dir
_HEAD_TIMEOUT_S = 20.0


class HubError(Exception):
    """A download cannot go on; the message says why and what to do."""


def endpoint() -> str:
    """The hub to download from: ``HF_ENDPOINT`` (read now, not at import) or Hugging Face."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch."""

    path: str
    """Its path in the repository (POSIX)."""
    size: int
    """Its size in bytes, as the hub (or the voice list) states it."""


def _hub() -> Any:
    """``huggingface_hub``, refusing when its offline switch is on (it would fail obscurely)."""
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError as exc:  # pragma: no cover - a dependency of the base install
        raise HubError(
            "huggingface_hub is not installed: .venv/bin/pip install 'huggingface_hub>=0.34'"
        ) from exc
    if constants.is_offline_mode():
        raise HubError(
            "downloads are switched off (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set): "
            "unset it for this command"
        )
    return huggingface_hub


def explain(exc: BaseException, repo: str, revision: str, path: str) -> HubError:
    """A hub client error as one clear line (unreachable hub, no such revision or file)."""
    import httpx2
    from huggingface_hub import errors

    where = endpoint()
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"{repo} has no revision {revision} at {where} (HF_ENDPOINT)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubError(f"there is no repository {repo} at {where} (HF_ENDPOINT)")
    if isinstance(exc, errors.RemoteEntryNotFoundError):
        return HubError(f"{repo} at revision {revision} has no file {path} ({where})")
    unreachable = (
        httpx2.TransportError,
        errors.LocalEntryNotFoundError,
        errors.OfflineModeIsEnabled,
        errors.FileMetadataError,
        ConnectionError,
        TimeoutError,
    )
    if isinstance(exc, unreachable):
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return HubError(
            f"cannot reach the model hub at {where} ({reason[:200]}); check the network, or "
            "set HF_ENDPOINT to a Hugging Face mirror you can reach"
        )
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "an error"
        return HubError(f"the model hub at {where} answered {status} for {repo}/{path}")
    return HubError(f"downloading {repo}/{path} from {where} failed: {exc}")


def remote_files(repo: str, revision: str, paths: list[str]) -> list[RemoteFile]:
    """Each file's size from the hub (one HEAD request per file; nothing is downloaded)."""
    hub = _hub()
    where = endpoint()
    found = []
    for path in paths:
        url = hub.hf_hub_url(repo, path, revision=revision, endpoint=where)
        try:
            meta = hub.get_hf_file_metadata(url, timeout=_HEAD_TIMEOUT_S, endpoint=where)
        except Exception as exc:
            raise explain(exc, repo, revision, path) from exc
        if meta.size is None:
            raise HubError(f"the model hub at {where} did not say the size of {repo}/{path}")
        found.append(RemoteFile(path, int(meta.size)))
    return found


# -- disk space and confirmation ------------------------------------------------------------


def free_bytes(folder: Path) -> int:
    """Free space on the file system that holds ``folder`` (or its nearest existing parent)."""
    for candidate in (folder, *folder.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(candidate).free
    return 0


def mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def check_space(folder: Path, need: int) -> None:
    """HubError when the file system of ``folder`` has less than ``need`` bytes free."""
    free = free_bytes(folder)
    if free < need:
        raise HubError(
            f"not enough disk space in {folder}: {mb(need)} needed, {mb(free)} free; free some "
            "space (or point models.dir elsewhere) and run again"
        )


def confirm(question: str, yes: bool, stdin: TextIO | None = None) -> None:
    """Ask before a download; ``--yes`` answers for scripts. No terminal and no --yes: refuse."""
    if yes:
        return
    stdin = stdin or sys.stdin
    if stdin is None or not stdin.isatty():
        raise HubError("no terminal to confirm the download on: run again with --yes")
    print(f"{question} [y/N] ", end="", flush=True)
    answer = stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise HubError("download cancelled")


# -- staging ---------------------------------------------------------------------------------


class Staging:
    """``models.dir/.downloads/<name>/``: a download of one revision until it is verified."""

    def __init__(self, models_dir: Path, name: str, revision: str) -> None:
        self.models_dir = models_dir
        self.folder = models_dir / STAGING_DIR / name
        self.revision = revision

    def resumable(self) -> bool:
        """Staging holds (part of) a download of this same revision."""
        marker = self.folder / _REVISION_FILE
        return marker.is_file() and marker.read_text(encoding="utf-8").strip() == self.revision

    def open(self, expected: list[RemoteFile]) -> str:
        """Make the folder ready; says whether this run resumes or starts clean, and why."""
        marker = self.folder / _REVISION_FILE
        before = marker.read_text(encoding="utf-8").strip() if marker.is_file() else None
        if self.folder.exists() and before != self.revision:
            shutil.rmtree(self.folder)
            why = f"the earlier download was of revision {before}" if before else "unknown files"
            message = f"starting clean ({why}; removed it)"
        elif self.folder.exists():
            done = [f for f in expected if self.has(f)]
            if done:
                size = sum(f.size for f in done)
                return (
                    f"resuming an interrupted download: {len(done)} of {len(expected)} files "
                    f"({mb(size)}) already in {self.folder}"
                )
            message = "starting clean"
        else:
            message = "starting clean"
        self.folder.mkdir(parents=True, exist_ok=True)
        marker.write_text(self.revision + "\n", encoding="utf-8")
        return message

    def path(self, file: RemoteFile) -> Path:
        return self.folder / file.path

    def has(self, file: RemoteFile) -> bool:
        """A finished file of the right size is here (verified later, like every other)."""
        try:
            return self.path(file).stat().st_size == file.size
        except OSError:
            return False

    def download(self, repo: str, file: RemoteFile, progress: Progress) -> Path:
        """Fetch one file into the staging folder (a finished one is not fetched again)."""
        hub = _hub()
        done = self.has(file)
        try:
            local = hub.hf_hub_download(
                repo,
                file.path,
                revision=self.revision,
                local_dir=self.folder,
                endpoint=endpoint(),
                tqdm_class=cast(Any, progress.file_bar),
            )
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise HubError(
                    f"the disk holding {self.folder} is full (while fetching {file.path}); "
                    "nothing was trusted or moved into place. Free some space and run again: "
                    "the files finished so far are kept and the download resumes"
                ) from exc
            if _is_hub_error(exc):
                raise _resumable(explain(exc, repo, self.revision, file.path)) from exc
            raise HubError(f"cannot write {file.path} into {self.folder}: {exc}") from exc
        except Exception as exc:
            raise _resumable(explain(exc, repo, self.revision, file.path)) from exc
        if done:
            progress.advance(file.size)
        path = Path(local)
        if not progress.tty:
            progress.step(f"  {'kept' if done else 'fetched'} {file.path} ({mb(file.size)})")
        return path

    def discard(self, file: RemoteFile) -> None:
        """Delete a file that failed verification, so no later run takes it for finished."""
        with contextlib.suppress(FileNotFoundError):
            self.path(file).unlink()

    def promote(self, moves: Mapping[str, str], dest: Path) -> None:
        """Move verified files (staged path -> path under ``dest``) into a new ``dest``.

        They are gathered in a sibling folder first and that folder is renamed to ``dest``, so
        ``dest`` holds either nothing or every file. Anything else in staging is deleted.
        """
        if dest.exists():
            raise HubError(f"{dest} exists; move it away first")
        gather = dest.with_name(f".{dest.name}.new")
        if gather.exists():
            shutil.rmtree(gather)
        for staged, target in moves.items():
            out = gather / target
            out.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.folder / staged, out)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(gather, dest)
        self.clear()

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        remove_empty_staging(self.models_dir)

    def files(self) -> Iterator[Path]:
        """Every file in staging except huggingface_hub's bookkeeping and the revision mark."""
        for path in sorted(self.folder.rglob("*")):
            rel = path.relative_to(self.folder)
            if path.is_file() and rel.parts[0] not in (_HUB_METADATA, _REVISION_FILE):
                yield path


def _resumable(error: HubError) -> HubError:
    return HubError(
        f"{error}; the files finished so far are kept: run the same command again to resume"
    )


def remove_empty_staging(models_dir: Path) -> None:
    """Remove models.dir/.downloads once nothing is staged in it."""
    with contextlib.suppress(OSError):
        (models_dir / STAGING_DIR).rmdir()


def _is_hub_error(exc: OSError) -> bool:
    from huggingface_hub import errors

    return isinstance(exc, errors.HfHubHTTPError | errors.EntryNotFoundError | ConnectionError)
