"""Command line: run, say, cache, voices, bench. Only argument parsing and start-up live here."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from tts_bridge import __version__
from tts_bridge.cli.models import add_models_parser
from tts_bridge.cli.parsing import HelpFormatter, add_command
from tts_bridge.cli.service import add_service_parser
from tts_bridge.config import ConfigError, Settings, load_settings
from tts_bridge.engines import catalog as _engines  # noqa: F401 (voices are checked as they load)
from tts_bridge.speech.request import SpeechRequest

if TYPE_CHECKING:
    from tts_bridge.speech.synthesis import Synthesizer
    from tts_bridge.system.threads import ThreadPlan

_LOGGER = logging.getLogger(__name__)

EXIT_RUNTIME = 1
EXIT_CONFIG = 2
"""Usage or configuration: the command cannot start as given."""


class _UsageError(Exception):
    """An argument that cannot be used (a missing input file); one line, exit status 2."""


DEFAULT_BENCH_OUT = Path("bench/results/bench.json")
DEFAULT_CHATTTS_BENCH_OUT = Path("bench/results/chattts")
DEFAULT_WER_OUT = Path("bench/results/wer.json")
DEFAULT_CER_OUT = Path("bench/results/cer.json")
DEFAULT_ENCODING_OUT = Path("bench/results/encoding.json")
DEFAULT_HTTP_OUT = Path("bench/results/http_api.json")
DEFAULT_LOUDNESS_OUT = Path("bench/results/loudness.json")


def _setup_logging(settings: Settings | None, debug: bool) -> None:
    level = "DEBUG" if debug else (settings.logging.level if settings else "INFO")
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    if not debug:  # paho and piper are chatty at DEBUG; keep them quiet unless asked
        for noisy in ("piper", "hibari"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    # numba logs its compiler's every pass at DEBUG (megabytes per ChatTTS load): nothing about
    # the bridge a --debug reader wants.
    logging.getLogger("numba").setLevel(logging.WARNING)


def _flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    mqtt: dict[str, Any] = {}
    if getattr(args, "host", None):
        mqtt["host"] = args.host
    if getattr(args, "port", None):
        mqtt["port"] = args.port
    overrides: dict[str, Any] = {"mqtt": mqtt} if mqtt else {}
    if getattr(args, "cache_dir", None):
        overrides["cache"] = {"dir": args.cache_dir}
    return overrides


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config, _flag_overrides(args))


def _thread_plan(settings: Settings) -> ThreadPlan:
    """The hardware plan, with the settings' explicit values taking precedence."""
    from tts_bridge.app import thread_plan

    return thread_plan(settings)


def _build_synthesizer(settings: Settings, plan: ThreadPlan) -> Synthesizer:
    from tts_bridge.app import build_synthesizer

    return build_synthesizer(settings, plan)


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from tts_bridge import app

    plan = _thread_plan(settings)
    for line in plan.describe():
        _LOGGER.info("Thread plan: %s", line)
    service = app.build(settings, plan=plan)
    stop = threading.Event()
    reload = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        _LOGGER.info("Received %s", signal.Signals(signum).name)
        stop.set()

    def _on_hangup(signum: int, frame: FrameType | None) -> None:
        reload.set()  # reloaded by the loop below: a signal handler must not build voices

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, _on_hangup)
    _LOGGER.info(
        "tts_bridge %s: base topic %r, voices %s (default %s), cache %s",
        __version__,
        settings.mqtt.base_topic,
        ", ".join(settings.voices),
        settings.default_voice,
        settings.cache.dir,
    )
    service.start()
    while not stop.wait(1.0):
        if reload.is_set():
            reload.clear()
            _LOGGER.info("SIGHUP: reading the voices file again")
            service.reload_voices()
    service.stop()
    return 0


def _check_output(path: Path) -> str | None:
    """Why a WAV cannot be written to ``path`` (checked before minutes of synthesis), or None."""
    folder = path.parent
    if path.is_dir():
        return f"{path} is a folder; give a file name such as {path / 'out.wav'}"
    if not folder.is_dir():
        return f"folder {folder} does not exist; create it first (mkdir -p {folder})"
    if not os.access(folder, os.W_OK):
        return f"folder {folder} is not writable"
    return None


