"""The HTTP speech API: OpenAI's ``POST /v1/audio/speech`` and a plain ``POST /api/speak``.

What Open WebUI, Home Assistant's openai_tts integration, n8n and the official ``openai`` package
speak. Every request goes through the same pipeline as the MQTT and Wyoming doors (the sentence
cache, tier routing, the scheduler's queue, idle upgrades); the server's event loop only parses,
waits and writes: the job renders on a synthesis worker (`AsyncDelivery`).

``model`` picks the tier: ``tts-1`` the fast tier, ``tts-1-hd`` the quality tier,
``tts-bridge`` (and ``gpt-4o-mini-tts``) the bridge's own routing. ``voice`` is any configured
voice; OpenAI's own voice names (alloy, nova, ...) that are not configured voices mean the
default voice, so a client that only knows those still gets speech. WAV, raw PCM (24 kHz, as
OpenAI defines it) and Ogg Opus are sent as they are made; MP3 and FLAC are encoded whole. AAC
is refused (``unsupported_format``): no maintained AAC encoder is at hand (libsndfile has none).
Errors are OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with the
bridge's codes.

A POST that a browser marks as coming from another site's page (``Sec-Fetch-Site``, else an
``Origin`` that is not this host) is refused (``cross_origin``) unless it carries a valid key:
without keys any page a household member opens could make the bridge speak (a "simple" POST
needs no permission from the bridge). Programs send neither header and are not affected; keys
are for programs, so a keyed request is believed wherever it comes from.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast, get_args

from aiohttp import web

from tts_bridge.audio.codec import EncodeError, encode
from tts_bridge.audio.formats import AudioFormat, Container
from tts_bridge.audio.stream import STREAM_FORMATS, StreamFormat, stream_encoder
from tts_bridge.config import Settings
from tts_bridge.engines.base import Tier
from tts_bridge.players.announce import TARGET_RE, Announcer
from tts_bridge.speech.async_delivery import AsyncDelivery, Finished
from tts_bridge.speech.pipeline import Pipeline, SpeechError, SpeechJob
from tts_bridge.speech.request import SpeechRequest, with_target_defaults
from tts_bridge.speech.scheduler import PRIORITIES, Priority, as_priority
from tts_bridge.speech.synthesis import AudioPart, Rendering
from tts_bridge.system.faults import LogThrottle
from tts_bridge.textlog import short, size
from tts_bridge.web import origin
from tts_bridge.web.api_keys import ApiKeys
from tts_bridge.web.server import AudioServer
from tts_bridge.wire import JsonTooDeepError, load_json

_LOGGER = logging.getLogger(__name__)

DOOR = "http"
"""This door's name in the pipeline's accounting (logs, metrics)."""
MODELS: dict[str, Tier | None] = {
    "tts-1": "fast",
    "tts-1-hd": "quality",
    "tts-bridge": None,
    "gpt-4o-mini-tts": None,
}
"""OpenAI model names -> the tier they force (None: the bridge routes as for any request)."""
OPENAI_VOICES = frozenset(
    {
        "alloy",
        "ash",
        "ballad",
        "cedar",
        "coral",
        "echo",
        "fable",
        "marin",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
    }
)
"""OpenAI's voices: a client that knows no other asks for these; they mean the default voice."""
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
WHOLE_CONTENT_TYPES = {"mp3": "audio/mpeg", "flac": "audio/flac", "wav": "audio/wav"}
_TIERS = get_args(Tier)
_STATUS = {
    "invalid_api_key": 401,
    "cross_origin": 403,
    "payload_too_large": 413,
    "request_timeout": 408,
    "busy": 503,
    "synthesis_failed": 500,
    "encoding_failed": 500,
    "internal_error": 500,
}
_OPENAI_KEYS = frozenset(
    {
        "model",
        "input",
        "voice",
        "response_format",
        "speed",
        "instructions",
        "stream_format",
        "priority",  # the bridge's own (OpenAI clients send it with extra_body)
    }
)
_SPEAK_KEYS = frozenset(
    {"text", "voice", "lang", "tier", "format", "speed", "cache", "priority", "target"}
)
# A client that sends its body slower than this is holding a connection, not asking.
BODY_TIMEOUT_S = 15.0


