"""The ChatTTS engine on the real ``chattts`` code path, with a tiny random checkpoint.

The checkpoint (tests/support/chattts_tiny.py) has the official layout but random weights, so the
audio is noise; everything else is real: hash checks, Config derived from the files, ChatTTS's
loader, tokenizer, GPT sampling with its KV cache, decoder and vocoder. Nothing is downloaded:
HF_HUB_OFFLINE is set before transformers can be imported.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import psutil
import pytest

from tests.support.chattts_tiny import HIDDEN_SIZE, TinyModels, make_tiny_checkpoint
from tts_bridge.engines.base import EngineError, FloatAudio, SynthesisOptions
from tts_bridge.engines.chattts.common import (
    MAX_CHUNK_SECONDS,
    MAX_GENERATION_SECONDS,
    SAMPLE_RATE,
    ChatTTSOptions,
    expected_seconds,
    max_new_tokens,
    split_for_generation,
    strip_control_tags,
)
from tts_bridge.engines.chattts.speaker import (
    SpeakerError,
    decode_spk_emb,
    encode_spk_emb,
    validate_spk_emb,
)
from tts_bridge.engines.chattts.torch_engine import (
    CHECKPOINT_FILES,
    SPK_STAT_FILE,
    ChatTTSEngine,
    chattts_config,
    official_sha256,
    read_checkpoint,
)
from tts_bridge.engines.manifests import sha256_file

REPO_ROOT = Path(__file__).resolve().parents[3]
ENGLISH = "The washing machine has finished."
CHINESE = "客厅的灯已经打开了。"
# One thread: the same thread count is part of determinism, and a single thread does not
# stall when other test processes share the CPU.
THREADS = 1

# Found without importing: importing ChatTTS would load torch into every test run.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ChatTTS") is None,
    reason="the 'chattts' extra (torch, chattts) is not installed",
)


# -- fixtures -----------------------------------------------------------------------------------


def _hashes(folder: Path) -> dict[str, str]:
    return {rel: sha256_file(folder / rel) for rel in (*CHECKPOINT_FILES, SPK_STAT_FILE)}


@pytest.fixture(scope="module")
def tiny_hashes(tiny_checkpoint: Path) -> dict[str, str]:
    """What the project's manifest would record for the tiny checkpoint."""
    return _hashes(tiny_checkpoint)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path, tiny_hashes: dict[str, str]) -> Iterator[ChatTTSEngine]:
    """A loaded engine on the tiny checkpoint, shared by this module's synthesis tests."""
    chattts = ChatTTSEngine(tiny_checkpoint, expected_sha256=tiny_hashes, threads=THREADS)
    chattts.load()
    yield chattts
    chattts.unload()


def _speak(
    engine: ChatTTSEngine, text: str, speaker: str | None, options: SynthesisOptions
) -> list[FloatAudio]:
    return list(engine.synthesize(text, speaker, options))


def _audio(chunks: list[FloatAudio]) -> FloatAudio:
    assert chunks, "no audio"
    return np.concatenate(chunks)


# -- without torch --------------------------------------------------------------------------------


