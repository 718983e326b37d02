"""One validated settings object: YAML file, then TTS_BRIDGE_* environment, then command-line flags.

Environment overrides use a double underscore between levels, e.g. ``TTS_BRIDGE_MQTT__HOST=broker``
or ``TTS_BRIDGE_LIMITS__MAX_TEXT_CHARS=500``. Each value is read as the type of its setting: text
settings take the text as it is (``TTS_BRIDGE_MQTT__PASSWORD=123456``, ``...CLIENT_ID=007``),
numbers and booleans (true/false, 1/0, yes/no, on/off) are converted, lists are JSON
(``["a", "b"]``) or comma-separated (``a,b``), and a whole section or voice is a JSON object. An
empty value means "not set" for a setting that may be empty. Variables that name no setting
(``TTS_BRIDGE_BIN``) are not the bridge's and are ignored; an unknown key below a known section
(``TTS_BRIDGE_MQTT__PASWORD``) is an error naming the variable.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
import socket
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tts_bridge.engines import catalog
from tts_bridge.engines.base import Precision
from tts_bridge.formats import AudioFormat, AudioFormatField

_LOGGER = logging.getLogger(__name__)

ENV_PREFIX = "TTS_BRIDGE_"
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
AUTO_FAST_VOICE = "auto"
"""A ChatTTS voice's fast_voice that the engine pool chooses (see VoiceSettings.fast_voice)."""
FALLBACK_FAST_VOICE = "heart"
"""The fast voice "auto" stands for when a ChatTTS voice has no INT8 export: the bundled
hibari voice (English only; Chinese text stays on ChatTTS)."""
_NAME_RE = re.compile(NAME_PATTERN)
AUTO_CLIENT_ID = "auto"
"""mqtt.client_id that stands for one derived from the host and the state folder."""


def _xdg(kind: str, fallback: str) -> Path:
    base = os.environ.get(kind)
    return Path(base) if base else Path.home() / fallback


def default_cache_dir() -> Path:
    return _xdg("XDG_CACHE_HOME", ".cache") / "tts_bridge"


def default_data_dir() -> Path:
    return _xdg("XDG_DATA_HOME", ".local/share") / "tts_bridge"


def default_client_id(state_dir: Path | None = None) -> str:
    """``tts_bridge-<hash>`` of the host name and the state folder (where the journal lives):
    distinct for two installations on one broker, the same at every restart of one."""
    folder = (state_dir or default_data_dir()).expanduser().absolute()
    digest = hashlib.sha256(f"{socket.gethostname()}\0{folder}".encode()).hexdigest()
    return f"tts_bridge-{digest[:12]}"


