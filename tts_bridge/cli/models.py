"""`tts-bridge models`: list, add, verify, export and quantize model files."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from tts_bridge.cli.parsing import add_command
from tts_bridge.config import Settings
from tts_bridge.engines import manifests
from tts_bridge.engines.base import EngineError
from tts_bridge.engines.manifests import (
    USER_MANIFEST,
    ManifestError,
    ModelError,
    add_model,
    load_manifests,
    verify_model,
)


def _size_mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def cmd_models_add(settings: Settings, name: str, path: Path) -> int:
    """``tts-bridge models add NAME PATH``: record a model file or folder as trusted."""
    models_dir = settings.models.dir
    if not path.is_absolute() and not path.exists() and (models_dir / path).exists():
        path = models_dir / path  # "models add amy en_US-amy.onnx" for a file in models.dir
    try:
        manifest = add_model(name, path, models_dir)
    except (ModelError, OSError) as exc:
        print(f"tts-bridge: cannot add model {name!r}: {exc}", file=sys.stderr)
        return 1
    print(
        f"recorded model {manifest.name}: {len(manifest.files)} files, "
        f"{_size_mb(manifest.total_bytes)}, root {manifest.root.describe()} "
        f"(in {models_dir / USER_MANIFEST})"
    )
    for entry in manifest.files:
        print(f"  {entry.sha256}  {entry.size:>12}  {entry.path}")
    return 0


def cmd_models_verify(settings: Settings) -> int:
    """``tts-bridge models verify``: hash every model file; non-zero naming each bad file."""
    models_dir = settings.models.dir
    try:
        manifests = load_manifests(models_dir)
    except ModelError as exc:
        print(f"tts-bridge: {exc}", file=sys.stderr)
        return 1
    bad = 0
    for manifest in manifests.values():
        problems = verify_model(manifest, models_dir)
        if not problems:
            print(f"ok    {manifest.name} ({len(manifest.files)} files)")
            continue
        bad += len(problems)
        print(f"BAD   {manifest.name}", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    if bad:
        print(f"tts-bridge: {bad} model file(s) failed verification", file=sys.stderr)
        return 1
    return 0


def cmd_models_list(settings: Settings) -> int:
    """``tts-bridge models list``: every known model, where it lives, without hashing."""
    models_dir = settings.models.dir
    try:
        manifests = load_manifests(models_dir)
    except ModelError as exc:
        print(f"tts-bridge: {exc}", file=sys.stderr)
        return 1
    for manifest in manifests.values():
        try:
            where = str(manifest.folder(models_dir))
        except ManifestError as exc:
            where = f"({exc})"
        print(
            f"{manifest.name:<28} {manifest.origin:<8} {len(manifest.files):>3} files "
            f"{_size_mb(manifest.total_bytes):>10}  {where}"
        )
    return 0


def _cmd_models(args: argparse.Namespace, settings: Settings) -> int:

    if args.models_command == "add":
        return cmd_models_add(settings, args.name, args.path)
    if args.models_command == "verify":
        return cmd_models_verify(settings)
    if args.models_command == "export":
        return _models_export(settings, args.source, args.dest, args.name)
    if args.models_command == "quantize":
        return _models_quantize(settings, args.name, int4=args.int4, int8_all=args.int8_all)
    if args.models_command in ("download", "search"):
        return _models_hub(args, settings)
    return cmd_models_list(settings)


def _models_export(settings: Settings, source: Path, dest: Path, name: str) -> int:
    """ChatTTS checkpoint -> ONNX graphs (needs the torch extra; once, on any machine)."""
    from tts_bridge.engines.chattts.export import export_chattts
    from tts_bridge.engines.registry import manifest_hashes

    export_chattts(source, dest, expected_sha256=manifest_hashes(source, settings.models.dir))
    manifests.add_model(name, dest, settings.models.dir)
    print(f"exported {source} to {dest}; recorded as model {name!r}")
    return 0


def _models_quantize(
    settings: Settings, name: str, *, int4: bool = False, int8_all: bool = False
) -> int:
    """INT8 graphs beside an ONNX export (onnxruntime dynamic quantization); re-recorded."""
    from tts_bridge.engines.chattts.quantize import quantize_int4, quantize_int8_all, quantize_onnx

    if int4 and int8_all:
        print("refused: --int4 and --int8-all are separate runs", file=sys.stderr)
        return 2

    manifest = manifests.get_manifest(name, settings.models.dir)
    folder = manifest.folder(settings.models.dir)
    bad = manifests.verify_model(manifest, settings.models.dir)
    if bad:
        for problem in bad:
            print(f"refused: {problem}", file=sys.stderr)
        return 1
    try:
        if int4:
            written = quantize_int4(folder)
        elif int8_all:
            written = quantize_int8_all(folder)
        else:
            written = quantize_onnx(folder)
    except EngineError:
        raise
    except Exception as exc:  # onnx and onnxruntime raise their own untyped errors
        if "hard link" in str(exc):
            # onnx refuses external data with more than one link (a `cp -al` copy, a backup
            # by hard links) as a possible hardlink attack.
            raise EngineError(
                f"cannot quantize {name!r}: its graph files in {folder} are hard links, which "
                "onnx refuses; copy the folder without hard links (cp -r) and quantize that"
            ) from exc
        raise EngineError(f"cannot quantize {name!r}: {exc}") from exc
    manifests.add_model(name, folder, settings.models.dir)
    print(f"quantized {name!r}: {', '.join(p.name for p in written)}")
    return 0


def add_models_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = add_command(
        sub,
        "models",
        "list, add or verify model files",
        "Model files the bridge trusts, each recorded with its SHA-256 in a manifest (the "
        "bundled ones, and models add's in models.dir); list is the default.",
        [common],
    )
    parser.set_defaults(func=_cmd_models, models_command="list")
    models_sub = parser.add_subparsers(
        dest="models_command", metavar="{list,add,verify,export,quantize,download,search}"
    )
    add_command(
        models_sub,
        "list",
        "models and their files",
        "Every known model, where it lives, its file count and size (without hashing).",
        [common],
    )
    add = add_command(
        models_sub,
        "add",
        "trust a model file or folder",
        "Record a model file (a Piper .onnx with its .onnx.json) or a checkpoint folder as "
        "trusted: its files' SHA-256 go into the user manifest in models.dir, which must be "
        "writable.",
        [common],
    )
    add.add_argument("name", help="model name for the manifest")
    add.add_argument("path", type=Path, help="model file or checkpoint folder")
    add_command(
        models_sub,
        "verify",
        "check every model file's SHA-256",
        "Hash every model file and compare it with its manifest; exits 1 naming each bad file.",
        [common],
    )
    export = add_command(
        models_sub,
        "export",
        "ChatTTS checkpoint -> ONNX (needs the torch extra)",
        "Export a ChatTTS checkpoint to ONNX graphs (once, on any machine with the chattts "
        "extra) and record the export as a model.",
        [common],
    )
    export.add_argument("kind", choices=["chattts"], help="what to export")
    export.add_argument("--from", dest="source", type=Path, required=True, help="checkpoint")
    export.add_argument("--to", dest="dest", type=Path, required=True, help="output folder")
    export.add_argument("--name", default="chattts-onnx", help="model name for the manifest")
    quantize = add_command(
        models_sub,
        "quantize",
        "INT8 ONNX graphs",
        "Write INT8 graphs beside an ONNX export (onnxruntime dynamic quantization) and "
        "record them; the export is verified first.",
        [common],
    )
    quantize.add_argument("name", help="an exported model's name")
    quantize.add_argument(
        "--int4",
        action="store_true",
        help="write the 4-bit GPT (precision: int4) instead: less memory, less faithful",
    )
    quantize.add_argument(
        "--int8-all",
        action="store_true",
        help="also write an INT8 decoder and Vocos (precision: int8-all): about 110 MB less "
        "memory, a small error in the waveform",
    )
    _add_hub_parsers(models_sub, common)


# -- models download / models search (the hub; see tts_bridge.hub) ------------------------------


def _models_hub(args: argparse.Namespace, settings: Settings) -> int:
    """Download or search; one clear line for any failure, nothing half-trusted left in use."""
    from tts_bridge.hub.fetch import HubError

    if not args.debug:  # one line per HTTP request would bury the progress display
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        return _models_download(args, settings)
    except (HubError, ModelError) as exc:
        print(f"tts-bridge: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "\ntts-bridge: interrupted; nothing was trusted or moved into place. Run the same "
            "command again: it resumes from the files already downloaded",
            file=sys.stderr,
        )
        return 130


def _models_download(args: argparse.Namespace, settings: Settings) -> int:
    from tts_bridge.hub import chattts, piper

    if args.models_command == "search":
        revision = args.revision or piper.REVISION
        return 0 if piper.search(settings, args.lang, revision=revision, stream=sys.stdout) else 1
    if args.kind == "chattts":
        if args.name:
            print("tts-bridge: 'models download chattts' takes no NAME", file=sys.stderr)
            return 2
        chattts.download_chattts(settings, revision=args.revision or chattts.REVISION, yes=args.yes)
        return 0
    if args.kind == "kokoro":
        return _kokoro_download(args, settings)
    if not args.name:
        print(
            "tts-bridge: which voice? e.g. 'models download piper zh_CN-huayan-medium' "
            "(list them with 'models search piper zh')",
            file=sys.stderr,
        )
        return 2
    revision = args.revision or piper.REVISION
    piper.download_piper(
        settings, args.name, revision=revision, yes=args.yes, add_voice=args.add_voice
    )
    return 0


def _kokoro_download(args: argparse.Namespace, settings: Settings) -> int:
    from tts_bridge.hub import kokoro

    if not args.name:
        print("tts-bridge: which voice? e.g. 'models download kokoro af_sky'", file=sys.stderr)
        return 2
    kokoro.download_kokoro_voice(settings, args.name, yes=args.yes, add_voice=args.add_voice)
    return 0


def _add_hub_parsers(models_sub: Any, common: argparse.ArgumentParser) -> None:
    download = add_command(
        models_sub,
        "download",
        "fetch ChatTTS, a Piper or a Kokoro voice from the model hub (HF_ENDPOINT), verified",
        "Download model files from the hub at a revision this version checked (HF_ENDPOINT "
        "names a mirror), verify every file against its published digest before it is "
        "trusted, record it in the manifest; chattts then exports to ONNX, quantizes to INT8 "
        "and makes a default voice when the torch extra is installed.",
        [common],
    )
    download.add_argument("kind", choices=["chattts", "kokoro", "piper"], help="what to download")
    download.add_argument(
        "name", nargs="?", help="piper: the voice, e.g. zh_CN-huayan-medium; kokoro: af_sky"
    )
    download.add_argument("--revision", help="hub revision (default: the one this version checked)")
    download.add_argument("--yes", action="store_true", help="do not ask before downloading")
    download.add_argument(
        "--add-voice",
        metavar="VOICE",
        help="piper, kokoro: also add it to the voices file as VOICE",
    )
    search = add_command(
        models_sub,
        "search",
        "list the Piper voices on the model hub",
        "The Piper voices of the pinned voice list, with their languages and sizes.",
        [common],
    )
    search.add_argument("kind", choices=["piper"], help="what to search")
    search.add_argument("lang", nargs="?", help="language prefix, e.g. zh, de_DE, en_GB")
    search.add_argument("--revision", help="hub revision (default: the one this version checked)")