def test_import_and_light_helpers_do_not_import_torch(
    tiny_checkpoint: Path, tiny_hashes: dict[str, str]
) -> None:
    code = """
import json, sys
from pathlib import Path
from tts_bridge.engines.chattts import torch_engine as m
from tts_bridge.engines.chattts.common import split_for_generation
folder = Path(sys.argv[1])
engine = m.ChatTTSEngine(folder, expected_sha256=json.loads(sys.argv[2]))
engine.identity
m.read_checkpoint(folder)
speaker = engine.sample_speaker(3)
engine.validate_speaker(speaker)
split_for_generation("Hello there. 晚饭准备好了。")
heavy = ("torch", "torchaudio", "transformers", "ChatTTS", "vocos", "numba")
print(json.dumps(sorted(n for n in sys.modules if n.split(".")[0] in heavy)))
"""
    result = subprocess.run(
        [sys.executable, "-c", code, str(tiny_checkpoint), json.dumps(tiny_hashes)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_checkpoint_sizes_come_from_its_files(tiny_checkpoint: Path) -> None:
    dims = read_checkpoint(tiny_checkpoint)
    assert dims.hidden_size == HIDDEN_SIZE
    assert dims.num_vq == 4
    assert dims.num_audio_tokens == 626
    assert dims.decoder.idim == HIDDEN_SIZE // 2
    assert dims.n_mels == 100
    assert dims.dvae_vq_groups == 2
    assert dims.vocos_head_n_fft == 1024
    config = json.loads((tiny_checkpoint / "asset/gpt/config.json").read_text("utf-8"))
    assert dims.num_hidden_layers == config["num_hidden_layers"]


def _write_header_only(path: Path, state: dict[str, Any]) -> None:
    """A safetensors header without the data: all read_checkpoint looks at."""
    header = {
        name: {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [0, 0]}
        for name, tensor in state.items()
    }
    raw = json.dumps(header).encode("utf-8")
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)


def test_official_architecture_derives_chattts_own_config(tmp_path: Path) -> None:
    """The full-size shapes give exactly ChatTTS's default Config: the real weights take the
    same path as the tiny checkpoint."""
    import torch
    from ChatTTS.config.config import Config
    from ChatTTS.model.dvae import DVAE
    from ChatTTS.model.embed import Embed

    # vocos ships no type information; importlib keeps mypy from asking for it.
    vocos = importlib.import_module("vocos")
    build = importlib.import_module("vocos.pretrained").instantiate_class
    default = Config()
    asset = tmp_path / "asset"
    (asset / "gpt").mkdir(parents=True)
    with torch.device("meta"):  # shapes only: the big embedding is never allocated
        embed = Embed(768, 626, 21178, 4)
        decoder = DVAE(decoder_config=asdict(default.decoder), dim=default.decoder.idim)
    dvae = DVAE(
        decoder_config=asdict(default.dvae.decoder),
        encoder_config=asdict(default.dvae.encoder),
        vq_config=asdict(default.dvae.vq),
        dim=default.dvae.decoder.idim,
    )
    vocoder = vocos.Vocos(
        feature_extractor=build(args=(), init=asdict(default.vocos.feature_extractor)),
        backbone=build(args=(), init=asdict(default.vocos.backbone)),
        head=build(args=(), init=asdict(default.vocos.head)),
    )
    for name, module in (
        ("Embed", embed),
        ("Decoder", decoder),
        ("DVAE", dvae),
        ("Vocos", vocoder),
    ):
        _write_header_only(asset / f"{name}.safetensors", module.state_dict())
    official_gpt = {  # the official asset/gpt/config.json (transformers 4.41 LlamaConfig)
        "hidden_size": 768,
        "intermediate_size": 3072,
        "max_position_embeddings": 4096,
        "model_type": "llama",
        "num_attention_heads": 12,
        "num_audio_tokens": 626,
        "num_hidden_layers": 20,
        "num_key_value_heads": 12,
        "num_text_tokens": None,
        "num_vq": 4,
        "spk_KL": False,
        "spk_emb_dim": 192,
        "vocab_size": 32000,
    }
    (asset / "gpt" / "config.json").write_text(json.dumps(official_gpt), "utf-8")

    derived = chattts_config(read_checkpoint(tmp_path), default.spk_stat)
    for section in ("decoder", "dvae", "gpt", "embed", "vocos", "path"):
        assert asdict(getattr(derived, section)) == asdict(getattr(default, section)), section
    assert derived.spk_stat == default.spk_stat
    # Fresh objects: ChatTTS's class-level defaults must not be shared, let alone edited.
    assert derived.gpt is not default.gpt


def test_same_seed_writes_the_same_checkpoint(tmp_path: Path, tiny_hashes: dict[str, str]) -> None:
    again = make_tiny_checkpoint(tmp_path / "again", seed=0)
    assert _hashes(again) == tiny_hashes


def test_identity_names_the_model_hash(tiny_checkpoint: Path, tiny_hashes: dict[str, str]) -> None:
    engine = ChatTTSEngine(tiny_checkpoint, expected_sha256=tiny_hashes)
    other = dict(tiny_hashes, **{"asset/Vocos.safetensors": "0" * 64})
    assert engine.identity.startswith("chattts:tiny:")
    assert engine.identity != ChatTTSEngine(tiny_checkpoint, expected_sha256=other).identity
    assert not engine.loaded
    assert not engine.is_official


def test_tampered_file_is_refused_naming_it(
    tmp_path: Path, tiny_checkpoint: Path, tiny_hashes: dict[str, str]
) -> None:
    folder = tmp_path / "tampered"
    shutil.copytree(tiny_checkpoint, folder)
    target = folder / "asset" / "Decoder.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    target.write_bytes(bytes(data))

    engine = ChatTTSEngine(folder, expected_sha256=tiny_hashes, threads=THREADS)
    with pytest.raises(EngineError) as caught:
        engine.load()
    message = str(caught.value)
    assert str(target) in message
    assert tiny_hashes["asset/Decoder.safetensors"] in message
    assert sha256_file(target) in message
    assert not engine.loaded
    # Nothing renamed or re-fetched (ChatTTS's source="local" would move it to .bak).
    assert target.is_file()
    assert not list(folder.rglob("*.bak"))


def test_file_without_expected_hash_is_refused(
    tiny_checkpoint: Path, tiny_hashes: dict[str, str]
) -> None:
    partial = {k: v for k, v in tiny_hashes.items() if k != SPK_STAT_FILE}
    engine = ChatTTSEngine(tiny_checkpoint, expected_sha256=partial)
    with pytest.raises(EngineError, match="no expected sha256"):
        engine.load()


def test_unlisted_checkpoint_is_checked_against_chattts_official_hashes(
    tiny_checkpoint: Path,
) -> None:
    official = official_sha256()
    assert set(official) == set(CHECKPOINT_FILES)
    engine = ChatTTSEngine(tiny_checkpoint)  # no manifest: must be the official release
    assert engine.is_official
    with pytest.raises(EngineError) as caught:
        engine.load()
    message = str(caught.value)
    first = tiny_checkpoint / CHECKPOINT_FILES[0]
    assert str(first) in message
    assert official[CHECKPOINT_FILES[0]] in message
    assert sha256_file(first) in message


def test_tampered_speaker_statistics_are_refused(
    tmp_path: Path, tiny_checkpoint: Path, tiny_hashes: dict[str, str]
) -> None:
    folder = tmp_path / "stats"
    shutil.copytree(tiny_checkpoint, folder)
    stats = folder / SPK_STAT_FILE
    stats.write_text(stats.read_text("utf-8").replace('"version": 1', '"version": 1 '), "utf-8")
    engine = ChatTTSEngine(folder, expected_sha256=tiny_hashes)
    with pytest.raises(EngineError, match=r"spk_stat\.json: sha256 mismatch"):
        engine.sample_speaker(1)


def test_sample_speaker_is_deterministic(
    tiny_checkpoint: Path, tiny_hashes: dict[str, str]
) -> None:
    engine = ChatTTSEngine(tiny_checkpoint, expected_sha256=tiny_hashes)
    first = engine.sample_speaker(42)
    assert first == engine.sample_speaker(42)
    assert first == ChatTTSEngine(tiny_checkpoint, expected_sha256=tiny_hashes).sample_speaker(42)
    assert first != engine.sample_speaker(43)
    validate_spk_emb(first, HIDDEN_SIZE)
    values = decode_spk_emb(first)
    assert values.dtype == np.float16
    assert values.shape == (HIDDEN_SIZE,)


MALFORMED = ("empty", "huge", "nan", "odd bytes", "plain text", "truncated", "wrong size", "zeros")
"""The cases of ``_malformed``, named here: building them needs pybase16384, which collection
must not (this module skips without the 'chattts' extra)."""


def _malformed() -> dict[str, str]:
    good = encode_spk_emb(np.linspace(-1, 1, HIDDEN_SIZE).astype(np.float16))
    return {
        "empty": "",
        "plain text": "not a speaker at all",
        "truncated": good[: len(good) // 2],
        "wrong size": encode_spk_emb(np.ones(768, dtype=np.float16)),
        "odd bytes": encode_spk_emb(np.ones(HIDDEN_SIZE, dtype=np.float16))[:-1],
        "nan": encode_spk_emb(np.full(HIDDEN_SIZE, np.nan, dtype=np.float16)),
        "zeros": encode_spk_emb(np.zeros(HIDDEN_SIZE, dtype=np.float16)),
        "huge": "愐" * 100_000,
    }


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_spk_emb_is_rejected(case: str) -> None:
    assert sorted(_malformed()) == list(MALFORMED)
    with pytest.raises(SpeakerError):
        validate_spk_emb(_malformed()[case], HIDDEN_SIZE)


def test_speaker_error_is_a_value_error_and_an_engine_error() -> None:
    # Config validators (pydantic) turn ValueError into a validation message.
    assert issubclass(SpeakerError, ValueError)
    assert issubclass(SpeakerError, EngineError)
    validate_spk_emb(encode_spk_emb(np.ones(HIDDEN_SIZE, dtype=np.float16)), HIDDEN_SIZE)


def test_malformed_speaker_fails_before_loading(
    tiny_checkpoint: Path, tiny_hashes: dict[str, str]
) -> None:
    engine = ChatTTSEngine(tiny_checkpoint, expected_sha256=tiny_hashes)
    with pytest.raises(SpeakerError):
        next(engine.synthesize(ENGLISH, "garbage", SynthesisOptions()))
    assert not engine.loaded


def test_nothing_speakable_loads_nothing(
    tiny_checkpoint: Path, tiny_hashes: dict[str, str]
) -> None:
    engine = ChatTTSEngine(tiny_checkpoint, expected_sha256=tiny_hashes)
    assert list(engine.synthesize("!!! 🎉", None, SynthesisOptions())) == []
    assert list(engine.synthesize("[speed_9][spk_emb]", None, SynthesisOptions())) == []
    assert not engine.loaded


def test_options_are_validated() -> None:
    assert ChatTTSOptions().speed_level == 5
    assert ChatTTSOptions(speed=1.4).speed_level == 7
    assert ChatTTSOptions(speed=0.2).speed_level == 1
    assert ChatTTSOptions(refine_text=True, oral_level=2, break_level=4).refine_prompt == (
        "[oral_2][break_4]"
    )
    for bad in (
        {"speed": 2.0},
        {"speed": 0.0},
        {"temperature": 0.0},
        {"temperature": 1.5},
        {"top_P": 0.0},
        {"top_K": 0},
        {"top_K": 1000},
        {"seed": -1},
        {"refine_text": True, "oral_level": 10},
        {"refine_text": True, "laugh_level": 3},
        {"refine_text": True, "break_level": 8},
        {"oral_level": 2},  # only meaningful with the refine pass
    ):
        with pytest.raises(ValueError):
            ChatTTSOptions(**bad)
    fields = ChatTTSOptions(seed=3, top_K=5).cache_fields()
    assert fields["seed"] == 3
    assert fields["top_K"] == 5
    assert fields != ChatTTSOptions().cache_fields()


def test_plain_options_out_of_range_are_an_engine_error(
    tiny_checkpoint: Path, tiny_hashes: dict[str, str]
) -> None:
    engine = ChatTTSEngine(tiny_checkpoint, expected_sha256=tiny_hashes)
    with pytest.raises(EngineError, match="speed"):
        next(engine.synthesize(ENGLISH, None, SynthesisOptions(speed=3.0)))


def test_long_text_is_split_below_the_generation_limit() -> None:
    english = " ".join(f"Sensor number {i} in the garden reports a low battery." for i in range(30))
    chinese = "今天晚上" * 80  # one long sentence without any punctuation
    for text in (english, chinese, f"{english} {chinese}。"):
        chunks = split_for_generation(text)
        assert len(chunks) > 1
        assert all(expected_seconds(c) <= MAX_CHUNK_SECONDS for c in chunks)
        assert "".join(chunks).replace(" ", "") == text.replace(" ", "")
    assert split_for_generation(ENGLISH) == [ENGLISH]
    assert split_for_generation("") == []
    # A slower speed means more audio per character, so smaller pieces.
    assert len(split_for_generation(english, speed_level=2)) > len(split_for_generation(english))


def test_control_tags_cannot_be_smuggled_in() -> None:
    assert strip_control_tags("[spk_emb][speed_9]Hello [uv_break] there [laugh]") == (
        "Hello [uv_break] there [laugh]"
    )


# -- with torch: the real ChatTTS path -----------------------------------------------------------


def _check_audio(audio: FloatAudio, text: str, speed_level: int = 5) -> None:
    assert audio.dtype == np.float32
    assert audio.ndim == 1
    assert np.isfinite(audio).all()
    assert np.abs(audio).max() <= 1.0
    assert np.abs(audio).max() > 0.0
    seconds = audio.size / SAMPLE_RATE
    budget = max_new_tokens(expected_seconds(text, speed_level)) * 512 / SAMPLE_RATE
    # The tiny model never samples EOS, so it speaks until the token budget (silence trimmed).
    assert 0.5 <= seconds <= budget + 0.05, f"{seconds:.2f} s for {text!r} (budget {budget:.2f})"


@pytest.mark.slow
@pytest.mark.parametrize("text", [ENGLISH, CHINESE])
def test_synthesizes_english_and_chinese(engine: ChatTTSEngine, text: str) -> None:
    assert engine.sample_rate == 24_000
    assert engine.loaded
    chunks = _speak(engine, text, None, SynthesisOptions())
    assert len(chunks) == 1
    _check_audio(_audio(chunks), text)


@pytest.mark.slow
def test_same_seed_same_audio(engine: ChatTTSEngine) -> None:
    speaker = engine.sample_speaker(7)
    options = ChatTTSOptions(seed=11)
    first = _audio(_speak(engine, ENGLISH, speaker, options))
    _speak(engine, CHINESE, speaker, ChatTTSOptions(seed=12))  # in between: nothing carries over
    again = _audio(_speak(engine, ENGLISH, speaker, options))
    assert np.array_equal(first, again)

    other_seed = _audio(_speak(engine, ENGLISH, speaker, ChatTTSOptions(seed=99)))
    other_speaker = _audio(_speak(engine, ENGLISH, engine.sample_speaker(8), options))
    assert not np.array_equal(first[: other_seed.size], other_seed[: first.size])
    assert not np.array_equal(first[: other_speaker.size], other_speaker[: first.size])


@pytest.mark.slow
def test_options_reach_chattts(engine: ChatTTSEngine) -> None:
    text = "Dinner is ready."
    slow = ChatTTSOptions(speed=0.6, seed=1)
    _check_audio(_audio(_speak(engine, text, None, slow)), text, slow.speed_level)
    refined = ChatTTSOptions(refine_text=True, oral_level=2, laugh_level=0, break_level=4)
    _check_audio(_audio(_speak(engine, text, None, refined)), text)
    plain = _audio(_speak(engine, text, None, ChatTTSOptions()))
    sampled = _audio(_speak(engine, text, None, ChatTTSOptions(temperature=0.9, top_K=5)))
    assert not np.array_equal(plain[: sampled.size], sampled[: plain.size])


@pytest.mark.slow
def test_long_text_uses_one_speaker_and_seed_per_chunk(engine: ChatTTSEngine) -> None:
    sentence = "The kitchen light is on."
    text = " ".join([sentence] * 12)
    assert expected_seconds(text) > MAX_CHUNK_SECONDS
    speaker = engine.sample_speaker(5)
    options = ChatTTSOptions(seed=21)
    chunks = _speak(engine, text, speaker, options)
    assert len(chunks) == 2
    for chunk in chunks:
        assert chunk.size / SAMPLE_RATE <= MAX_GENERATION_SECONDS + 0.05
    # The last chunk is that one sentence, spoken exactly as a request for it alone would be.
    alone = _audio(_speak(engine, sentence, speaker, options))
    assert np.array_equal(chunks[-1], alone)


@pytest.mark.slow
def test_speaker_format_matches_chattts(engine: ChatTTSEngine) -> None:
    from ChatTTS.model.speaker import Speaker

    chat = engine._loaded.chat  # type: ignore[union-attr]  # white-box: ChatTTS's own view
    ours = engine.sample_speaker(3)
    assert np.array_equal(Speaker._decode(ours), decode_spk_emb(ours))
    validate_spk_emb(chat.sample_random_speaker(), HIDDEN_SIZE)
    stats = engine.speaker_stats()
    assert np.array_equal(chat.speaker.std.numpy(), stats.std)
    assert np.array_equal(chat.speaker.mean.numpy(), stats.mean)


@pytest.mark.slow
def test_kv_cache_matches_a_full_forward_pass(engine: ChatTTSEngine) -> None:
    """Guards the transformers pin: ChatTTS drives LlamaModel's past_key_values by hand, and a
    transformers release that ignored or broke it would still produce (wrong) audio."""
    import torch

    chat = engine._loaded.chat  # type: ignore[union-attr]  # white-box: ChatTTS's internals
    text = ["the washing machine has finished"]
    params = chat.InferCodeParams(
        manual_seed=1, min_new_token=30, max_new_token=30, show_tqdm=False
    )
    result = next(chat._infer_code(list(text), False, torch.device("cpu"), True, params))
    ids, hiddens = result.ids[0], result.hiddens[0]
    prompt = chat.speaker.decorate_code_prompts(list(text), params.prompt, None, None)
    input_ids, _, text_mask = chat.tokenizer.encode(prompt, 4)
    length, steps = input_ids.shape[1], ids.shape[0]
    full_ids = torch.cat([input_ids[0], ids.to(input_ids.dtype)])[None]
    full_mask = torch.cat([text_mask[0], torch.zeros(steps, dtype=torch.bool)])[None]
    with torch.no_grad():
        embedded = chat.embed(full_ids, full_mask)
        out = chat.gpt.gpt(
            inputs_embeds=embedded,
            attention_mask=torch.ones(1, length + steps, dtype=torch.long),
            use_cache=False,
        ).last_hidden_state[0]
    reference = out[length - 1 : length - 1 + steps]
    assert steps == 30
    assert torch.allclose(reference, hiddens, atol=1e-4), (reference - hiddens).abs().max()


@pytest.mark.slow
def test_unload_gives_the_memory_back(tiny_models: TinyModels) -> None:
    # Big enough that allocator noise does not hide the model.
    folder = tiny_models.checkpoint(2, hidden_size=512, num_layers=8)
    engine = ChatTTSEngine(folder, expected_sha256=_hashes(folder), threads=THREADS)
    process = psutil.Process()

    def rss_mb() -> float:
        gc.collect()
        return float(process.memory_info().rss) / 2**20

    # A first cycle pays the one-off costs (imports, numba compilation, torch's pools).
    engine.load()
    _speak(engine, "Hi.", None, SynthesisOptions())
    engine.unload()

    before = rss_mb()
    engine.load()
    _speak(engine, "Hi.", None, SynthesisOptions())
    loaded = rss_mb()
    engine.unload()
    after = rss_mb()
    growth = loaded - before
    assert not engine.loaded
    assert growth > 60, f"loading grew RSS by only {growth:.0f} MB; the test measures nothing"
    assert after - before < 0.25 * growth, (
        f"RSS {before:.0f} MB before load, {loaded:.0f} loaded, {after:.0f} after unload"
    )
