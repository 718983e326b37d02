"""The speech core's settings: the sentence cache, limits, synthesis and its scheduler, chimes,
presets and the say targets' speakers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tts_bridge.audio.formats import AudioFormat
from tts_bridge.players.settings import MAX_LEAD_MS, MediaPlayers, VolumeRestore
from tts_bridge.settings_base import ExpandedPath, Section, default_cache_dir, default_data_dir


class CacheSettings(Section):
    dir: ExpandedPath = Field(default_factory=default_cache_dir)
    """Folder of the sentence cache (created 0700)."""
    max_mb: int = Field(512, ge=1)
    """Upper bound of the cache on disk; the least recently used sentences go first."""
    enabled: bool = True
    """Turn the cache off entirely (every sentence is synthesized)."""


class LimitsSettings(Section):
    max_text_chars: int = Field(1000, ge=1, le=100_000)
    """Longest text accepted in one request (characters after cleaning)."""
    max_payload_bytes: int = Field(16_384, ge=64, le=10_000_000)
    """Largest request payload accepted."""
    max_json_depth: int = Field(8, ge=1, le=64)
    """Deepest JSON nesting accepted in a request."""
    max_queue: int = Field(64, ge=1, le=100_000)
    """Requests waiting for synthesis before new ones are refused with 'busy'."""
    max_audio_s: float = Field(300.0, ge=1.0, le=3600.0)
    """Longest audio one request may make (estimated from its text and speed): a short text
    at a very low speed costs as much memory and time as a long one."""
    # Doors that hold: raw input and the live queue's shares.
    max_raw_text_bytes: int = Field(65_536, ge=64, le=10_000_000)
    """Largest raw text (UTF-8 bytes, before cleaning) one request may send on any door, a
    Wyoming stream included: whitespace and invisible characters cost memory and time too."""
    door_share: float = Field(0.5, gt=0.0, le=1.0)
    """Share of limits.max_queue one door (mqtt, hermes, wyoming, http) may fill; the rest stays
    free for the others (alerts and cache hits are not counted against it)."""
    peer_share: float = Field(0.25, gt=0.0, le=1.0)
    """Share of limits.max_queue one client address (Wyoming, HTTP) may fill."""


class SynthesisSettings(Section):
    workers: int | None = Field(None, ge=1, le=16)
    """Synthesis jobs at a time; empty = the hardware plan (one at a time on <= 4 cores)."""
    onnx_threads: int | None = Field(None, ge=1, le=64)
    """onnxruntime intra-op threads per engine; empty = the hardware plan."""
    onnx_inter_op_threads: int | None = Field(None, ge=1, le=64)
    """onnxruntime inter-op threads; empty = the hardware plan (1). Only onnxruntime's parallel
    execution mode uses them, and the bridge runs every session sequentially."""
    onnx_arena: bool = True
    """onnxruntime's CPU memory arena: faster allocation; off gives memory back after each run."""
    onnx_spinning: Literal["auto", "on", "off"] = "auto"
    """Idle onnxruntime threads busy-wait for the next operator: faster when the bridge has its
    cores to itself, much slower when they are shared; auto = on unless the hardware plan
    expects to share them (a cgroup CPU quota, or more busy threads than CPUs)."""
    chattts_early_start: bool = False
    """ChatTTS on ONNX, streamed requests: start with approximate audio once a few codes exist,
    instead of waiting for the decoders' lookahead (about 52 codes at full size); what is
    cached is exact. Off by default: on a 2-core CPU the previews' decodes leave short gaps in
    playback where the exact stream plays smoothly after a longer wait (docs/benchmarks.md)."""
    sentence_pause_ms: int = Field(250, ge=0, le=5000)
    """Silence placed between sentences when a message is assembled."""
    stream_clauses: bool = True
    """A door that streams hears a long sentence of an engine without a stream of its own
    (hibari, Kokoro) clause by clause, its first audio several times sooner. Off: each sentence
    whole, the engine given the whole sentence's context (Kokoro's Mandarin is heard better:
    docs/benchmarks.md)."""
    date_order: Literal["dmy", "mdy"] = "dmy"
    """How a numeric date is read when both orders are valid: "1/12" is 1 December (dmy) or
    January 12th (mdy)."""
    loudness_lufs: float | None = Field(-18.0, ge=-40.0, le=-5.0)
    """Integrated loudness (ITU BS.1770, LUFS) every sentence is brought to before it is
    cached, whatever voice or tier speaks it; empty = as each engine makes it. -18 is close to
    what streaming services and broadcasters give speech and leaves headroom for peaks."""
    true_peak_dbtp: float = Field(-1.0, ge=-12.0, le=0.0)
    """Ceiling for the true (inter-sample) peak after loudness normalization, in dBTP: a
    sentence that would pass it is made quieter instead of clipped."""

    @field_validator("onnx_spinning", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        # YAML 1.1 (PyYAML) reads a bare on/off as true/false.
        if isinstance(value, bool):
            return "on" if value else "off"
        return value


class SchedulerSettings(Section):
    latency_budget_ms: int = Field(1500, ge=1, le=600_000)
    """A live request goes to the fast tier when quality would finish it later than this."""
    hysteresis: float = Field(0.7, gt=0.0, le=1.0)
    """Once on the fast tier, return to quality only below budget x hysteresis (no flapping)."""
    idle_enabled: bool = True
    """Pre-render phrases and upgrade fast-tier sentences while the bridge is idle."""
    idle_delay_s: float = Field(5.0, ge=0.0, le=3600.0)
    """Quiet time after the last live request before idle work starts."""
    idle_max_load: float | None = Field(None, ge=0.0)
    """CPU cores other processes may be using for idle work to run; empty = half the cores."""
    idle_batch_size: int = Field(4, ge=1, le=16)
    """Idle sentences of one voice rendered together by an engine that batches (ChatTTS ONNX);
    1 = one at a time."""
    learn_min_count: int = Field(3, ge=1)
    """A sentence asked this often within learn_window_s is pre-rendered in quality."""
    learn_window_s: int = Field(7 * 86400, ge=60)
    """Window for counting repeated sentences."""
    learn_max_sentences: int = Field(2000, ge=10)
    """Sentences remembered for learning (oldest forgotten first; bounds memory)."""
    max_background: int = Field(10_000, ge=1)
    """Background sentences waiting (pre-render, upgrades, learned); more are refused."""
    health_interval_s: int = Field(30, ge=1, le=86400)
    """Seconds between <base>/bridge/health messages."""


class ChimesSettings(Section):
    dir: ExpandedPath = Field(default_factory=lambda: default_data_dir() / "chimes")
    """Your own chimes: WAV, FLAC, OGG or MP3 files here are chimes named after the file
    (doorbell.mp3 is "doorbell"); the built-in ding, dingdong, chime and alert need none."""
    max_seconds: float = Field(5.0, gt=0.0, le=30.0)
    """A longer chime file is cut (faded out) to this length."""
    gap_ms: int = Field(300, ge=0, le=5000)
    """Silence between a chime and the speech."""


class PresetSettings(Section):
    """A voice with its announcement settings under a name of its own (presets.<name>): for
    clients that can only choose a voice, like Home Assistant over Wyoming."""

    voice: str
    """The configured voice that speaks."""
    chime: str | None = None
    """Chime before the speech (a built-in or a file in chimes.dir)."""
    chime_after: str | None = None
    """Chime after the speech."""
    description: str = ""
    """What clients show; empty = the voice and its chimes."""


class TargetSettings(Section):
    """How one say target's speaker takes its audio (targets.<name>)."""

    format: str | None = None
    """Audio on <base>/audio/<target> and behind the answer's URL: wav, flac, mp3 or opus;
    empty = the WAV as rendered on the topic, and http.format behind the URL."""
    sample_rate: int | None = None
    """Rate to resample to (e.g. 44100 or 48000); empty = the voice's own where the codec
    takes it."""
    channels: int = 1
    """1 (mono) or 2 (the same audio on both)."""
    bitrate_kbps: int | None = None
    """MP3 or Opus bitrate; empty = one chosen for speech."""
    payload: Literal["audio", "url"] = "audio"
    """What <base>/audio/<target> carries: the audio itself, or a small JSON message with the
    answer's URL (url, id, duration_ms, format) for devices that fetch it (ESP32 notifiers,
    whose MQTT clients take messages under 64 KiB)."""
    chime: str | None = None
    """Chime before every announcement to this target unless the request names one (or "")."""
    chime_after: str | None = None
    """Chime after every announcement to this target unless the request names one (or "")."""
    gain_db: float = Field(0.0, ge=-30.0, le=20.0)
    """Gain on top of synthesis.loudness_lufs for this target's speaker (a quiet or loud
    speaker), applied when the audio is delivered; the cache keeps the normalized audio."""
    media_players: MediaPlayers = Field(default_factory=list)
    """Home Assistant media players (media_player.kitchen) that play each answer's URL, with
    announce (needs homeassistant.url and a token, or the add-on)."""
    volume: float | None = Field(None, ge=0.0, le=1.0)
    """Volume of the media players during an announcement (0-1); empty = leave it."""
    volume_restore: VolumeRestore = "bridge"
    """Who puts the volume back: bridge (noted, set, restored after the audio) or player (sent
    with the announcement; for players whose announce restores it, like Sonos)."""
    lead_in_ms: int = Field(0, ge=0, le=MAX_LEAD_MS)
    """Silence before the audio this target gets (a speaker that wakes late); not cached."""
    lead_out_ms: int = Field(0, ge=0, le=MAX_LEAD_MS)
    """Silence after the audio this target gets."""

    @model_validator(mode="after")
    def _check_format(self) -> TargetSettings:
        if self.format is None:
            given = [
                key
                for key, value, unset in (
                    ("sample_rate", self.sample_rate, None),
                    ("channels", self.channels, 1),
                    ("bitrate_kbps", self.bitrate_kbps, None),
                )
                if value != unset
            ]
            if given:
                raise ValueError(f"{', '.join(given)}: only with a format (e.g. format: mp3)")
            return self
        fmt = self._parsed()
        self.format = fmt.container  # an alias ("ogg") as its container's name
        return self

    def _parsed(self) -> AudioFormat:
        # AudioFormat checks the combination (MP3 and Opus rates, bitrate ranges).
        spec: dict[str, Any] = {"format": self.format, "channels": self.channels}
        if self.sample_rate is not None:
            spec["sample_rate"] = self.sample_rate
        if self.bitrate_kbps is not None:
            spec["bitrate_kbps"] = self.bitrate_kbps
        return AudioFormat.parse(spec)

    @property
    def audio_format(self) -> AudioFormat | None:
        """The configured format; None when the target keeps the rendered WAV."""
        return None if self.format is None else self._parsed()