def cmd_say(args: argparse.Namespace, settings: Settings) -> int:
    from tts_bridge.engines.registry import UnknownVoiceError
    from tts_bridge.speech.synthesis import RequestError

    to_stdout = str(args.output) == "-"
    problem = None if to_stdout else _check_output(args.output)
    if problem:
        print(f"tts-bridge: say -o: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    text = args.text if args.text != "-" else sys.stdin.read()
    synth = _build_synthesizer(settings, _thread_plan(settings))
    try:
        request = SpeechRequest(
            text=text,
            voice=args.voice,
            language=args.lang,
            use_cache=not args.no_cache,
            door="cli",
        )
        rendering = synth.speak(request)
    except RequestError as exc:
        print(f"error ({exc.code}): {exc}", file=sys.stderr)
        return 1
    except UnknownVoiceError as exc:
        print(f"error (unknown_voice): {exc.args[0]}", file=sys.stderr)
        return 1
    finally:
        synth.cache.close()
    if to_stdout:
        sys.stdout.buffer.write(rendering.wav)
        sys.stdout.buffer.flush()
    else:
        args.output.write_bytes(rendering.wav)
    # With -o - the WAV is standard output, so the summary goes to standard error.
    print(
        f"{'(stdout)' if to_stdout else args.output}: {rendering.duration_ms} ms, "
        f"{rendering.sample_rate} Hz, voice {rendering.voice} ({rendering.engine}), "
        f"{rendering.cached_sentences}/{rendering.sentences} sentences from the cache",
        file=sys.stderr if to_stdout else sys.stdout,
    )
    return 0


def cmd_cache(args: argparse.Namespace, settings: Settings) -> int:
    from tts_bridge.speech.cache import SentenceCache

    cache = SentenceCache(settings.cache)
    try:
        if args.cache_command == "clear":
            removed = cache.clear()
            print(f"removed {removed} entries from {cache.directory}")
        else:
            print(json.dumps(cache.stats(), indent=2))
    finally:
        cache.close()
    return 0


def cmd_voices(args: argparse.Namespace, settings: Settings) -> int:
    from tts_bridge.engines.registry import EnginePool

    pool = EnginePool(settings)
    rows = [("", "VOICE", "ENGINE", "BACKEND", "TIER", "LANGUAGES", "RATE", "FAST VOICE", "MODEL")]
    notes: dict[str, str] = {}
    for voice in pool:
        rows.append(
            (
                "*" if voice.name == settings.default_voice else "",
                voice.name,
                voice.engine.name,
                voice.backend or "-",
                voice.tier,
                ",".join(sorted(voice.engine.languages)),
                f"{voice.engine.sample_rate} Hz",
                voice.settings.fast_voice or "-",
                voice.engine.identity,
            )
        )
        if voice.backend_note:  # ChatTTS voices: why torch or the ONNX export
            notes[voice.name] = f"backend {voice.backend}: {voice.backend_note}"
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print(" ".join([*cells, row[-1]]).rstrip())
        if row[1] in notes:
            print(f"  {'':<{widths[1]}} {notes[row[1]]}")
    print("* = default_voice; FAST VOICE answers when this voice would be too slow")
    return 0


def cmd_play(args: argparse.Namespace, settings: Settings) -> int:
    from tts_bridge.cli.play import run_player

    mqtt = settings.mqtt
    return run_player(
        mqtt.host,
        mqtt.port,
        mqtt.base_topic,
        args.target,
        args.out,
        username=mqtt.username,
        password=mqtt.password,
        tls=mqtt if mqtt.tls.enabled else None,
        count=args.count,
    )


def _read_phrases_file(path: Path) -> list[str]:
    """Phrases from a ``--file``, one per line ('#' starts a comment)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _UsageError(f"prerender --file: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _UsageError(f"prerender --file: {path} is not UTF-8 text") from None
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def cmd_prerender(args: argparse.Namespace, settings: Settings) -> int:
    """Render phrases into the cache without a broker, with a progress bar on a terminal."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from tts_bridge.engines.registry import UnknownVoiceError
    from tts_bridge.speech.idle import read_phrases
    from tts_bridge.speech.synthesis import RequestError, prepare_text

    texts = list(args.phrases)
    if args.file is not None:
        texts += _read_phrases_file(args.file)
    if not texts:
        texts = read_phrases(settings)
    synth = _build_synthesizer(settings, _thread_plan(settings))
    try:
        voice = synth.engines.voice(args.voice)
        sentences = []
        for text in texts:
            try:
                sentences += prepare_text(text, settings.limits.max_text_chars)
            except RequestError as exc:
                print(f"skipped ({exc.code}): {text[:60]!r}", file=sys.stderr)
        options = synth.options_for(voice)
        rendered = cached = 0
        # disable=None: a bar on a terminal, nothing on a pipe or in a log (no "\r" lines).
        with (
            logging_redirect_tqdm(),  # log lines above the bar instead of through it
            tqdm(total=len(sentences), unit="sentence", file=sys.stderr, disable=None) as bar,
        ):
            # The first sentence loads the model, which can take a while: say so.
            bar.set_description_str(f"loading {voice.name}")
            for sentence in sentences:
                piece = synth.sentence(voice, 0, sentence, options, True)
                cached += piece.cached
                rendered += not piece.cached
                bar.set_description_str(voice.name, refresh=False)
                bar.update()
    except UnknownVoiceError as exc:
        print(f"error (unknown_voice): {exc.args[0]}", file=sys.stderr)
        return 1
    finally:
        synth.cache.close()
    print(
        f"{len(sentences)} sentences for voice {voice.name}: {rendered} rendered, {cached} cached"
    )
    return 0


def cmd_voices_new(args: argparse.Namespace, settings: Settings) -> int:
    """Sample a ChatTTS speaker deterministically from a seed and store it in the voices file."""
    from tts_bridge.engines.base import EngineError
    from tts_bridge.engines.voices_file import VoicesFileError, chattts_voice_from_seed, write_voice
    from tts_bridge.settings_base import NAME_PATTERN

    if not re.match(NAME_PATTERN, args.name):
        print(f"error: voice name must match {NAME_PATTERN}", file=sys.stderr)
        return 1
    if args.name in settings.voices and not args.force:
        print(f"error: voice {args.name!r} exists (use --force to replace it)", file=sys.stderr)
        return 1
    try:
        entry = chattts_voice_from_seed(settings, args.seed, args.model, args.fast_voice)
        write_voice(
            settings.voices_file, args.name, entry.model_dump(mode="json", exclude_none=True)
        )
    except (EngineError, VoicesFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"voice {args.name!r} (seed {args.seed}) written to {settings.voices_file}")
    return 0


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from tts_bridge.cli.doctor import run_doctor

    return run_doctor(settings, _thread_plan(settings), sys.stdout)


def _bench_doors_or_sweep(args: argparse.Namespace, settings: Settings) -> None:
    if args.stages:
        from tts_bridge.bench.stages import DEFAULT_OUT as STAGES_OUT
        from tts_bridge.bench.stages import run_stages_bench

        run_stages_bench(settings, args.out if args.out != DEFAULT_BENCH_OUT else STAGES_OUT)
        return
    if args.doors:
        from tts_bridge.bench.doors import DEFAULT_OUT, run_doors_bench

        out = args.out if args.out != DEFAULT_BENCH_OUT else DEFAULT_OUT
        run_doors_bench(settings, args.idle, min(args.requests, 50), out)
        return
    from tts_bridge.bench.sweep import run_sweep

    out = args.out if args.out != DEFAULT_BENCH_OUT else args.out.with_name("sweep.json")
    run_sweep(settings, out, repeats=args.repeats)


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    if args.cer:
        from tts_bridge.bench.cer import run_cer_bench

        out = args.out if args.out != DEFAULT_BENCH_OUT else DEFAULT_CER_OUT
        if args.voice:
            run_cer_bench(settings, out, args.voice[0])
        else:
            run_cer_bench(settings, out)
        return 0
    if args.wer:
        from tts_bridge.bench.wer import run_wer_bench

        out = args.out if args.out != DEFAULT_BENCH_OUT else DEFAULT_WER_OUT
        if args.voice:
            run_wer_bench(settings, out, tuple(args.voice))
        else:
            run_wer_bench(settings, out)
        return 0
    if args.chattts:
        from tts_bridge.bench.chattts import run_chattts_bench

        # --out is the work folder here: checkpoint, ONNX export and results.json.
        out = args.out if args.out != DEFAULT_BENCH_OUT else DEFAULT_CHATTTS_BENCH_OUT
        run_chattts_bench(out, args.tokens, args.batches, rounds=args.rounds)
        return 0
    if args.http:
        from tts_bridge.bench.http_api import main_report

        main_report(settings, args.out if args.out != DEFAULT_BENCH_OUT else DEFAULT_HTTP_OUT)
    elif args.encoding:
        from tts_bridge.bench.engines import run_encoding_bench

        run_encoding_bench(args.out if args.out != DEFAULT_BENCH_OUT else DEFAULT_ENCODING_OUT)
    elif args.loudness:
        from tts_bridge.bench.loudness import run_loudness_bench

        run_loudness_bench(
            settings, args.out if args.out != DEFAULT_BENCH_OUT else DEFAULT_LOUDNESS_OUT
        )
    if args.http or args.encoding or args.loudness:
        return 0
    if args.doors or args.sweep or args.stages:
        _bench_doors_or_sweep(args, settings)
        return 0
    from tts_bridge.bench.engines import run_bench

    return int(run_bench(settings, args))


def _add_voices_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    voices = add_command(
        sub,
        "voices",
        "list or make voices",
        "List the configured voices (the default; with engine, tier, languages and fast voice) "
        "or make a ChatTTS voice from a seed.",
        [common],
    )
    voices.set_defaults(func=cmd_voices)
    voices_sub = voices.add_subparsers(dest="voices_command", metavar="{list,new}")
    voices_list = add_command(
        voices_sub,
        "list",
        "list the voices",
        "One line per configured voice: engine, backend, tier, languages, sample rate, the "
        "fast voice that answers when it would be too slow, and the model.",
        [common],
    )
    voices_list.set_defaults(func=cmd_voices)
    new = add_command(
        voices_sub,
        "new",
        "make a ChatTTS voice from a seed",
        "Sample a ChatTTS speaker from a seed (the same seed gives the same voice) and store "
        "it in voices_file, which is merged into the configured voices.",
        [common],
    )
    new.add_argument("name", help="voice name")
    new.add_argument("--seed", type=int, required=True, help="the same seed gives the same voice")
    new.add_argument(
        "--model", type=Path, help="ChatTTS checkpoint folder (default: a chattts voice's)"
    )
    new.add_argument(
        "--fast-voice",
        default="auto",
        help="fast tier voice; auto = the same speaker on the ONNX export's INT8 graphs "
        "once there is one, else heart",
    )
    new.add_argument("--force", action="store_true", help="replace an existing voice")
    new.set_defaults(func=cmd_voices_new)


def _add_cache_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    cache = add_command(
        sub,
        "cache",
        "show or clear the sentence cache",
        "Show the sentence cache's statistics or remove every entry.",
        [common],
    )
    cache_sub = cache.add_subparsers(dest="cache_command", required=True, metavar="{stats,clear}")
    stats = add_command(
        cache_sub,
        "stats",
        "entries, size and hit counts (JSON)",
        "Print the sentence cache's statistics as JSON: entries, bytes on disk, hits, misses.",
        [common],
    )
    stats.set_defaults(func=cmd_cache)
    clear = add_command(
        cache_sub,
        "clear",
        "remove every cached sentence",
        "Remove every sentence from the cache (they are synthesized again when asked).",
        [common],
    )
    clear.set_defaults(func=cmd_cache)


def _add_bench_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    bench = add_command(
        sub,
        "bench",
        "measure engines and cache latency",
        "Measure each engine's speed and the cache-hit latency over MQTT, or a thread sweep, "
        "or full-size ChatTTS on random weights (--chattts); it starts its own private broker.",
        [common],
    )
    bench.add_argument("--requests", type=int, default=200, help="cache-hit requests over MQTT")
    bench.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_BENCH_OUT,
        help="results file; with --chattts the work folder (checkpoint, onnx, results.json)",
    )
    bench.add_argument(
        "--sweep", action="store_true", help="threads (1, 2) x concurrency (1, 2) sweep"
    )
    bench.add_argument("--repeats", type=int, default=2, help="sweep rounds (best run kept)")
    bench.add_argument(
        "--chattts",
        action="store_true",
        help="full-size ChatTTS on random weights: torch and ONNX, FP32 and INT8",
    )
    bench.add_argument("--tokens", type=int, default=200, help="GPT tokens per text (--chattts)")
    bench.add_argument(
        "--batches", type=int, nargs="+", default=[1, 4], help="batch sizes (--chattts)"
    )
    bench.add_argument(
        "--rounds", type=int, default=1, help="interleaved rounds, best kept (--chattts)"
    )
    bench.add_argument(
        "--wer",
        action="store_true",
        help="word error rate of joe and heart on home announcements, plain vs bridge "
        "(needs the bench extra)",
    )
    bench.add_argument(
        "--voice",
        action="append",
        help="--wer: a voice to score (repeat for more; default joe and heart); "
        "--cer: the Chinese voice (default xiaobei)",
    )
    bench.add_argument(
        "--cer",
        action="store_true",
        help="character error rate, real-time factor and memory of the Chinese voice xiaobei "
        "on household announcements (needs the bench extra)",
    )
    bench.add_argument(
        "--loudness",
        action="store_true",
        help="each voice's loudness and its spread on home announcements, before and after "
        "normalization",
    )
    bench.add_argument(
        "--encoding",
        action="store_true",
        help="only the encoding cost (MP3, Opus, FLAC, WAV) per second of audio",
    )
    bench.add_argument(
        "--http",
        action="store_true",
        help="only the HTTP speech API's time to first byte (streamed WAV, MP3), new and cached",
    )
    bench.add_argument(
        "--stages",
        action="store_true",
        help="where each request's time goes (queue, front end, engine, loudness, first byte, "
        "encoding, cache write) per door (MQTT, Wyoming, HTTP), uncached and cached",
    )
    bench.add_argument(
        "--doors",
        action="store_true",
        help="cache-hit latency over MQTT while idle HTTP connections, a Wyoming flood and "
        "clients that never read are held",
    )
    bench.add_argument("--idle", type=int, default=1000, help="idle HTTP connections (--doors)")
    bench.add_argument("--skip-mqtt", action="store_true", help="only the engine measurements")
    bench.add_argument("--burst", type=int, default=12, help="live requests in the routing burst")
    bench.set_defaults(func=cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tts-bridge",
        description="MQTT text-to-speech bridge for the home: text in, WAV out.",
        epilog="Every command takes --config FILE, --cache-dir DIR and --debug; "
        "`tts-bridge COMMAND --help` describes each.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tts-bridge {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", type=Path, help="YAML settings file (default: $TTS_BRIDGE_CONFIG, if set)"
    )
    common.add_argument("--debug", action="store_true", help="log at DEBUG level; show tracebacks")
    common.add_argument("--cache-dir", type=Path, help="override cache.dir")
    broker = argparse.ArgumentParser(add_help=False)
    broker.add_argument("--host", help="broker host; overrides mqtt.host")
    broker.add_argument("--port", type=int, help="broker port; overrides mqtt.port")
    sub = parser.add_subparsers(dest="command", required=True)

    run = add_command(
        sub,
        "run",
        "run the MQTT bridge",
        "Connect to the broker and answer say requests until stopped (SIGTERM or Ctrl-C).",
        [common, broker],
    )
    run.set_defaults(func=cmd_run)

    say = add_command(
        sub,
        "say",
        "synthesize offline to a WAV file",
        "Speak a text into a WAV file without a broker, through the sentence cache.",
        [common],
    )
    say.add_argument("text", help="text to speak ('-' reads standard input)")
    say.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        help="WAV file to write ('-' writes it to standard output)",
    )
    say.add_argument("--voice", help="voice name (default: default_voice)")
    say.add_argument("--lang", help="language of the text (e.g. en, zh)")
    say.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    say.set_defaults(func=cmd_say)

    _add_cache_parser(sub, common)
    _add_voices_parser(sub, common)
    add_models_parser(sub, common)
    add_service_parser(sub, common)
    play = add_command(
        sub,
        "play",
        "play (or save) what a target receives",
        "Subscribe to a say target's audio and play each WAV (aplay, paplay or ffplay), or "
        "write the files to a folder with --out.",
        [common, broker],
    )
    play.add_argument("--target", default="default", help="say target to listen to ('+' = all)")
    play.add_argument("--out", type=Path, help="write WAV files here instead of playing them")
    play.add_argument("--count", type=int, help="stop after this many messages")
    play.set_defaults(func=cmd_play)

    pre = add_command(
        sub,
        "prerender",
        "render phrases into the cache",
        "Render phrases into the sentence cache without a broker, so they are answered from "
        "the cache later.",
        [common],
    )
    pre.add_argument("phrases", nargs="*", help="phrases (default: the config's phrases)")
    pre.add_argument("--file", type=Path, help="a file of phrases, one per line ('#' comments)")
    pre.add_argument("--voice", help="voice (default: default_voice)")
    pre.set_defaults(func=cmd_prerender)

    _add_bench_parser(sub, common)

    doctor = add_command(
        sub,
        "doctor",
        "check the setup, line by line",
        "Check the broker, the models and voices, the cache folder and disk, and the thread "
        "plan, one line each; exits 1 when a check fails.",
        [common, broker],
    )
    doctor.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"tts-bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    _setup_logging(settings, args.debug)
    from tts_bridge.engines.base import EngineError
    from tts_bridge.mqtt.journal import JournalError
    from tts_bridge.system.folders import FolderError

    try:
        return int(args.func(args, settings))
    except (EngineError, _UsageError) as exc:  # a model, manifest or argument problem
        print(f"tts-bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except FolderError as exc:  # not even a temporary folder can be written
        print(f"tts-bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except JournalError as exc:  # e.g. another bridge already runs on this journal
        if args.debug:
            raise
        hint = ""
        if "in use" in str(exc):
            hint = (
                " (another tts-bridge runs on it: stop that one, or give this one its own "
                "journal.path, e.g. TTS_BRIDGE_JOURNAL__PATH)"
            )
        print(f"tts-bridge: {exc}{hint}", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        return 130