class ApiRequestError(Exception):
    """A request this API refuses; `code` is the bridge's error code."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param

    @property
    def status(self) -> int:
        return _STATUS.get(self.code, 400)


def error_body(code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape with the bridge's code."""
    status = _STATUS.get(code, 400)
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(exc: ApiRequestError | SpeechError) -> web.Response:
    param = exc.param if isinstance(exc, ApiRequestError) else None
    status = _STATUS.get(exc.code, 400)
    headers = {"Retry-After": "1"} if exc.code == "busy" else None
    return web.json_response(error_body(exc.code, str(exc), param), status=status, headers=headers)


def _string(fields: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
    value = fields.get(key)
    if value is None:
        if required:
            raise ApiRequestError("invalid_request", f"'{key}' is required", key)
        return None
    if not isinstance(value, str):
        raise ApiRequestError("invalid_request", f"'{key}' must be a string", key)
    return value


def _speed(value: object) -> dict[str, object] | None:
    """The request's speed as its options; 1.0 (what many clients always send) keeps the
    voice's own pace."""
    if value is None or value == "":
        return None
    try:
        speed = float(cast(Any, value))
    except (TypeError, ValueError):
        raise ApiRequestError("invalid_options", "'speed' must be a number", "speed") from None
    if isinstance(value, bool) or not math.isfinite(speed):
        raise ApiRequestError("invalid_options", "'speed' must be a number", "speed")
    return None if speed == 1.0 else {"speed": speed}


def _priority(fields: Mapping[str, Any]) -> Priority:
    priority = as_priority(fields.get("priority", "normal"))
    if priority is not None:
        return priority
    raise ApiRequestError(
        "invalid_priority", f"'priority' must be one of {', '.join(PRIORITIES)}", "priority"
    )


def _format(name: str | None, default: str) -> str:
    container = (name or default).strip().lower()
    if container == "aac":
        raise ApiRequestError(
            "unsupported_format",
            "aac is not available (no AAC encoder here); use mp3, opus, flac, wav or pcm",
            "response_format",
        )
    if container not in FORMATS:
        raise ApiRequestError(
            "unsupported_format",
            f"unknown format {container[:16]!r}; use one of mp3, opus, flac, wav, pcm",
            "response_format",
        )
    return container


def _target_format(name: str | None) -> str | None:
    """The format of a target's audio when the request names one; None = the target's own
    (targets.<t>.format, else http.format), as for a say without a format."""
    if name is None:
        return None
    container = _format(name, "wav")
    if container == "pcm":
        raise ApiRequestError(
            "unsupported_format",
            "a target's audio is a file behind a URL: use wav, flac, mp3 or opus",
            "format",
        )
    return container


def _container(speech: SpeechRequest) -> str:
    """The container a parsed request asked for (the parsers always name one)."""
    assert speech.format is not None
    return speech.format


def _unknown_keys(fields: Mapping[str, Any], known: frozenset[str]) -> None:
    unknown = sorted(str(k) for k in fields if k not in known)
    if unknown:
        shown = ", ".join(k[:32] for k in unknown)
        raise ApiRequestError(
            "invalid_request", f"unknown field(s) {shown}; known: {', '.join(sorted(known))}"
        )


def parse_openai(fields: Mapping[str, Any], voices: frozenset[str]) -> SpeechRequest:
    """`POST /v1/audio/speech`'s JSON body (`voices`: the configured voice names)."""
    _unknown_keys(fields, _OPENAI_KEYS)
    model = _string(fields, "model") or "tts-bridge"
    if model not in MODELS:
        raise ApiRequestError(
            "unknown_model",
            f"unknown model {model[:64]!r}; use one of {', '.join(MODELS)}",
            "model",
        )
    text = _string(fields, "input", required=True)
    assert text is not None
    raw_voice = fields.get("voice")
    if isinstance(raw_voice, Mapping):  # newer clients send {"id": "..."}
        raw_voice = raw_voice.get("id")
    if raw_voice is not None and not isinstance(raw_voice, str):
        raise ApiRequestError("invalid_request", "'voice' must be a string", "voice")
    voice = raw_voice or None
    if voice is not None and voice not in voices and voice.lower() in OPENAI_VOICES:
        voice = None  # OpenAI's name for "a voice": the default one
    stream_format = _string(fields, "stream_format")
    if stream_format not in (None, "audio"):
        raise ApiRequestError(
            "unsupported_format", "stream_format must be 'audio' (no SSE)", "stream_format"
        )
    return SpeechRequest(
        text=text,
        voice=voice,
        format=_format(_string(fields, "response_format"), "mp3"),
        tier=MODELS[model],
        options=_speed(fields.get("speed")),
        priority=_priority(fields),
        door=DOOR,
        target=DOOR,
    )


def parse_speak(fields: Mapping[str, Any]) -> SpeechRequest:
    """`POST /api/speak`'s fields (JSON or form): text, voice, lang, tier, format, speed, cache."""
    _unknown_keys(fields, _SPEAK_KEYS)
    text = _string(fields, "text", required=True)
    assert text is not None
    tier = _string(fields, "tier")
    if tier is not None and tier not in _TIERS:
        raise ApiRequestError("invalid_request", "'tier' must be quality or fast", "tier")
    cache = fields.get("cache", True)
    if isinstance(cache, str):
        cache = cache.strip().lower() not in ("0", "false", "no", "off")
    if not isinstance(cache, bool):
        raise ApiRequestError("invalid_request", "'cache' must be true or false", "cache")
    target = _string(fields, "target") or DOOR
    if target != DOOR and not TARGET_RE.match(target):
        raise ApiRequestError("invalid_target", "'target' is 1-64 of A-Z a-z 0-9 _ -", "target")
    fmt = _string(fields, "format")
    return SpeechRequest(
        text=text,
        voice=_string(fields, "voice") or None,
        format=_format(fmt, "wav") if target == DOOR else _target_format(fmt),
        tier=cast(Tier | None, tier),
        options=_speed(fields.get("speed")),
        language=_string(fields, "lang") or None,
        use_cache=cache,
        stream=False,
        priority=_priority(fields),
        door=DOOR,
        target=target,
    )


class SpeechApi:
    """The API's routes on the HTTP server (`register`), served on its event loop."""

    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        keys: ApiKeys,
        *,
        store: AudioServer | None = None,
        clock: Callable[[], float] = time.monotonic,
        announcer: Announcer | None = None,
    ) -> None:
        """`store`: the server whose audio store keeps encoded answers, so a repeat is not
        encoded again; `announcer`: delivery to a request's `target` and its media players."""
        self._announcer = announcer
        self._settings = settings
        self._store = store
        self._pipeline = pipeline
        self._keys = keys
        self._clock = clock
        self._refusals = LogThrottle(60.0, clock)
        # A request is its text and a few names: room for the longest text, in UTF-8 and
        # JSON-escaped, with the payload limit of the other doors as the floor.
        limits = settings.limits
        self.max_body_bytes = max(limits.max_payload_bytes, 8 * limits.max_text_chars)

    def register(self, app: web.Application) -> None:
        app.router.add_post("/v1/audio/speech", self._guarded(self._openai_speech))
        app.router.add_get("/v1/audio/voices", self._guarded(self._voices))
        app.router.add_get("/v1/models", self._guarded(self._models))
        app.router.add_post("/api/speak", self._guarded(self._speak))

    def _guarded(
        self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The key check, and every refusal as OpenAI's error shape (logged once)."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self._keys.allows(request.headers.get("Authorization")):
                _LOGGER.warning("HTTP request from %s without a valid key", request.remote)
                self._pipeline.count_error("invalid_api_key", door=DOOR)
                return error_response(
                    ApiRequestError(
                        "invalid_api_key",
                        "a valid API key is required (Authorization: Bearer KEY)",
                    )
                )
            # A keyed request is a program's (keys are for programs): believed from anywhere.
            cross_site = origin.same_origin(request) is False
            if request.method == "POST" and cross_site and not self._keys.required:
                return self._cross_origin(request)
            try:
                return await handler(request)
            except (ApiRequestError, SpeechError) as exc:
                _LOGGER.warning(
                    "HTTP speech request from %s refused (%s): %s", request.remote, exc.code, exc
                )
                self._pipeline.count_error(exc.code, door=DOOR)
                return error_response(exc)

        return guarded

    def _cross_origin(self, request: web.Request) -> web.StreamResponse:
        """Refuse another site's page (logged once a minute per client, with the count)."""
        self._pipeline.count_error("cross_origin", door=DOOR)
        since = self._refusals.due(request.remote)
        if since is not None:
            _LOGGER.warning(
                "HTTP speech request from %s refused (%d time(s) since the last report): a browser "
                "page of another site (Origin %s, Sec-Fetch-Site %s); set http.api_keys to "
                "let a page with a key in",
                request.remote,
                since,
                short(request.headers.get("Origin", "-")),
                short(request.headers.get("Sec-Fetch-Site", "-")),
            )
        return error_response(
            ApiRequestError(
                "cross_origin",
                "a request from another site's web page is refused; programs send no Origin, "
                "and a request with a valid API key is accepted from anywhere",
            )
        )

    # descriptions

    async def _voices(self, request: web.Request) -> web.StreamResponse:
        catalog = self._pipeline.voices()
        return web.json_response(
            {
                "voices": [v.name for v in catalog.voices],
                "default_voice": catalog.default_voice,
                "data": [
                    {
                        "id": v.name,
                        "name": v.name,
                        "languages": list(v.languages),
                        "engine": v.engine,
                        "tier": v.tier,
                        "sample_rate": v.sample_rate,
                        "description": v.description,
                    }
                    for v in catalog.voices
                ],
            }
        )

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "tts_bridge",
                        "tier": tier or "auto",
                    }
                    for name, tier in MODELS.items()
                ],
            }
        )

    # speech

    async def _body(self, request: web.Request) -> bytes:
        limit = self.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ApiRequestError("payload_too_large", f"the request is larger than {limit} bytes")
        # read() returns what has arrived so far, not the whole body: read to its end.
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                while chunk := await request.content.read(limit + 1 - size):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        raise ApiRequestError(
                            "payload_too_large", f"the request is larger than {limit} bytes"
                        )
        except TimeoutError:
            raise ApiRequestError(
                "request_timeout", f"the request body did not arrive within {BODY_TIMEOUT_S:g} s"
            ) from None
        return b"".join(chunks)

    async def _json(self, request: web.Request) -> dict[str, Any]:
        body = await self._body(request)
        try:
            fields = load_json(body, self._settings.limits.max_json_depth)
        except UnicodeDecodeError:
            raise ApiRequestError("invalid_utf8", "the request is not UTF-8") from None
        except JsonTooDeepError as exc:
            raise ApiRequestError("json_too_deep", str(exc)) from None
        except ValueError:
            raise ApiRequestError("invalid_json", "the request is not valid JSON") from None
        if not isinstance(fields, dict):
            raise ApiRequestError("invalid_request", "the request must be a JSON object")
        return fields

    async def _openai_speech(self, request: web.Request) -> web.StreamResponse:
        fields = await self._json(request)
        voices = frozenset(v.name for v in self._pipeline.voices().voices)
        return await self._answer(request, parse_openai(fields, voices))

    async def _speak(self, request: web.Request) -> web.StreamResponse:
        kind = request.content_type
        if kind == "multipart/form-data":
            if request.content_length is None or request.content_length > self.max_body_bytes:
                raise ApiRequestError(
                    "payload_too_large", f"the request is larger than {self.max_body_bytes} bytes"
                )
            form = await request.post()
            fields: dict[str, Any] = {k: v for k, v in form.items() if isinstance(v, str)}
        elif kind == "application/x-www-form-urlencoded":
            body = await self._body(request)
            try:
                pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True)
            except UnicodeDecodeError:
                raise ApiRequestError("invalid_utf8", "the request is not UTF-8") from None
            fields = dict(pairs)
        elif kind == "text/plain":
            body = await self._body(request)
            try:
                fields = {**dict(request.query), "text": body.decode("utf-8")}
            except UnicodeDecodeError:
                raise ApiRequestError("invalid_utf8", "the request is not UTF-8") from None
        else:
            fields = await self._json(request)
        speech = parse_speak(fields)
        if speech.target != DOOR:
            speech = with_target_defaults(speech, self._settings.targets.get(speech.target))
        return await self._answer(request, speech)

    def _prepare(self, request: web.Request, speech: SpeechRequest) -> SpeechJob:
        """The door's one call into the pipeline: validation (voice, text, limits) and
        routing; the door and the client's address are its share of the queue."""
        return self._pipeline.prepare(dataclasses.replace(speech, peer=request.remote))

    async def _answer(self, request: web.Request, speech: SpeechRequest) -> web.StreamResponse:
        received = self._clock()
        job = self._prepare(request, speech)
        _LOGGER.info(
            "HTTP speech request %s from %s (%s, %s, %s tier): %s, %d sentence(s)",
            job.id,
            request.remote,
            job.route.voice.name,
            speech.format or "the target's format",
            job.route.tier,
            size(speech.text),
            len(job.plan.sentences),
        )
        _LOGGER.debug("HTTP speech request %s text: %s", job.id, short(speech.text))
        delivery = AsyncDelivery(asyncio.get_running_loop(), self._pipeline)
        admission = self._pipeline.submit(job, delivery.serve)
        if not admission:
            raise SpeechError("busy", admission.message)
        try:
            if speech.stream and _container(speech) in STREAM_FORMATS:
                response, complete = await self._stream(request, job, delivery, speech)
                if not complete:
                    return response  # counted as the error it was
            else:
                response = await self._whole(job, delivery, speech)
                # The body is whole: aiohttp writes it as this handler returns.
                self._pipeline.first_byte_sent(job)
        except (ConnectionError, asyncio.CancelledError):
            _LOGGER.info("HTTP speech request %s: the client left before the end", job.id)
            self._pipeline.count_error("client_gone", door=DOOR)
            raise
        finally:
            delivery.abandon()  # a worker still rendering stops at its next part
        latency_ms = round((self._clock() - received) * 1000, 1)
        self._pipeline.count_answer(
            job.route.tier, latency_ms, door=DOOR, voice=job.route.voice.name
        )
        return response

    def _headers(self, job: SpeechJob, sample_rate: int) -> dict[str, str]:
        return {
            "Cache-Control": "no-store",
            "X-TTS-Voice": job.route.voice.name,
            "X-TTS-Tier": job.route.tier,
            "X-TTS-Sample-Rate": str(sample_rate),
        }

    def _encoded(self, rendering: Rendering, fmt: AudioFormat) -> bytes:
        """The answer in `fmt`: from the audio store when the same samples were encoded before
        (an answer from the cache is the same samples), else encoded now and kept there."""
        store = self._store
        if store is not None:
            try:
                published = store.publish(rendering.pcm, rendering.sample_rate, fmt)
                data = published.data or store.read(published)
                if data is not None:
                    return data
            except OSError as exc:  # the store's folder: full, or not writable
                _LOGGER.warning("Encoding without the audio store: %s", exc)
        return encode(rendering.pcm, rendering.sample_rate, fmt).data

    async def _whole(
        self, job: SpeechJob, delivery: AsyncDelivery, speech: SpeechRequest
    ) -> web.StreamResponse:
        while True:
            event = await delivery.next_event()
            if isinstance(event, Finished):
                break
        rendering = event.rendering
        if speech.target != DOOR and self._announcer is not None:  # a target's answer: JSON
            answer = await self._announcer.answer(speech, rendering)
            return web.json_response(answer, headers={"Cache-Control": "no-store"})
        container = _container(speech)
        if container == "wav":  # the rendering's own WAV, sample for sample
            data, content_type, rate = rendering.wav, "audio/wav", rendering.sample_rate
        elif container == "pcm":
            encoder = stream_encoder("pcm", rendering.sample_rate)
            data = encoder.feed(rendering.pcm) + encoder.finish()
            content_type, rate = encoder.content_type, encoder.sample_rate
        else:
            fmt = AudioFormat(cast(Container, container))
            try:
                # Off the loop: encoding is CPU work, and the store reads and writes files.
                data = await asyncio.get_running_loop().run_in_executor(
                    None, self._encoded, rendering, fmt
                )
            except EncodeError as exc:
                raise SpeechError("encoding_failed", str(exc)) from exc
            content_type, rate = fmt.content_type, fmt.output_rate(rendering.sample_rate)
        headers = self._headers(job, rate)
        headers["X-TTS-Cached"] = "true" if rendering.cached else "false"
        return web.Response(body=data, content_type=content_type, headers=headers)

    async def _stream(
        self,
        request: web.Request,
        job: SpeechJob,
        delivery: AsyncDelivery,
        speech: SpeechRequest,
    ) -> tuple[web.StreamResponse, bool]:
        """The audio as it is made, and whether all of it went. The first part is awaited
        before anything is sent, so a request refused by the engine still gets an error
        status; a failure after that can only end the connection early (logged)."""
        first = await delivery.next_event()
        encoder = stream_encoder(cast(StreamFormat, _container(speech)), job.sample_rate)
        response = web.StreamResponse(headers=self._headers(job, encoder.sample_rate))
        response.content_type = encoder.content_type
        response.enable_chunked_encoding()
        await response.prepare(request)
        event: AudioPart | Finished = first
        await response.write(encoder.start())
        try:
            while not isinstance(event, Finished):
                data = encoder.feed(event.pcm)
                if data:
                    await response.write(data)
                    self._pipeline.first_byte_sent(job)  # the first write's counts
                event = await delivery.next_event()
            await response.write(encoder.finish())
        except SpeechError as exc:
            # The status line went out with the first part: ending the connection early is
            # the only way left to tell the client.
            _LOGGER.error("HTTP speech request %s failed while streaming: %s", job.id, exc)
            self._pipeline.count_error(exc.code, door=DOOR)
            if request.transport is not None:
                request.transport.close()  # the body ends without its last chunk: incomplete
            return response, False
        await response.write_eof()
        return response, True
