"""The engines room's settings: where models live and the configured voices."""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import Any, Literal, Protocol

from pydantic import ConfigDict, Field, model_validator

from tts_bridge.settings_base import ExpandedPath, Section, default_data_dir

Precision = Literal["fp32", "int8", "int4", "int8-all"]
"""A model's weights as a voice asks for them (engines with one set of weights ignore it)."""

AUTO_FAST_VOICE = "auto"
"""A voice's fast_voice that the engine pool chooses (see VoiceSettings.fast_voice)."""


class ModelsSettings(Section):
    dir: ExpandedPath = Field(default_factory=lambda: default_data_dir() / "models")
    """Folder for model files that do not come with a Python package."""
    idle_unload_s: int = Field(600, ge=0)
    """Unload a model unused for this long, so its memory comes back (0 = never)."""
    memory_budget_mb: int | None = Field(None, ge=64)
    """Memory the loaded models may use; empty = the hardware plan (60% of RAM). The least
    recently used model is unloaded to make room; a model that cannot fit is refused."""


class VoiceSettings(Section):
    """One configured voice (voices.<name>): the keys every engine reads, and the keys only its
    engine takes (ChatTTS: spk_emb, spk_emb_sha256, backend), which its ``EngineSpec``
    declares and checks. The settings module knows no engine: the engine catalog installs its
    rules (``use_voice_rules``)."""

    # Engine keys are kept as written (model_extra) and checked by the engine's own schema.
    model_config = ConfigDict(extra="allow", validate_default=True)

    engine: str
    """Which engine speaks this voice: piper, hibari, chattts, chattts-onnx (an export made by
    `models export`), or any other registered kind (see engines.catalog)."""
    model: ExpandedPath | None = None
    """Model file (Piper, hibari) or checkpoint folder (ChatTTS, in ChatTTS's asset layout);
    relative paths are under models.dir; empty = the model bundled with the engine's package."""
    speaker: str | None = None
    """Engine voice or speaker name (hibari: only the bundled 'heart' exists offline)."""
    precision: Precision = "int8"
    """chattts-onnx only: which graphs of the export to run (after `models quantize`: int8;
    int4 after `models quantize --int4`, smaller but less faithful: for boards short of memory;
    int8-all after `models quantize --int8-all`: the decoder and Vocos in INT8 too, about
    110 MB less memory at some cost in the waveform)."""
    tier: Literal["quality", "fast"] | None = None
    """The tier this voice reports; empty = its engine's (chattts-onnx: fast)."""
    options: dict[str, float | int | bool] = Field(default_factory=dict)
    """Engine synthesis defaults (ChatTTS: temperature, top_P, top_K, refine_text, oral_level,
    laugh_level, break_level, seed); requests may override them."""
    speed: float = Field(1.0, ge=0.5, le=2.0)
    """Speaking rate, 1.0 = the model's own pace."""
    description: str = ""
    """Free text shown in bridge/info."""
    fast_voice: str | None = None
    """Voice that answers for this one when this one would miss the latency budget (fast tier);
    its sentences are re-rendered with this voice at idle and served from the cache later.
    ChatTTS voices may say "auto": the same speaker on the INT8 graphs of the checkpoint's ONNX
    export when there is one, else the voice "heart" (if configured)."""

    @model_validator(mode="after")
    def _check_with_its_engine(self) -> VoiceSettings:
        rules = voice_rules()
        if rules is not None:
            extra = self.__pydantic_extra__ or {}
            for key in rules.check_voice(self):
                extra.pop(key, None)
        return self

    def engine_options(self) -> dict[str, Any]:
        """The keys only its engine takes (ChatTTS's spk_emb), as written: the engine's
        ``EngineSpec.voice_options`` schema reads them."""
        return dict(self.model_extra or {})


class VoiceRules(Protocol):
    """What the engines know about a configured voice, asked while the settings load."""

    def check_voice(self, voice: VoiceSettings) -> Collection[str]:
        """Raises ValueError, its message starting with the key it is about, when ``voice``
        names an unknown engine or its engine refuses its options; returns the keys the voice
        gives that only other engines take, left at their default (they mean "not set")."""

    def takes_auto_fast_voice(self, engine: str) -> bool:
        """Whether voices of ``engine`` may say ``fast_voice: auto``."""


_RULES_LOCK = threading.Lock()
_rules: VoiceRules | None = None


def use_voice_rules(rules: VoiceRules) -> None:
    """Install the engines' rules (the engine catalog does so when it is imported): from then
    on every voice is checked by its engine when it is configured."""
    global _rules  # noqa: PLW0603 - the one set of rules of the one catalog
    with _RULES_LOCK:
        _rules = rules


def voice_rules() -> VoiceRules | None:
    """The installed rules; None before the engine catalog is imported (the engine pool then
    checks each voice when it builds it)."""
    return _rules


def default_voices() -> dict[str, VoiceSettings]:
    return {
        "joe": VoiceSettings(
            engine="piper", description="Piper en_US joe medium (22.05 kHz)", fast_voice="heart"
        ),
        "heart": VoiceSettings(engine="hibari", description="hibari heart, INT8 ONNX (24 kHz)"),
        # Chinese on every install: the sentences in Chinese of any request go to it.
        "xiaobei": VoiceSettings(
            engine="kokoro",
            speaker="zf_xiaobei",
            description="Kokoro v1.0 zf_xiaobei, INT8 ONNX, Mandarin (24 kHz)",
        ),
    }