ExpandedPath = Annotated[Path, AfterValidator(Path.expanduser)]
"""A path setting: ``~`` is the user's home folder wherever a path is read (YAML, environment,
flags, the voices file)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class TlsSettings(_Section):
    enabled: bool = False
    """Connect with TLS (usually port 8883)."""
    ca_file: ExpandedPath | None = None
    """CA certificate(s) that signed the broker's certificate; empty = the system's CAs."""
    cert_file: ExpandedPath | None = None
    """Client certificate, for brokers that require one."""
    key_file: ExpandedPath | None = None
    """Private key of the client certificate."""
    insecure: bool = False
    """Skip the host name check (only for testing; never in production)."""

    @model_validator(mode="after")
    def _check_files(self) -> TlsSettings:
        # ssl reports a missing file as a bare "[Errno 2] No such file or directory" at the
        # first connect, without its name; here it is named before anything starts.
        if not self.enabled:
            return self
        for key in ("ca_file", "cert_file", "key_file"):
            path: Path | None = getattr(self, key)
            if path is not None and not path.is_file():
                raise ValueError(
                    f"{key}: no such file {path} (give the file's full path, or leave "
                    f"{key} empty{' to use the system CAs' if key == 'ca_file' else ''})"
                )
        return self


class MqttSettings(_Section):
    host: str = "127.0.0.1"
    """Broker host name or address."""
    port: int = Field(1883, ge=1, le=65535)
    """Broker port."""
    base_topic: str = "tts_bridge"
    """Prefix of every topic the bridge uses."""
    client_id: str = Field(AUTO_CLIENT_ID, min_length=1, max_length=128)
    """MQTT client id; stable so the broker keeps the bridge's session while it is away, and
    distinct per installation (two bridges with one id take the session from each other).
    "auto" = tts_bridge-<hash of the host name and the journal's folder>."""
    username: str | None = None
    """User name for the broker (optional)."""
    password: str | None = Field(None, repr=False)
    """Password for the broker (optional, never logged)."""
    password_file: ExpandedPath | None = None
    """File whose first line is the password (keeps it out of the config file)."""
    tls: TlsSettings = Field(default_factory=TlsSettings)
    session_expiry_s: int = Field(86400, ge=0)
    """How long the broker keeps the bridge's session (and queues requests) while it is away."""
    share_group: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Several bridges in one group share the say topics (MQTT 5 shared subscription)."""
    max_message_bytes: int | None = Field(None, ge=1024)
    """The broker's message size limit if it has one (mosquitto message_size_limit); audio
    bigger than this (or the Maximum Packet Size the broker announces) is sent per sentence."""
    max_queued_messages: int = Field(0, ge=0)
    """Outgoing messages paho may hold beyond its in-flight window (0 = no limit). A limit drops
    answers under a burst (measured: 1000 requests lost ~200 answers with 1000), and the
    bridge already bounds what it produces by limits.max_queue, so no limit is the default."""
    keepalive_s: int = Field(60, ge=5, le=3600)
    """MQTT keepalive interval."""
    audio_expiry_s: int = Field(300, ge=0)
    """Message expiry on audio messages, so a stale announcement does not play later (0 = none)."""
    reconnect_max_delay_s: int = Field(30, ge=1, le=600)
    """Upper bound of the reconnect backoff."""
    response_topics: list[str] = Field(default_factory=list)
    """Topic filters an MQTT 5 Response Topic must match (e.g. ["clients/#"]); empty = any
    topic outside the bridge's own, Home Assistant discovery and Hermes topics."""

    @field_validator("response_topics")
    @classmethod
    def _check_response_topics(cls, filters: list[str]) -> list[str]:
        for topic_filter in filters:
            levels = topic_filter.split("/")
            if (
                not topic_filter
                or "\x00" in topic_filter
                or "#" in levels[:-1]
                or any(("+" in lv or "#" in lv) and len(lv) > 1 for lv in levels)
            ):
                raise ValueError(f"{topic_filter!r} is not an MQTT topic filter")
        return filters

    @field_validator("client_id")
    @classmethod
    def _resolve_client_id(cls, value: str) -> str:
        # Settings resolves it again for the configured journal folder.
        return default_client_id() if value == AUTO_CLIENT_ID else value

    @field_validator("base_topic")
    @classmethod
    def _check_base_topic(cls, value: str) -> str:
        value = value.strip("/")
        if not value or any(c in value for c in "+#\x00") or value.startswith("$"):
            raise ValueError("must be a non-empty topic without wildcards, NUL or a leading '$'")
        return value


class CacheSettings(_Section):
    dir: ExpandedPath = Field(default_factory=default_cache_dir)
    """Folder of the sentence cache (created 0700)."""
    max_mb: int = Field(512, ge=1)
    """Upper bound of the cache on disk; the least recently used sentences go first."""
    enabled: bool = True
    """Turn the cache off entirely (every sentence is synthesized)."""


class ModelsSettings(_Section):
    dir: ExpandedPath = Field(default_factory=lambda: default_data_dir() / "models")
    """Folder for model files that do not come with a Python package."""
    idle_unload_s: int = Field(600, ge=0)
    """Unload a model unused for this long, so its memory comes back (0 = never)."""
    memory_budget_mb: int | None = Field(None, ge=64)
    """Memory the loaded models may use; empty = the hardware plan (60% of RAM). The least
    recently used model is unloaded to make room; a model that cannot fit is refused."""


