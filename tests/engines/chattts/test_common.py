"""What both ChatTTS engines share (common): the split into generations, the speech
estimate that budgets idle batches, and the file checks' messages. No model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tts_bridge.engines.base import BatchEngine, EngineError, SynthesisOptions
from tts_bridge.engines.chattts.common import (
    MAX_CHUNK_SECONDS,
    ChatTTSOptions,
    expected_seconds,
    split_for_generation,
    strip_control_tags,
)
from tts_bridge.engines.chattts.onnx_engine import ChatTTSOnnxEngine
from tts_bridge.engines.chattts.onnx_format import FORMAT, FORMAT_VERSION, MANIFEST_FILE
from tts_bridge.engines.chattts.torch_engine import CHECKPOINT_FILES, SPK_STAT_FILE, ChatTTSEngine

LONG = " ".join(
    f"Sentence number {n} tells the house what happened in the kitchen." for n in range(12)
)


def _engines(folder: Path) -> list[ChatTTSEngine | ChatTTSOnnxEngine]:
    return [ChatTTSEngine(folder), ChatTTSOnnxEngine(folder)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello there.", ["Hello there."]),
        # Request-supplied prompt tags go, pause and laugh tags stay.
        ("[spk_emb][speed_9]Hello [uv_break] there [laugh]", ["Hello [uv_break] there [laugh]"]),
        ("?!", []),
        ("🎉", []),
        # A stray "!]" joins its sentence without the space: "[now!!]" is a tag only after the
        # split, and must not reach the prompt.
        ("Open it [now! !] please.", ["Open it please."]),
        ("[x! !]", []),
        ("好的 [a！ ！]", ["好的"]),
    ],
)
def test_generations_are_speakable_and_tag_free(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    for engine in _engines(tmp_path):
        assert engine.generations(text, ChatTTSOptions()) == expected, engine.name


def test_split_alone_lets_a_tag_form_that_generations_removes() -> None:
    # Why `generations` strips each chunk again: the first strip never saw this tag.
    (chunk,) = split_for_generation(strip_control_tags("Open it [now! !] please."))
    assert chunk == "Open it [now!!] please."
    assert strip_control_tags(chunk) == "Open it please."


def test_generations_split_long_text_at_the_speed_asked(tmp_path: Path) -> None:
    assert expected_seconds(LONG) > MAX_CHUNK_SECONDS
    for engine in _engines(tmp_path):
        normal = engine.generations(LONG, ChatTTSOptions())
        slow = engine.generations(LONG, ChatTTSOptions(speed=0.4))
        assert len(normal) > 1
        assert len(slow) > len(normal)
        assert all(expected_seconds(g) <= MAX_CHUNK_SECONDS for g in normal)
        # Plain options take the speed (the engine's defaults for the rest).
        assert engine.generations(LONG, SynthesisOptions(speed=0.4)) == slow


def test_speech_seconds_do_not_count_control_tags(tmp_path: Path) -> None:
    tagged = "[spk_emb][speed_9][Ptts]Hello there, how are you?"
    for engine in _engines(tmp_path):
        seconds = engine.speech_seconds(tagged, ChatTTSOptions())
        assert seconds == expected_seconds("Hello there, how are you?")
        assert seconds < expected_seconds(tagged)
        slow = engine.speech_seconds(tagged, ChatTTSOptions(speed=0.4))
        assert slow == expected_seconds("Hello there, how are you?", speed_level=2)


def test_only_the_onnx_engine_batches(tmp_path: Path) -> None:
    batching: BatchEngine = ChatTTSOnnxEngine(tmp_path)  # mypy checks the protocol here
    assert isinstance(batching, BatchEngine)
    assert not isinstance(ChatTTSEngine(tmp_path), BatchEngine)


def test_file_check_messages_name_the_engine(tmp_path: Path) -> None:
    torch_files = (*CHECKPOINT_FILES, SPK_STAT_FILE)
    with pytest.raises(EngineError, match=r"missing \(ChatTTS checkpoint incomplete\)"):
        ChatTTSEngine(tmp_path, expected_sha256=dict.fromkeys(torch_files, "0" * 64)).verify()
    with pytest.raises(EngineError, match=r"no expected sha256 .*\(tts-bridge models add\)$"):
        ChatTTSEngine(tmp_path, expected_sha256={}).verify()

    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "files": {},
        "variants": {"int8": {"gpt": "gpt.onnx", "decoder": "dec.onnx", "vocos": "voc.onnx"}},
    }
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    onnx = ChatTTSOnnxEngine(tmp_path, expected_sha256={"config.json": "0" * 64})
    with pytest.raises(
        EngineError, match=r"config\.json: missing \(ChatTTS ONNX export incomplete\)"
    ):
        onnx.verify()
    with pytest.raises(EngineError, match=r"config\.json: no expected sha256 for this file$"):
        ChatTTSOnnxEngine(tmp_path).verify()
