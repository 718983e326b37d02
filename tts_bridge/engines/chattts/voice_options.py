"""The voice keys only ChatTTS takes, beside the ones every voice has (voices.<name>)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from tts_bridge.engines.settings import VoiceSettings


class ChatTTSOnnxVoiceOptions(BaseModel):
    """An export's voice (chattts-onnx): the speaker."""

    model_config = ConfigDict(extra="forbid")

    spk_emb: str | None = Field(None, repr=False)
    """ChatTTS speaker embedding (from `tts-bridge voices new`); empty = the checkpoint's
    default speaker."""
    spk_emb_sha256: str | None = None
    """SHA-256 of spk_emb: a one-character change would silently be another voice."""

    @classmethod
    def of(cls, voice: VoiceSettings) -> Self:
        """The options of this schema ``voice`` gives (the catalog refused any other key when
        the voice was configured)."""
        given = voice.engine_options()
        return cls.model_validate({k: v for k, v in given.items() if k in cls.model_fields})


class ChatTTSVoiceOptions(ChatTTSOnnxVoiceOptions):
    """A checkpoint's voice (chattts): the speaker and the backend it runs on."""

    backend: Literal["auto", "torch", "onnx"] = "auto"
    """auto = the FP32 graphs of an ONNX export of this checkpoint when one exists
    (`models export`), else torch; onnx = require the export; torch = always torch."""