class JournalSettings(_Section):
    path: ExpandedPath = Field(default_factory=lambda: default_data_dir() / "journal.sqlite3")
    """Durable journal of accepted requests (created 0600 in a 0700 folder)."""
    keep_done_s: int = Field(86400, ge=60)
    """How long answered requests are remembered to answer redelivered duplicates."""


class LimitsSettings(_Section):
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


class SynthesisSettings(_Section):
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


class VoiceSettings(_Section):
    engine: str
    """Which engine speaks this voice: piper, hibari, chattts, chattts-onnx (an export made by
    `models export`), or any other registered kind (see engines.catalog)."""
    model: ExpandedPath | None = None
    """Model file (Piper, hibari) or checkpoint folder (ChatTTS, in ChatTTS's asset layout);
    relative paths are under models.dir; empty = the model bundled with the engine's package."""
    speaker: str | None = None
    """Engine voice or speaker name (hibari: only the bundled 'heart' exists offline)."""
    spk_emb: str | None = Field(None, repr=False)
    """ChatTTS speaker embedding (from `tts-bridge voices new`); empty = the checkpoint's
    default speaker."""
    spk_emb_sha256: str | None = None
    """SHA-256 of spk_emb: a one-character change would silently be another voice."""
    precision: Precision = "int8"
    """chattts-onnx only: which graphs of the export to run (after `models quantize`: int8;
    int4 after `models quantize --int4`, smaller but less faithful: for boards short of memory;
    int8-all after `models quantize --int8-all`: the decoder and Vocos in INT8 too, about
    110 MB less memory at some cost in the waveform)."""
    backend: Literal["auto", "torch", "onnx"] = "auto"
    """chattts only: auto = the FP32 graphs of an ONNX export of this checkpoint when one exists
    (`models export`), else torch; onnx = require the export; torch = always torch."""
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

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, kind: str) -> str:
        try:
            catalog.spec(kind)
        except catalog.UnknownEngineError as exc:
            raise ValueError(str(exc)) from None
        return kind

    @model_validator(mode="after")
    def _check_engine_keys(self) -> VoiceSettings:
        """Keys only some engines take (backend, spk_emb) are refused for the others; then the
        engine checks the voice its own way (ChatTTS: the speaker embedding)."""
        spec = catalog.spec(self.engine)
        for key, value, unset in (
            ("backend", self.backend, "auto"),
            ("spk_emb", self.spk_emb, None),
        ):
            if value != unset and key not in spec.voice_keys:
                takers = [k for k in catalog.kinds() if key in catalog.spec(k).voice_keys]
                shown = f" {value!r}" if key == "backend" else ""
                raise ValueError(f"{key}{shown} is only for engine {' or '.join(takers)}")
        if spec.check_voice is not None:
            spec.check_voice(self)
        return self


def _default_voices() -> dict[str, VoiceSettings]:
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


class SchedulerSettings(_Section):
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


