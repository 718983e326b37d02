"""Checks of the say contract's answers, shared by the in-process and the end-to-end tests."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import soundfile


class HasPayload(Protocol):
    """A published message as either side sees it (sent by the bridge, or received)."""

    @property
    def payload(self) -> bytes: ...


@dataclass(frozen=True)
class Wav:
    sample_rate: int
    channels: int
    samples: npt.NDArray[np.float32]

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


def parse_wav(data: bytes) -> Wav:
    info = soundfile.info(io.BytesIO(data))
    assert info.format == "WAV", f"not a WAV file: {info.format}"
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return Wav(sample_rate=int(rate), channels=samples.shape[1], samples=samples[:, 0])


def assert_ok(
    response: dict[str, Any], *, target: str, voice: str, engine: str, audio: HasPayload
) -> None:
    assert response["status"] == "ok", response
    assert "error" not in response, response
    data = response["data"]
    assert data["target"] == target, response
    assert data["voice"] == voice, response
    assert data["engine"] == engine, response
    assert data["tier"] in ("quality", "fast"), response
    assert isinstance(data["cached"], bool), response
    assert isinstance(data["latency_ms"], int | float) and data["latency_ms"] >= 0, response
    assert data["bytes"] == len(audio.payload), response
    wav = parse_wav(audio.payload)
    assert isinstance(data["duration_ms"], int | float), response
    assert abs(data["duration_ms"] - wav.duration_s * 1000) <= max(50, wav.duration_s * 20), (
        f"duration_ms {data['duration_ms']} but the WAV lasts {wav.duration_s * 1000:.0f} ms"
    )


def assert_error(response: dict[str, Any], code: str) -> None:
    assert response["status"] == "error", response
    assert response.get("code") == code, f"expected code {code!r}, got {response}"
    assert isinstance(response.get("error"), str) and response["error"].strip(), response
    assert "id" in response, response
    assert response["id"] not in (None, ""), f"error response without an id: {response}"
