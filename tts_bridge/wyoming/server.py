"""The Wyoming TTS server: Home Assistant's local TTS protocol, on the speech pipeline.

Home Assistant's Wyoming integration (and Rhasspy satellites, and any Wyoming client) asks for
`describe` and `synthesize`, or the streaming form (`synthesize-start`, `synthesize-chunk`...,
`synthesize-stop`). Every request goes through the same pipeline as an MQTT say request: the
cache, routing to the fast tier, the scheduler's queue, idle work, the health counters.

The server's asyncio loop runs in a thread of its own and never synthesizes: each job is
handed to the scheduler's worker threads with `Pipeline.submit`, and its audio comes back to
the loop part by part (`AsyncDelivery`) as each sentence, or streamed ChatTTS piece, is ready.
A request that fails gets an `error` event and then the connection is closed, because Home
Assistant ignores `error` events and waits until the connection ends.

The server is open to the LAN, so it holds: connections are capped in total and per client
address (past a cap: an `error` event with code `busy`, and closed), a client that sends
nothing for IDLE_TIMEOUT_S is closed, one that does not read its audio for
wyoming.write_timeout_s is dropped and its synthesis stopped, and the kernel buffers at most
SEND_BUFFER bytes for each. A client's requests count against its address's share of the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)
from zeroconf import ServiceInfo
from zeroconf.asyncio import AsyncZeroconf

from tts_bridge import __version__
from tts_bridge.audio import codec
from tts_bridge.config import Settings
from tts_bridge.engines.base import Tier
from tts_bridge.speech.async_delivery import AsyncDelivery, Finished
from tts_bridge.speech.pipeline import Pipeline, SpeechError, SpeechJob
from tts_bridge.speech.request import SpeechRequest
from tts_bridge.speech.synthesis import AudioPart
from tts_bridge.system.connections import (
    LISTEN_BACKLOG,
    ConnectionCaps,
    ConnectionGate,
    GatedProtocol,
    LoopFaults,
    peer_host,
)
from tts_bridge.textlog import short, size
from tts_bridge.wire import new_id, raw_size
from tts_bridge.wyoming.events import (
    RequestedVoice,
    SentenceStream,
    VoiceEntry,
    WyomingRequestError,
    audio_chunks,
    audio_start,
    audio_stop,
    build_info,
    choose_voice,
    encode_event,
    error_event,
    event_text,
    read_event,
    requested_voice,
    service_info,
    text_format_ssml,
)
from tts_bridge.wyoming.settings import WyomingSettings

_LOGGER = logging.getLogger(__name__)

TARGET = "wyoming"
"""The pipeline target of Wyoming requests (in logs and health)."""
IDLE_TIMEOUT_S = 120.0
"""A connection that sends nothing for this long is closed: Home Assistant opens one per
request and sends its text as it comes, so a silent one is a client that went away."""
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
LINGER_S = 2.0
"""After a refusal, how long the server waits for the client to close its side."""
_MDNS_GROUP = "224.0.0.251"
SEND_BUFFER = 128 * 1024
"""SO_SNDBUF of each connection: what the kernel holds for a client that does not read (a few
seconds of audio), so a stalled client shows at drain() instead of filling memory."""
LINE_LIMIT = 64 * 1024
"""Longest event header line (asyncio's default stream limit)."""


class _ClientGoneError(Exception):
    """The client closed the connection (or the server is stopping)."""


def voice_entries(pipeline: Pipeline) -> tuple[list[VoiceEntry], str]:
    """The configured voices as Wyoming lists them, and the default voice."""
    catalog = pipeline.voices()
    entries = [
        VoiceEntry(
            name=v.name, description=v.description or "", languages=v.languages, engine=v.engine
        )
        for v in (*catalog.voices, *catalog.presets)
    ]
    return entries, catalog.default_voice


def announced_addresses(settings: WyomingSettings) -> list[str]:
    """The IPv4 addresses to announce for the server: none when it listens on loopback only
    (nobody else could reach it), its own address when it listens on one, else the address
    this machine reaches the LAN from."""
    try:
        host = ipaddress.ip_address(settings.host)
    except ValueError:  # a host name
        try:
            host = ipaddress.ip_address(socket.gethostbyname(settings.host))
        except OSError:
            return []
    if host.is_loopback:
        return []
    if not host.is_unspecified:
        return [str(host)] if host.version == 4 else []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((_MDNS_GROUP, 1))  # picks the route; a UDP connect sends nothing
        return [probe.getsockname()[0]]
    except OSError:
        return []
    finally:
        probe.close()


def announcement(settings: WyomingSettings) -> ServiceInfo | None:
    """The zeroconf record to register, or None when the server is not to be announced."""
    if not settings.zeroconf:
        return None
    addresses = announced_addresses(settings)
    if not addresses:
        _LOGGER.info(
            "Wyoming zeroconf announcement skipped: no LAN address for host %s", settings.host
        )
        return None
    return service_info(settings.zeroconf_name or settings.name, settings.port, addresses)


@dataclass
class _Answer:
    """One answer's audio: its jobs in order, on one audio stream with one format."""

    voice: str
    language: str | None
    tier: Tier | None = None
    """Pinned by the first job, so that a stream keeps one voice and one sample rate
    (Home Assistant reads the format from the first audio-start only)."""
    rate: int = 0
    started: bool = False
    jobs: int = 0
    received: float = field(default_factory=time.monotonic)
    ssml: bool | None = None
    """A client's `text_format: ssml`; None: SSML when the text starts with <speak>."""

    def request(self, text: str, peer: str | None) -> SpeechRequest:
        """The speech core's request for one job of this answer (`text`: its sentences)."""
        return SpeechRequest(
            id=new_id(),
            text=text,
            voice=self.voice,
            language=self.language,
            tier=self.tier,
            target=TARGET,
            ssml=self.ssml,
            door="wyoming",
            peer=peer,
        )


@dataclass
class _Stream:
    """A streaming request between synthesize-start and synthesize-stop."""

    answer: _Answer
    text: SentenceStream
    pending: list[str] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    finishing: bool = False
    spoken: bool = False
    """Some text was queued to speak."""
    whole_text: str | None = None
    """The full synthesize sent inside the stream, spoken only if no chunk brought text."""
    speaker: asyncio.Task[None] | None = None


class _Session(AsyncEventHandler):
    """One client connection."""

    def __init__(
        self, server: WyomingServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        super().__init__(reader, writer)
        self._server = server
        self._stream: _Stream | None = None
        self._busy = False
        """A request is being answered (so a close now fails it)."""
        self._closing = False
        self._write_lock = asyncio.Lock()
        peer = writer.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "client"
        self._peer_host = peer_host(writer.transport)
        """The client's address: its share of the queue."""

    # the connection

    async def run(self) -> None:
        max_bytes = self._server.max_event_bytes
        max_depth = self._server.max_json_depth
        try:
            while not self._closing:
                try:
                    event = await asyncio.wait_for(
                        read_event(self.reader, max_bytes, max_depth), IDLE_TIMEOUT_S
                    )
                except TimeoutError:
                    raise WyomingRequestError(
                        "timeout", f"nothing received for {IDLE_TIMEOUT_S:.0f} s"
                    ) from None
                if event is None:
                    break
                if not await self.handle_event(event):
                    break
        except WyomingRequestError as exc:
            await self._refuse(exc)
        except _ClientGoneError:
            pass
        except Exception:
            _LOGGER.exception("Wyoming client %s: request failed", self._peer)
            await self._refuse(WyomingRequestError("internal_error", "internal error"))
        finally:
            if self._closing:
                await self._drain()
            await self.disconnect()

    async def disconnect(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None and stream.speaker is not None:
            stream.speaker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await stream.speaker
        if self._busy and not self._closing:
            _LOGGER.warning("Wyoming client %s left before its answer was complete", self._peer)
            self._server.pipeline.count_error("client_gone", door="wyoming")
        self._busy = False
        self._closing = True
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()

    async def write_event(self, event: Event) -> None:
        """Send an event; a client that has not read it within wyoming.write_timeout_s is
        dropped (its synthesis then stops at its next part)."""
        timeout_s = self._server.write_timeout_s
        async with self._write_lock:
            try:
                self.writer.write(encode_event(event))
                async with asyncio.timeout(timeout_s):
                    await self.writer.drain()
            except TimeoutError:
                _LOGGER.warning(
                    "Wyoming client %s read nothing for %.0f s (wyoming.write_timeout_s); dropped",
                    self._peer,
                    timeout_s,
                )
                self._server.dropped_writers += 1
                self.writer.transport.abort()
                raise _ClientGoneError() from None
            except (ConnectionError, OSError, RuntimeError) as exc:
                raise _ClientGoneError() from exc

    async def _refuse(self, exc: WyomingRequestError) -> None:
        """Send the error, count it, close: Home Assistant only notices the close."""
        if self._closing:
            return
        self._closing = True
        self._busy = False
        _LOGGER.warning("Wyoming request from %s refused (%s): %s", self._peer, exc.code, exc)
        self._server.pipeline.count_error(exc.code, door="wyoming")
        with contextlib.suppress(_ClientGoneError):
            await self.write_event(error_event(exc.code, str(exc)))
        # Half-close: the client reads the error, then the end of the stream. The session's
        # reader ends the connection once the client has closed its side (`_drain`).
        with contextlib.suppress(OSError, RuntimeError):
            if self.writer.can_write_eof():
                self.writer.write_eof()

    async def _drain(self) -> None:
        """Read and drop what the client still sends after a refusal, until it closes (for a
        short while at most): closing a socket with unread data resets the connection, and a
        reset can discard the error event before the client has read it."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(LINGER_S):
                while await self.reader.read(65536):
                    pass

    # events

    async def handle_event(self, event: Event) -> bool:
        if self._closing:  # refused while this event was on its way
            return False
        kind = event.type
        if Describe.is_type(kind):
            await self.write_event(self._server.info_event())
        elif Ping.is_type(kind):
            await self.write_event(Pong(text=event.data.get("text")).event())
        elif Synthesize.is_type(kind):
            await self._on_synthesize(event)
        elif SynthesizeStart.is_type(kind):
            self._on_stream_start(event)
        elif SynthesizeChunk.is_type(kind):
            self._on_stream_chunk(event)
        elif SynthesizeStop.is_type(kind):
            await self._on_stream_stop()
        else:
            _LOGGER.debug("Wyoming client %s: ignoring a %s event", self._peer, kind[:64])
        return not self._closing

    def _answer_for(self, voice: RequestedVoice) -> _Answer:
        voices, default_voice = voice_entries(self._server.pipeline)
        name, language = choose_voice(voice, voices, default_voice)
        return _Answer(name, language)

    async def _on_synthesize(self, event: Event) -> None:
        text = event_text(event)
        limit = self._server.max_raw_text_bytes
        if raw_size(text) > limit:
            raise WyomingRequestError(
                "text_too_long",
                f"the text has more than {limit} bytes (limits.max_raw_text_bytes)",
            )
        if self._stream is not None:
            # Home Assistant repeats the whole text this way for servers that do not stream;
            # speaking it too would say everything twice.
            self._stream.whole_text = text
            return
        answer = self._answer_for(requested_voice(event.data))
        answer.ssml = text_format_ssml(event.data)
        _LOGGER.info("Wyoming request from %s (%s): %s", self._peer, answer.voice, size(text))
        _LOGGER.debug("Wyoming request from %s text: %s", self._peer, short(text))
        self._busy = True
        await self._say(answer, text)
        if not answer.started:  # the pipeline answers every text with audio or an error
            raise WyomingRequestError("synthesis_failed", "no audio was made")
        # Counted first: a client that reads health after its answer finds it counted.
        self._answered(answer)
        await self.write_event(audio_stop())

    def _on_stream_start(self, event: Event) -> None:
        if self._stream is not None:
            raise WyomingRequestError("unexpected_event", "synthesize-start inside a stream")
        answer = self._answer_for(requested_voice(event.data))
        answer.ssml = text_format_ssml(event.data)
        _LOGGER.info("Wyoming stream from %s (%s) started", self._peer, answer.voice)
        stream = _Stream(
            answer, SentenceStream(self._server.max_raw_text_bytes, whole=answer.ssml is True)
        )
        stream.speaker = asyncio.create_task(self._speak_stream(stream), name="wyoming speaker")
        self._stream = stream
        self._busy = True

    def _on_stream_chunk(self, event: Event) -> None:
        text = event_text(event)
        stream = self._require_stream("synthesize-chunk")
        sentences = stream.text.add(text)
        limit = self._server.max_text_chars
        if stream.text.chars > limit:
            raise WyomingRequestError(
                "text_too_long",
                f"the streamed text has more than {limit} characters, the limit",
            )
        if sentences:
            self._queue(stream, sentences)

    async def _on_stream_stop(self) -> None:
        stream = self._require_stream("synthesize-stop")
        rest = stream.text.finish()
        if rest:
            self._queue(stream, [rest])
        elif not stream.spoken and stream.whole_text and stream.whole_text.strip():
            self._queue(stream, [stream.whole_text])
        if not stream.spoken:
            raise WyomingRequestError("empty_text", "the text is empty")
        stream.finishing = True
        stream.wake.set()
        assert stream.speaker is not None
        await stream.speaker
        if self._closing:  # the speaker refused a sentence
            return
        self._stream = None
        self._answered(stream.answer)  # counted first, as above
        await self.write_event(audio_stop())
        await self.write_event(SynthesizeStopped().event())

    def _require_stream(self, kind: str) -> _Stream:
        if self._stream is None:
            raise WyomingRequestError("unexpected_event", f"{kind} without synthesize-start")
        return self._stream

    def _queue(self, stream: _Stream, sentences: list[str]) -> None:
        stream.pending.extend(sentences)
        stream.spoken = True
        stream.wake.set()

    def _answered(self, answer: _Answer) -> None:
        self._busy = False
        latency_ms = round((time.monotonic() - answer.received) * 1000, 1)
        self._server.pipeline.count_answer(
            answer.tier or "quality", latency_ms, door="wyoming", voice=answer.voice
        )
        _LOGGER.info(
            "Wyoming request from %s done: %s tier, %s, %d job(s)",
            self._peer,
            answer.tier,
            answer.voice,
            answer.jobs,
        )

    # speaking

    async def _speak_stream(self, stream: _Stream) -> None:
        """Speak a stream's sentences in order, as they complete, one job at a time (jobs of
        one answer must not overtake each other on the scheduler's lanes)."""
        try:
            while True:
                await stream.wake.wait()
                stream.wake.clear()
                while stream.pending:
                    text = " ".join(stream.pending)
                    stream.pending.clear()
                    await self._say(stream.answer, text)
                if stream.finishing:
                    return
        except WyomingRequestError as exc:
            await self._refuse(exc)
        except _ClientGoneError:
            await self.stop()

    async def _say(self, answer: _Answer, text: str) -> None:
        """One pipeline job: its audio to the client as each part is ready."""
        pipeline = self._server.pipeline
        try:
            job = pipeline.prepare(answer.request(text, self._peer_host))
        except SpeechError as exc:
            raise WyomingRequestError(exc.code, str(exc)) from None
        if answer.tier is None:
            answer.tier, answer.rate = job.route.tier, job.sample_rate
        _LOGGER.debug("Wyoming job %s: %s tier (%s)", job.id, job.route.tier, job.route.reason)
        delivery = AsyncDelivery(asyncio.get_running_loop(), pipeline)
        admission = pipeline.submit(job, delivery.serve)
        if not admission:
            raise WyomingRequestError("busy", admission.message)
        first = True
        try:
            while True:
                try:
                    event = await delivery.next_event()
                except SpeechError as exc:
                    raise WyomingRequestError(exc.code, str(exc)) from None
                if isinstance(event, Finished):
                    break
                await self._send_part(answer, event, job if first else None)
                first = False
        finally:
            delivery.abandon()  # a worker still rendering stops at its next part
        answer.jobs += 1

    async def _send_part(self, answer: _Answer, part: AudioPart, first: SpeechJob | None) -> None:
        """One part's audio-chunks; `first`: the job whose first audio this is (its first
        chunk's write is the request's first byte)."""
        pcm = part.pcm
        if part.seq == 0 and answer.jobs and part.sentence == 0:
            # The pause the pipeline puts between the sentences of one job, between jobs too.
            pcm = np.concatenate([codec.silence(answer.rate, self._server.pause_ms), pcm])
        if not answer.started:
            await self.write_event(audio_start(answer.rate))
            answer.started = True
        for event in audio_chunks(np.asarray(pcm, dtype="<i2").tobytes(), answer.rate):
            await self.write_event(event)
            if first is not None:
                self._server.pipeline.first_byte_sent(first)
                first = None


class WyomingServer:
    """The Wyoming front end: `start` serves in a thread of its own, `stop` ends it.

    Started after the pipeline, stopped before the scheduler drains; a port already in use is
    logged and leaves the rest of the bridge running.
    """

    def __init__(
        self, settings: Settings, pipeline: Pipeline, caps: ConnectionCaps | None = None
    ) -> None:
        """`caps` are the connection caps fitted under the open-file limit (default: the
        settings' own)."""
        self._settings = settings.wyoming
        self.pipeline = pipeline
        self.gate = ConnectionGate(
            "wyoming",
            caps.wyoming if caps is not None else settings.wyoming.max_connections,
            caps.wyoming_per_peer
            if caps is not None
            else settings.wyoming.max_connections_per_peer,
        )
        self.faults = LoopFaults("Wyoming")
        self.write_timeout_s = settings.wyoming.write_timeout_s
        self.dropped_writers = 0
        """Clients dropped because they did not read their audio."""
        self.max_raw_text_bytes = settings.limits.max_raw_text_bytes
        self.max_json_depth = settings.limits.max_json_depth
        self.max_text_chars = settings.limits.max_text_chars
        # A synthesize event is its text and a voice: room for the longest text, in UTF-8,
        # JSON-escaped, with the payload limit of MQTT requests as the floor.
        self.max_event_bytes = max(settings.limits.max_payload_bytes, 8 * self.max_text_chars)
        self.pause_ms = settings.synthesis.sentence_pause_ms
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self.serving = False
        self.announced: ServiceInfo | None = None
        """The zeroconf record registered, if any."""

    def info_event(self) -> Event:
        voices, _ = voice_entries(self.pipeline)
        return build_info(self._settings.name, __version__, voices).event()

    def start(self) -> None:
        if not self._settings.enabled:
            _LOGGER.info("Wyoming server off (wyoming.enabled)")
            return
        self._thread = threading.Thread(target=self._run, name="wyoming", daemon=True)
        self._thread.start()
        self._ready.wait(START_TIMEOUT_S)

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            if self._thread.is_alive():
                _LOGGER.warning("Wyoming server still stopping after %.0f s", STOP_TIMEOUT_S)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception:
            _LOGGER.exception("Wyoming server failed")
        finally:
            self.serving = False
            self._ready.set()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Cancelled only when the server stops; asyncio's stream callback would report a
        # cancelled session as an error.
        with contextlib.suppress(asyncio.CancelledError):
            await _Session(self, reader, writer).run()

    def _protocol(self) -> asyncio.Protocol:
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        return asyncio.StreamReaderProtocol(reader, self._session)

    @staticmethod
    def _busy(limit: str) -> bytes:
        return encode_event(
            error_event("busy", f"the bridge is busy: {limit} reached; retry later")
        )

    async def _serve(self) -> None:
        settings = self._settings
        loop = asyncio.get_running_loop()
        self.faults.install(loop)
        self._loop = loop
        self._stopping = asyncio.Event()
        try:
            # Each connection passes the gate before a session (and a task) is made for it.
            listener = await loop.create_server(
                lambda: GatedProtocol(self._protocol, self.gate, self._busy, SEND_BUFFER),
                settings.host or None,
                settings.port,
                reuse_address=True,
                backlog=LISTEN_BACKLOG,
            )
        except OSError as exc:
            _LOGGER.error(
                "Wyoming server cannot listen on %s:%d (%s): Home Assistant's Wyoming "
                "integration cannot reach this bridge; MQTT goes on",
                settings.host,
                settings.port,
                exc.strerror or exc,
            )
            return
        self.serving = True
        self._ready.set()
        _LOGGER.info("Wyoming server listening on %s:%d", settings.host, settings.port)
        zeroconf = await self._announce()
        try:
            await self._stopping.wait()
        finally:
            if zeroconf is not None:
                with contextlib.suppress(Exception):
                    await zeroconf.async_unregister_all_services()
                await zeroconf.async_close()
            listener.close()
            await _cancel_others()

    def describe(self) -> dict[str, object]:
        """Connections and what the loop reported, for the health report."""
        return {
            **self.gate.snapshot(),
            "dropped_slow_readers": self.dropped_writers,
            "accept_errors": self.faults.snapshot(),
        }

    async def _announce(self) -> AsyncZeroconf | None:
        info = announcement(self._settings)
        if info is None:
            return None
        try:
            zeroconf = await register(info)
        except Exception as exc:
            _LOGGER.error("Wyoming zeroconf announcement failed: %s", exc)
            return None
        self.announced = info
        _LOGGER.info(
            "Wyoming server announced as %s on %s", info.name, ", ".join(info.parsed_addresses())
        )
        return zeroconf


async def register(info: ServiceInfo) -> AsyncZeroconf:
    """Register the record on the interfaces of its own addresses only (another instance of
    the same name on the LAN makes zeroconf pick a free one)."""
    zeroconf = AsyncZeroconf(interfaces=info.parsed_addresses())
    try:
        await zeroconf.async_register_service(info, allow_name_change=True)
    except BaseException:
        await zeroconf.async_close()
        raise
    return zeroconf


async def _cancel_others() -> None:
    """End the sessions still running (a client mid-answer when the bridge stops)."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["WyomingServer", "announcement", "register"]