class HomeAssistantSettings(_Section):
    discovery: bool = True
    """Publish MQTT device discovery so Home Assistant shows the bridge by itself."""
    prefix: str = Field("homeassistant", pattern=r"^[A-Za-z0-9_/-]{1,64}$")
    """Home Assistant's discovery prefix."""
    node_id: str = Field("tts_bridge", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Device id in Home Assistant; distinct per bridge."""
    targets: list[str] = Field(default_factory=lambda: ["default"])
    """Speakers (say targets) that get a notify entity each."""

    @field_validator("targets")
    @classmethod
    def _check_targets(cls, targets: list[str]) -> list[str]:
        for target in targets:
            if not _NAME_RE.match(target):
                raise ValueError(f"target {target!r} must match {NAME_PATTERN}")
        if len(set(targets)) != len(targets):
            raise ValueError("targets must be distinct")
        return targets


class HermesSettings(_Section):
    enabled: bool = False
    """Answer Rhasspy Hermes hermes/tts/say requests."""
    finish_margin_s: float = Field(2.0, ge=0.0, le=60.0)
    """sayFinished goes out after playFinished, or after the audio's length plus this margin."""
    voice: str | None = None
    """Voice for Hermes requests; empty = the default voice."""


class HttpSettings(_Section):
    enabled: bool = True
    """Serve each answer's audio over HTTP at an unguessable URL (speakers that play URLs)."""
    host: str = "0.0.0.0"
    """Address to listen on; speakers on the LAN must reach it (127.0.0.1 = this machine only)."""
    port: int = Field(10201, ge=0, le=65535)
    """Port to listen on (0 = any free port, for tests)."""
    base_url: str | None = None
    """URL prefix speakers use to reach this server, e.g. http://192.168.1.20:10201 (behind a
    proxy or NAT); empty = http://<host, or this machine's LAN address>:<port>."""
    ttl_s: int = Field(3600, ge=10, le=30 * 86400)
    """How long an audio URL keeps working after its audio was last published."""
    max_mb: int = Field(64, ge=1)
    """Upper bound of the encoded audio kept on disk; what expires soonest goes first."""
    dir: ExpandedPath | None = None
    """Folder of the encoded audio files (0700); empty = 'http' inside cache.dir."""
    secret_file: ExpandedPath | None = None
    """Key that derives the URLs (made at first start, 0600), so a cached sentence keeps its URL
    across restarts; empty = 'http.key' in the folder of journal.path (the state folder)."""
    format: AudioFormatField = Field(default_factory=lambda: AudioFormat("mp3", 44100))
    """Format of the audio behind an answer's URL unless the target or request asks otherwise
    (MP3 at 44.1 kHz plays on Sonos, Cast, ESPHome and squeezelite)."""
    # The speech API and metrics on the same server.
    api_enabled: bool = True
    """Serve the OpenAI-compatible speech API (/v1/audio/speech, /v1/models, /v1/audio/voices)
    and /api/speak on this server."""
    api_keys: list[str] = Field(default_factory=list, repr=False)
    """Keys a client must send (Authorization: Bearer KEY) to use the speech API; empty (with no
    api_keys_file) = open to anyone who reaches the port, like the Wyoming server."""
    api_keys_file: ExpandedPath | None = None
    """A file of further keys, one per line ('#' starts a comment); read at start."""
    metrics: bool = True
    """Serve Prometheus metrics at /metrics (no request text in them)."""
    # Doors that hold: connections are bounded in time and number.
    keepalive_s: float = Field(15.0, ge=1.0, le=3600.0)
    """An idle connection (between requests, or one whose request headers are still incomplete)
    is closed after this long."""
    max_connections: int = Field(256, ge=1, le=100_000)
    """Connections open at once; past it a new one is answered 503 and closed."""
    max_connections_per_peer: int = Field(32, ge=1, le=100_000)
    """Connections open at once from one client address; past it: 503."""

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().rstrip("/")
        if not re.match(r"^https?://[^/?#\s]+(/[^?#\s]*)?$", value):
            raise ValueError("must be an http:// or https:// URL without query or fragment")
        return value


class WyomingSettings(_Section):
    enabled: bool = True
    """Serve Home Assistant's Wyoming integration (TTS) on host:port."""
    host: str = "0.0.0.0"
    """Address the Wyoming server listens on (0.0.0.0 = every interface)."""
    port: int = Field(10200, ge=1, le=65535)
    """TCP port of the Wyoming server (10200 is the one Home Assistant's TTS add-ons use)."""
    name: str = Field("tts_bridge", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """TTS program name: Home Assistant's entry title and entity id (tts.<name>)."""
    zeroconf: bool = True
    """Announce the server on the LAN (_wyoming._tcp) so Home Assistant discovers it."""
    zeroconf_name: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,63}$")
    """Zeroconf instance name, distinct per bridge on a LAN; empty = the program name."""
    # Doors that hold: connections are bounded in number, and in time when a client stops reading.
    max_connections: int = Field(64, ge=1, le=100_000)
    """Connections open at once; past it a new one gets an error event (code busy) and is closed."""
    max_connections_per_peer: int = Field(8, ge=1, le=100_000)
    """Connections open at once from one client address (Home Assistant opens one per request)."""
    write_timeout_s: float = Field(30.0, ge=1.0, le=3600.0)
    """A client that does not read its audio for this long is dropped and its synthesis stopped."""


class ChimesSettings(_Section):
    dir: ExpandedPath = Field(default_factory=lambda: default_data_dir() / "chimes")
    """Your own chimes: WAV, FLAC, OGG or MP3 files here are chimes named after the file
    (doorbell.mp3 is "doorbell"); the built-in ding, dingdong, chime and alert need none."""
    max_seconds: float = Field(5.0, gt=0.0, le=30.0)
    """A longer chime file is cut (faded out) to this length."""
    gap_ms: int = Field(300, ge=0, le=5000)
    """Silence between a chime and the speech."""


class PresetSettings(_Section):
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


class LexiconWord(_Section):
    """What a word is said as (lexicon.<word>); a plain string stands for `say`."""

    say: str = Field(min_length=1, max_length=200)
    """A respelling every engine reads ("win" for Nguyen)."""
    phonemes: str | None = Field(None, min_length=1, max_length=200)
    """Phonemes for engines that take them (Piper: espeak-ng IPA); others say `say`."""


class TargetSettings(_Section):
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


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level; --debug overrides it."""


class Settings(_Section):
    """Everything the bridge reads at start-up, validated once and passed down."""

    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    models: ModelsSettings = Field(default_factory=ModelsSettings)
    journal: JournalSettings = Field(default_factory=JournalSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    synthesis: SynthesisSettings = Field(default_factory=SynthesisSettings)
    voices: dict[str, VoiceSettings] = Field(default_factory=_default_voices)
    default_voice: str = "joe"
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    homeassistant: HomeAssistantSettings = Field(default_factory=HomeAssistantSettings)
    hermes: HermesSettings = Field(default_factory=HermesSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    wyoming: WyomingSettings = Field(default_factory=WyomingSettings)
    targets: dict[str, TargetSettings] = Field(default_factory=dict)
    """Per say target (speaker): the audio format and what its audio topic carries; a target
    not listed gets WAV bytes on its topic."""
    chimes: ChimesSettings = Field(default_factory=ChimesSettings)
    presets: dict[str, PresetSettings] = Field(default_factory=dict)
    """Voices with a chime (e.g. joe_chime: {voice: joe, chime: dingdong}), listed with the
    voices to Wyoming clients and accepted wherever a voice name is."""
    lexicon: dict[str, LexiconWord] = Field(default_factory=dict)
    """Pronunciations shared by every voice: word or phrase -> what to say."""
    lexicon_file: ExpandedPath | None = None
    """A YAML or JSON file of more entries in the same form (`lexicon` wins over it), read at
    start-up."""
    phrases: list[str] = Field(default_factory=list)
    """Sentences to pre-render in quality at idle (for the default voice)."""
    phrases_file: ExpandedPath | None = None
    """A text file of phrases, one per line ('#' starts a comment)."""
    voices_file: ExpandedPath = Field(default_factory=lambda: default_data_dir() / "voices.yaml")
    """Voices made with `tts-bridge voices new`, merged into `voices` when the file exists."""
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @field_validator("voices")
    @classmethod
    def _check_voice_names(cls, voices: dict[str, VoiceSettings]) -> dict[str, VoiceSettings]:
        for name in voices:
            if not _NAME_RE.match(name):
                raise ValueError(f"voice name {name!r} must match {NAME_PATTERN}")
        if not voices:
            raise ValueError("at least one voice is needed")
        return voices

    @field_validator("targets")
    @classmethod
    def _check_target_names(cls, targets: dict[str, TargetSettings]) -> dict[str, TargetSettings]:
        for name in targets:
            if not _NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a valid target name (they match {NAME_PATTERN})")
        return targets

    @model_validator(mode="after")
    def _check_url_targets(self) -> Settings:
        if not self.http.enabled:
            for name, target in self.targets.items():
                if target.payload == "url":
                    raise ValueError(
                        f"targets.{name}.payload: url needs the HTTP audio server (http.enabled)"
                    )
        return self

    @model_validator(mode="after")
    def _client_id_for_this_journal(self) -> Settings:
        if self.mqtt.client_id == default_client_id():  # "auto", resolved without the journal
            self.mqtt.client_id = default_client_id(self.journal.path.parent)
        return self

    @model_validator(mode="after")
    def _read_password_file(self) -> Settings:
        path = self.mqtt.password_file
        if path is not None:
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ValueError(f"mqtt.password_file: cannot read {path}: {exc.strerror}") from exc
            except UnicodeDecodeError as exc:
                raise ValueError(f"mqtt.password_file: {path} is {_not_utf8(exc)}") from None
            self.mqtt.password = lines[0] if lines else ""
        return self

    @model_validator(mode="after")
    def _check_fast_voices(self) -> Settings:
        for name, voice in self.voices.items():
            if voice.fast_voice is None:
                continue
            if voice.fast_voice == AUTO_FAST_VOICE and catalog.spec(voice.engine).auto_fast_voice:
                continue  # resolved by the engine pool (see VoiceSettings.fast_voice)
            if voice.fast_voice not in self.voices:
                raise ValueError(f"voices.{name}.fast_voice: {voice.fast_voice!r} is not a voice")
            if voice.fast_voice == name:
                raise ValueError(f"voices.{name}.fast_voice: a voice cannot be its own fast tier")
        return self

    @field_validator("lexicon", mode="before")
    @classmethod
    def _plain_respellings(cls, value: object) -> object:
        if isinstance(value, dict):
            return {k: {"say": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check_lexicon_words(self) -> Settings:
        for word in self.lexicon:
            if not any(c.isalnum() for c in word) or len(word) > 64:
                raise ValueError(
                    f"lexicon: entry {word[:70]!r} must be 1-64 characters with a letter"
                )
        return self

    @model_validator(mode="after")
    def _check_presets(self) -> Settings:
        for name, preset in self.presets.items():
            if not _NAME_RE.match(name):
                raise ValueError(f"preset name {name!r} must match {NAME_PATTERN}")
            if name in self.voices:
                raise ValueError(f"presets.{name}: a voice has this name already")
            if preset.voice not in self.voices:
                raise ValueError(f"presets.{name}.voice: {preset.voice!r} is not a voice")
        return self

    @model_validator(mode="after")
    def _check_hermes_voice(self) -> Settings:
        if self.hermes.voice is not None and self.hermes.voice not in self.voices:
            raise ValueError(f"hermes.voice: {self.hermes.voice!r} is not a voice")
        return self

    @model_validator(mode="after")
    def _check_default_voice(self) -> Settings:
        if self.default_voice not in self.voices:
            raise ValueError(
                f"default_voice {self.default_voice!r} is not one of the voices: "
                + ", ".join(sorted(self.voices))
            )
        return self


class ConfigError(Exception):
    """The configuration cannot be used; the message names the source and the key."""


# -- the environment ------------------------------------------------------------------------
#
# Read by hand rather than with pydantic-settings: the settings are validated once, from the
# YAML file, the environment, the voices file and the flags merged in that order, so the
# environment is one more dictionary here, not the root model (BaseSettings would own the
# precedence and every section class). Each value is converted by the type of the field it
# names, and every variable's key path is remembered so that an error names the variable.


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The annotation without ``None``, and whether ``None`` is allowed."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = get_args(annotation)
        rest = tuple(a for a in args if a is not type(None))
        inner = rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007 (a runtime union)
        return inner, len(rest) < len(args)
    return annotation, False


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _child(annotation: Any, key: str) -> Any | None:
    """The annotation of ``key`` inside a section (or a mapping such as voices); None if unknown."""
    inner, _ = _unwrap(annotation)
    if _is_model(inner):
        field = inner.model_fields.get(key)
        return None if field is None else field.annotation
    if get_origin(inner) is dict:
        return get_args(inner)[1]
    return None


def _known_keys(annotation: Any) -> list[str]:
    inner, _ = _unwrap(annotation)
    return list(inner.model_fields) if _is_model(inner) else []


def _env_name(path: Sequence[str]) -> str:
    return ENV_PREFIX + "__".join(path).upper()


def _env_value(name: str, raw: str, annotation: Any) -> Any:
    """A variable's text as the field's type wants it: strings stay strings."""
    inner, nullable = _unwrap(annotation)
    if raw == "" and nullable:
        return None
    container = get_origin(inner)
    if _is_model(inner) or container is dict:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f'{name}: expected a JSON object such as {{"key": "value"}} ({exc.msg} at '
                f"column {exc.colno})"
            ) from None
        if not isinstance(value, dict):
            raise ConfigError(f'{name}: expected a JSON object such as {{"key": "value"}}')
        return value
    if container in (list, tuple, set):
        if not raw.lstrip().startswith("["):
            return [item.strip() for item in raw.split(",") if item.strip()]
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f'{name}: expected a JSON list such as ["a", "b"] or a comma-separated a,b '
                f"({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(value, list):
            raise ConfigError(f'{name}: expected a JSON list such as ["a", "b"] or a,b')
        return value
    if get_origin(inner) in (Union, types.UnionType) and not {str, Path} & set(get_args(inner)):
        # A union of numbers and booleans (voice options): "7" is an int, not 7.0.
        for kind in (int, float):
            try:
                return kind(raw)
            except ValueError:
                pass
    return raw  # pydantic turns "300" into 300 for an int field, "true" into True for a bool


def _env_target(name: str, path: list[str]) -> Any | None:
    """The annotation of the setting a variable names; None if it names none (not ours)."""
    annotation: Any = Settings
    for depth, part in enumerate(path):
        child = _child(annotation, part)
        if child is not None:
            annotation = child
            continue
        if depth == 0:
            close = difflib.get_close_matches("__".join(path), list(Settings.model_fields), 1, 0.8)
            if close:
                _LOGGER.warning(
                    "Ignoring %s: not a setting (did you mean %s?)", name, _env_name(close)
                )
            else:
                _LOGGER.debug("Ignoring %s: not a setting", name)
            return None
        where = ".".join(path[:depth])
        known = _known_keys(annotation)
        if not known:
            raise ConfigError(f"{name}: {where} has no keys below it")
        close = difflib.get_close_matches(part, known, n=1)
        hint = f"did you mean {_env_name([*path[:depth], close[0]])}?" if close else ""
        raise ConfigError(
            f"{name}: {where} has no key {part!r} ({hint or 'keys: ' + ', '.join(known)})"
        )
    return annotation


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """The TTS_BRIDGE_* variables as a settings tree, and each variable's key path.

    A variable whose first part names no setting is not the bridge's (TTS_BRIDGE_BIN for a
    wrapper script): it is ignored, with a warning when it is close to a setting's name. Below a
    known section an unknown key can only be a misspelling, and is an error like in the file.
    """
    tree: dict[str, Any] = {}
    sources: dict[tuple[str, ...], str] = {}
    # Sorted: TTS_BRIDGE_MQTT (a JSON object) comes before TTS_BRIDGE_MQTT__PORT, which refines it.
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG":
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            raise ConfigError(f"{name}: empty key (levels are separated by one double '__')")
        annotation = _env_target(name, path)
        if annotation is None:
            continue
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: conflicts with a TTS_BRIDGE_ variable above it")
        node[path[-1]] = _env_value(name, environ[name], annotation)
        sources[tuple(path)] = name
    return tree, sources


def merge_trees(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top: sections merge key by key, other values replace."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge_trees(out[key], value)
        else:
            out[key] = value
    return out


def _flatten(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            paths += _flatten(value, (*prefix, str(key)))
        else:
            paths.append((*prefix, str(key)))
    return paths


_LEADING_KEY = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)[ :]")


class _Sources:
    """Which source set which key, so that an error can say where to fix it."""

    def __init__(
        self,
        path: Path | None,
        env: dict[tuple[str, ...], str],
        flags: Mapping[str, Any] | None,
    ) -> None:
        self.path = path
        self.env = env
        self.flags = set(_flatten(flags or {}))

    def describe(self, loc: tuple[str, ...], key: str, message: str) -> str:
        names = [n for p, n in self.env.items() if _covers(p, loc)]
        if any(_covers(p, loc) for p in self.flags):
            return f"command line {key}: {message}"
        if names:
            return f"{', '.join(sorted(names))} ({key}): {message}"
        if self.path is not None:
            return f"{self.path}: {key}: {message}"
        return f"{key}: {message}"


def _covers(path: tuple[str, ...], loc: tuple[str, ...]) -> bool:
    """The key a source set is (in, or around) the key an error is about."""
    shorter = min(len(path), len(loc))
    return shorter > 0 and path[:shorter] == loc[:shorter]


def _describe(error: ValidationError, sources: _Sources) -> str:
    lines = []
    for item in error.errors():
        loc = tuple(str(p) for p in item["loc"])
        if item["type"] == "value_error" and "error" in item.get("ctx", {}):
            message = str(item["ctx"]["error"])  # our own words, without "Value error, "
        elif item["type"] == "extra_forbidden":
            message = "unknown key"
            parent: Any = Settings
            for part in loc[:-1]:
                parent = _child(parent, part) if parent is not None else None
            close = difflib.get_close_matches(loc[-1], _known_keys(parent), n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
        elif item["type"] == "missing":
            message = "is required"
        else:
            message = item["msg"]
        # A check across keys (a model validator) reports the section; its message starts with
        # the key it is about, which is the one to name (and whose source to blame).
        match = _LEADING_KEY.match(message)
        if match:
            section: Any = Settings
            for part in loc:
                section = _child(section, part) if section is not None else None
            lead = tuple(match.group(1).split("."))
            if not loc or (section is not None and _child(section, lead[0]) is not None):
                loc = (*loc, *lead)
                message = message[len(match.group(1)) :].lstrip(": ")
        key = ".".join(loc) or "settings"
        lines.append(sources.describe(loc, key, message))
    return "; ".join(lines)


def _with_voices_file(data: dict[str, Any]) -> dict[str, Any]:
    """Add the voices from the voices file (made by `voices new`); the config file wins."""
    raw = data.get("voices_file")
    path = Path(raw).expanduser() if raw else default_data_dir() / "voices.yaml"
    if not path.is_file():
        return data
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read voices file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"voices file {path}: {_not_utf8(exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"voices file {path} is not valid YAML: {exc}") from exc
    extra = loaded.get("voices") if isinstance(loaded, dict) else None
    if not isinstance(extra, dict):
        raise ConfigError(f"voices file {path}: expected a 'voices:' mapping")
    voices = data.get("voices")
    if voices is None:
        voices = {k: v.model_dump(exclude_defaults=True) for k, v in _default_voices().items()}
    return {**data, "voices": {**extra, **voices}}


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); save it as UTF-8"


def load_settings(
    path: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    base: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the settings: defaults < ``base`` < YAML file < TTS_BRIDGE_* environment < flag
    overrides. ``base`` is a settings tree that a launcher supplies (the add-on's options)."""
    data: dict[str, Any] = {}
    environ = os.environ if environ is None else environ
    if path is None and environ.get(ENV_PREFIX + "CONFIG"):
        path = Path(environ[ENV_PREFIX + "CONFIG"])
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path}: {_not_utf8(exc)}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: the top level must be a mapping of keys")
        data = loaded
    if base:
        data = merge_trees(base, data)
    env_tree, env_sources = _env_overrides(environ)
    overrides = overrides or {}
    if "voices" not in data and "voices" in env_tree:
        # TTS_BRIDGE_VOICES__JOE__SPEED=1.2 changes joe; it does not replace the default voices.
        data["voices"] = {
            name: voice.model_dump(exclude_defaults=True)
            for name, voice in _default_voices().items()
        }
    data = merge_trees(data, env_tree)
    data = merge_trees(data, overrides)
    data = _with_voices_file(data)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        sources = _Sources(path, env_sources, overrides)
        raise ConfigError(f"invalid configuration: {_describe(exc, sources)}") from None
    _LOGGER.debug("Settings loaded from %s", path or "defaults")
    return settings
