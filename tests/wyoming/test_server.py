"""The Wyoming TTS server, driven by the `wyoming` package's own client over loopback TCP.

Real voices (Piper joe, hibari heart), the real pipeline and scheduler; zeroconf stays off
(nothing is announced on the LAN from a test).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from tests.support.harness import BASE_TOPIC, BridgeFactory, ProbeFactory, bridge_api
from tts_bridge.config import Settings, load_settings
from tts_bridge.engines.registry import EnginePool
from tts_bridge.speech.cache import SentenceCache
from tts_bridge.speech.idle import IdleWork
from tts_bridge.speech.pipeline import Pipeline
from tts_bridge.speech.routing import TierRouter
from tts_bridge.speech.scheduler import Scheduler
from tts_bridge.speech.synthesis import Synthesizer
from tts_bridge.wyoming.events import (
    SERVICE_TYPE,
    RequestedVoice,
    SentenceStream,
    VoiceEntry,
    WyomingRequestError,
    choose_voice,
    service_info,
)
from tts_bridge.wyoming.server import WyomingServer, announcement, register
from tts_bridge.wyoming.settings import WyomingSettings

MAX_TEXT_CHARS = 300
TIMEOUT_S = 60.0
JOE_RATE = 22050
HEART_RATE = 24000
KOKORO_RATE = 24000


# -- fixtures --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    tmp = tmp_path_factory.mktemp("wyoming")
    return load_settings(
        None,
        {
            "cache": {"dir": str(tmp / "cache")},
            "synthesis": {"onnx_threads": 1},
            "limits": {"max_text_chars": MAX_TEXT_CHARS},
            "scheduler": {"idle_enabled": False},
            "wyoming": {"host": "127.0.0.1", "port": free_port(), "zeroconf": False},
        },
        environ={},
    )


@pytest.fixture(scope="module")
def synth(settings: Settings) -> Synthesizer:
    return Synthesizer(settings, EnginePool(settings), SentenceCache(settings.cache))


@dataclass
class Running:
    server: WyomingServer
    pipeline: Pipeline
    port: int

    def answers(self, kind: str) -> int:
        """Answers counted per tier, or "error"."""
        return self.pipeline.counters.snapshot()[0].get(kind, 0)


def _serve(settings: Settings, synth: Synthesizer, budget_ms: int) -> Iterator[Running]:
    scheduler = Scheduler(1, settings.limits.max_queue)
    router = TierRouter(budget_ms, settings.scheduler.hysteresis)
    pipeline = Pipeline(settings, synth, scheduler, router, IdleWork(settings, synth))
    pipeline.start()
    server = WyomingServer(settings, pipeline)
    server.start()
    assert server.serving, "the Wyoming server did not start"
    try:
        yield Running(server, pipeline, settings.wyoming.port)
    finally:
        server.stop()
        pipeline.stop(10.0)


@pytest.fixture(scope="module")
def running(settings: Settings, synth: Synthesizer) -> Iterator[Running]:
    # A budget no request misses: every answer comes from the voice asked for.
    yield from _serve(settings, synth, budget_ms=600_000)


# -- client helpers --------------------------------------------------------------------------


@dataclass
class Exchange:
    events: list[Event]
    closed: bool
    """The server closed the connection after its last event."""
    first_audio_s: float | None

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.type == kind]

    @property
    def pcm(self) -> np.ndarray:
        chunks = [AudioChunk.from_event(e).audio for e in self.of("audio-chunk")]
        return np.frombuffer(b"".join(chunks), dtype="<i2")

    @property
    def rate(self) -> int:
        return AudioStart.from_event(self.of("audio-start")[0]).rate

    @property
    def error(self) -> Error:
        return Error.from_event(self.of("error")[0])


async def _read_until(
    read: Any, ends: Sequence[str], started: float
) -> tuple[list[Event], bool, float | None]:
    events: list[Event] = []
    first_audio: float | None = None
    while True:
        event = await asyncio.wait_for(read(), TIMEOUT_S)
        if event is None:
            return events, True, first_audio
        if event.type == "audio-chunk" and first_audio is None:
            first_audio = time.monotonic() - started
        events.append(event)
        if event.type in ends:
            return events, False, first_audio


async def _exchange(port: int, events: Sequence[Event], ends: Sequence[str]) -> Exchange:
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    try:
        started = time.monotonic()
        for event in events:
            try:
                await client.write_event(event)
            except ConnectionError:
                break  # the server refused an earlier event and closed: read its answer
        got, closed, first = await _read_until(client.read_event, ends, started)
        if not closed and got and got[-1].type == "error":
            closed = await asyncio.wait_for(client.read_event(), TIMEOUT_S) is None
        return Exchange(got, closed, first)
    finally:
        # Events the server did not read before closing make the close end in a reset.
        with contextlib.suppress(ConnectionError):
            await client.disconnect()


def exchange(port: int, *events: Event, ends: Sequence[str] = ("audio-stop", "error")) -> Exchange:
    return asyncio.run(_exchange(port, events, ends))


def stream_events(voice: str | None, chunks: Sequence[str], *, whole: bool = True) -> list[Event]:
    """What Home Assistant sends for one streamed request (the full synthesize included)."""
    synth_voice = SynthesizeVoice(name=voice) if voice else None
    events = [SynthesizeStart(voice=synth_voice).event()]
    events += [SynthesizeChunk(text=c).event() for c in chunks]
    if whole:
        events.append(Synthesize(text="".join(chunks), voice=synth_voice).event())
    events.append(SynthesizeStop().event())
    return events


def say(text: str, voice: str | None = None, language: str | None = None) -> Event:
    if voice is None and language is None:
        return Synthesize(text=text).event()
    return Synthesize(text=text, voice=SynthesizeVoice(name=voice, language=language)).event()


def raw_exchange(port: int, frame: bytes) -> Exchange:
    """Bytes no Wyoming client would send, then the server's events until it closes."""

    async def run() -> Exchange:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(frame)
            await writer.drain()
            got, closed, first = await _read_until(
                lambda: async_read_event(reader), (), time.monotonic()
            )
            return Exchange(got, closed, first)
        finally:
            writer.close()

    return asyncio.run(run())


def assert_serves(running: Running) -> None:
    """A good request on a new connection is answered with audio."""
    answer = exchange(running.port, say("Still here."))
    assert answer.of("audio-stop") and not answer.of("error"), answer.events
    assert answer.pcm.size > JOE_RATE // 4


# -- describe --------------------------------------------------------------------------------


def test_describe_lists_every_voice(running: Running) -> None:
    answer = exchange(running.port, Describe().event(), ends=("info",))
    info = Info.from_event(answer.of("info")[0])
    assert len(info.tts) == 1
    program = info.tts[0]
    assert program.name == "tts_bridge"
    assert program.installed and program.supports_synthesize_streaming
    assert program.version
    voices = {v.name: v for v in program.voices}
    assert set(voices) == {"joe", "heart", "xiaobei"}
    for name, voice in voices.items():
        assert voice.installed
        # Home Assistant offers a voice for the languages it lists.
        assert voice.languages == (["zh"] if name == "xiaobei" else ["en"])
        assert voice.speakers is None
        assert voice.description
        assert voice.attribution.name and voice.attribution.url
    assert "Piper" in voices["joe"].attribution.name
    assert "Kokoro" in voices["xiaobei"].attribution.name


# -- synthesize ------------------------------------------------------------------------------


def test_synthesize_speaks_with_the_default_voice(running: Running) -> None:
    answer = exchange(running.port, say("The washing machine has finished."))
    assert answer.events[0].type == "audio-start"
    assert answer.events[-1].type == "audio-stop"
    start = AudioStart.from_event(answer.of("audio-start")[0])
    assert (start.rate, start.width, start.channels) == (JOE_RATE, 2, 1)
    for event in answer.of("audio-chunk"):
        chunk = AudioChunk.from_event(event)
        assert (chunk.rate, chunk.width, chunk.channels) == (JOE_RATE, 2, 1)
    seconds = answer.pcm.size / JOE_RATE
    assert 1.0 < seconds < 5.0, seconds
    assert np.sqrt(np.mean(answer.pcm.astype(np.float64) ** 2)) > 100  # speech, not silence
    assert not answer.closed  # the connection stays usable for another request


def test_a_long_sentence_s_first_chunk_comes_before_its_synthesis_ends(
    running: Running, synth: Synthesizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = synth.engines.voice("joe").engine
    stream = engine.synthesize_stream  # type: ignore[attr-defined]  # Piper's, not every engine's
    made: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for chunk in stream(*args, **kwargs):  # Piper's generation returns nothing
            if chunk.size:
                made.append(time.monotonic())  # a window of the sentence is decoded
            yield chunk

    monkeypatch.setattr(engine, "synthesize_stream", timed)
    text = (
        "When the rain stops this afternoon, please bring the garden chairs back inside, "
        "close the shed behind the house, and switch the sprinklers off for the evening."
    )

    async def first_chunk_at() -> tuple[float, Exchange]:
        client = AsyncTcpClient("127.0.0.1", running.port)
        await client.connect()
        try:
            for request in stream_events("joe", [text]):
                await client.write_event(request)
            events: list[Event] = []
            first: float | None = None
            while not events or events[-1].type not in ("synthesize-stopped", "error"):
                event = await asyncio.wait_for(client.read_event(), TIMEOUT_S)
                assert event is not None
                if event.type == "audio-chunk" and first is None:
                    first = time.monotonic()
                events.append(event)
            assert first is not None
            return first, Exchange(events, False, None)
        finally:
            await client.disconnect()

    first, answer = asyncio.run(first_chunk_at())
    assert not answer.of("error") and answer.pcm.size > 3 * JOE_RATE
    assert len(made) > 1, "decoded in windows"
    assert first < made[-1], "the first audio went out while the rest was being synthesized"
    # The whole sentence is cached: the same text again is one hit, the same audio.
    synthesized, hits = len(made), synth.cache.stats()["hits"]
    again = exchange(running.port, say(text, voice="joe"))
    assert np.array_equal(again.pcm, answer.pcm)
    assert len(made) == synthesized  # nothing synthesized again
    assert synth.cache.stats()["hits"] == hits + 1


def test_synthesize_with_a_voice_and_by_language(running: Running) -> None:
    heart = exchange(running.port, say("Dinner is ready.", voice="heart"))
    assert heart.rate == HEART_RATE and heart.pcm.size > HEART_RATE // 2
    by_language = exchange(running.port, say("Dinner is ready.", language="en-US"))
    assert by_language.rate == JOE_RATE  # the default voice speaks English
    # Chinese, as Home Assistant asks for it: the voice that speaks it.
    chinese = exchange(running.port, say("晚饭准备好了。", language="zh-CN"))
    assert chinese.rate == KOKORO_RATE and chinese.pcm.size > KOKORO_RATE // 2


def test_two_requests_on_one_connection(running: Running) -> None:
    async def run() -> list[Exchange]:
        answers = []
        async with AsyncTcpClient("127.0.0.1", running.port) as client:
            for text in ("One.", "Two."):
                await client.write_event(say(text))
                got, closed, first = await _read_until(
                    client.read_event, ("audio-stop", "error"), time.monotonic()
                )
                answers.append(Exchange(got, closed, first))
        return answers

    for answer in asyncio.run(run()):
        assert answer.of("audio-stop") and answer.pcm.size > 0


# -- streaming -------------------------------------------------------------------------------


def test_streaming_speaks_each_sentence_once(running: Running) -> None:
    chunks = ["The front", " door is open. The win", "dow in the kitchen", " is open too."]
    whole = exchange(running.port, say("".join(chunks)))
    streamed = exchange(running.port, *stream_events(None, chunks), ends=("synthesize-stopped",))
    assert streamed.events[-1].type == "synthesize-stopped"
    assert not streamed.of("error")
    assert len(streamed.of("audio-start")) == 1
    assert streamed.rate == JOE_RATE
    # Spoken once: as long as the same text said in one request (twice would double it).
    ratio = streamed.pcm.size / whole.pcm.size
    assert 0.85 < ratio < 1.2, ratio


def test_streaming_speaks_a_sentence_before_the_text_ends(running: Running) -> None:
    """The first sentence's audio arrives while the client has not finished the text."""

    async def run() -> tuple[list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", running.port) as client:
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="joe")).event())
            await client.write_event(SynthesizeChunk(text="Good morning. The weath").event())
            early, _, _ = await _read_until(client.read_event, ("audio-chunk",), 0.0)
            for event in stream_events("joe", ["er is fine."])[1:]:
                await client.write_event(event)
            rest, _, _ = await _read_until(client.read_event, ("synthesize-stopped",), 0.0)
            return early, rest

    early, rest = asyncio.run(run())
    assert [e.type for e in early] == ["audio-start", "audio-chunk"]
    assert rest[-1].type == "synthesize-stopped"
    assert not [e for e in rest if e.type in ("error", "audio-start")]


def test_streaming_without_chunks_speaks_the_whole_synthesize(running: Running) -> None:
    events = [
        SynthesizeStart().event(),
        Synthesize(text="Only the full text.").event(),
        SynthesizeStop().event(),
    ]
    answer = exchange(running.port, *events, ends=("synthesize-stopped", "error"))
    assert answer.events[-1].type == "synthesize-stopped"
    assert answer.pcm.size > JOE_RATE // 2


# -- the pipeline's cache, tiers and counters -------------------------------------------------


def test_a_repeat_is_served_from_the_cache(running: Running, synth: Synthesizer) -> None:
    text = "The garage door has been open for ten minutes."
    first = exchange(running.port, say(text))
    before = synth.cache.stats()
    second = exchange(running.port, say(text))
    after = synth.cache.stats()
    assert after["hits"] == before["hits"] + 1
    assert after["misses"] == before["misses"]
    assert np.array_equal(first.pcm, second.pcm)


def test_answers_are_counted(running: Running) -> None:
    quality, errors = running.answers("quality"), running.answers("error")
    exchange(running.port, say("Counted once."))
    exchange(running.port, say("Counted", voice="nobody"))
    assert running.answers("quality") == quality + 1
    assert running.answers("error") == errors + 1


def test_fast_tier_under_load(settings: Settings, synth: Synthesizer) -> None:
    """A budget that joe cannot meet routes its requests to its fast voice (heart)."""
    settings = settings.model_copy(
        update={"wyoming": settings.wyoming.model_copy(update={"port": free_port()})}
    )
    for served in _serve(settings, synth, budget_ms=1):
        answer = exchange(served.port, say("The dishwasher needs salt.", voice="joe"))
        assert answer.rate == HEART_RATE
        chunks = ["The laundry is dry. ", "The oven is hot."]
        streamed = exchange(
            served.port, *stream_events("joe", chunks), ends=("synthesize-stopped",)
        )
        assert streamed.rate == HEART_RATE
        # Every part of the stream in the first job's format (one voice, one rate).
        rates = {AudioChunk.from_event(e).rate for e in streamed.of("audio-chunk")}
        assert rates == {HEART_RATE}
        assert served.answers("fast") == 2


# -- bad input -------------------------------------------------------------------------------


BAD_REQUESTS: dict[str, tuple[list[Event], str]] = {
    "unknown voice": ([say("Hello.", voice="nobody")], "unknown_voice"),
    "unknown voice in a stream": (stream_events("nobody", ["Hello."]), "unknown_voice"),
    "unknown language": ([say("Hello.", language="xx")], "unsupported_language"),
    "empty text": ([say("")], "empty_text"),
    "blank text": ([say("   \n ")], "empty_text"),
    "nothing speakable": ([say("🙂🙂")], "nothing_speakable"),
    "text too long": ([say("word " * MAX_TEXT_CHARS)], "text_too_long"),
    "streamed text too long": (
        stream_events(None, ["Word. " * (MAX_TEXT_CHARS // 5)], whole=False),
        "text_too_long",
    ),
    "empty stream": (stream_events(None, [], whole=False), "empty_text"),
    # Refused once the raw stream passes limits.max_raw_text_bytes, though none of it counts
    # as text after cleaning.
    "streamed whitespace": (stream_events(None, [" " * 15_000] * 5, whole=False), "text_too_long"),
    "streamed invisible characters": (
        stream_events(None, ["\u200b" * 5_000] * 5, whole=False),
        "text_too_long",
    ),
    "no text": ([Event(type="synthesize", data={"voice": {"name": "joe"}})], "malformed_event"),
    "text not a string": ([Event(type="synthesize", data={"text": 5})], "malformed_event"),
    "voice not an object": (
        [Event(type="synthesize", data={"text": "Hi.", "voice": "joe"})],
        "malformed_event",
    ),
    "chunk outside a stream": ([SynthesizeChunk(text="Hello.").event()], "unexpected_event"),
    "stop outside a stream": ([SynthesizeStop().event()], "unexpected_event"),
    "two starts": ([SynthesizeStart().event(), SynthesizeStart().event()], "unexpected_event"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_is_refused_and_closed(running: Running, case: str) -> None:
    events, code = BAD_REQUESTS[case]
    answer = exchange(running.port, *events, ends=("error", "synthesize-stopped", "audio-stop"))
    assert answer.of("error"), answer.events
    assert answer.error.code == code
    assert answer.error.text
    assert answer.closed
    assert not answer.of("audio-chunk")
    assert_serves(running)


BAD_FRAMES: dict[str, tuple[bytes, str]] = {
    "not JSON": (b"this is not json\n", "malformed_event"),
    "no type": (b'{"data": {"text": "hi"}}\n', "malformed_event"),
    "type not a string": (b'{"type": 5}\n', "malformed_event"),
    "data not an object": (b'{"type": "synthesize", "data": [1]}\n', "malformed_event"),
    "negative length": (b'{"type": "synthesize", "data_length": -1}\n', "malformed_event"),
    "huge data": (b'{"type": "synthesize", "data_length": 100000000}\n', "event_too_large"),
    "data not JSON": (b'{"type": "synthesize", "data_length": 3}\nabc', "malformed_event"),
    "huge header": (b'{"type": "' + b"x" * 70_000 + b'"}\n', "event_too_large"),
    # Refused before json.loads, which would recurse once per level.
    "deep header": (
        b'{"type": "ping", "data": {"x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}}\n",
        "malformed_event",
    ),
    "deep data": (
        b'{"type": "ping", "data_length": 16006}\n{"x": ' + b"[" * 8_000 + b"]" * 8_000 + b"}",
        "malformed_event",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FRAMES))
def test_malformed_frame_is_refused_and_closed(running: Running, case: str) -> None:
    frame, code = BAD_FRAMES[case]
    answer = raw_exchange(running.port, frame)
    assert [e.type for e in answer.events] == ["error"]
    assert answer.error.code == code
    assert answer.closed
    assert_serves(running)


def test_a_ping_with_a_lone_surrogate_is_answered(running: Running) -> None:
    async def run() -> Event | None:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        try:
            writer.write(b'{"type": "ping", "data": {"text": "a\\ud800b"}}\n')
            await writer.drain()
            return await asyncio.wait_for(async_read_event(reader), TIMEOUT_S)
        finally:
            writer.close()

    pong = asyncio.run(run())
    assert pong is not None and pong.type == "pong"
    assert pong.data["text"] == "a\ud800b"
    assert_serves(running)


def test_client_leaving_mid_stream(running: Running) -> None:
    errors = running.answers("error")

    async def leave() -> None:
        async with AsyncTcpClient("127.0.0.1", running.port) as client:
            await client.write_event(SynthesizeStart().event())
            text = "This sentence is long enough to take a moment to say. And more. "
            await client.write_event(SynthesizeChunk(text=text).event())
            await client.read_event()  # its audio has started: leave in the middle

    asyncio.run(leave())
    assert_serves(running)
    deadline = time.monotonic() + 5
    while running.answers("error") == errors and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running.answers("error") == errors + 1


def test_unknown_events_are_ignored(running: Running) -> None:
    answer = exchange(running.port, Event(type="something-new", data={"x": 1}), say("Fine."))
    assert not answer.of("error") and answer.of("audio-stop")


# -- zeroconf and settings -------------------------------------------------------------------


def test_a_taken_port_is_logged_and_shown_not_served(
    settings: Settings, synth: Synthesizer, caplog: pytest.LogCaptureFixture
) -> None:
    from tts_bridge.web import status_page

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = settings.model_copy(
            update={"wyoming": settings.wyoming.model_copy(update={"port": port})}
        )
        router = TierRouter(600_000, 0.7)
        pipeline = Pipeline(busy, synth, Scheduler(1, 4), router, IdleWork(busy, synth))
        server = WyomingServer(busy, pipeline)
        with caplog.at_level("ERROR", logger="tts_bridge.wyoming.server"):
            server.start()
        try:
            assert not server.serving
            assert f"cannot listen on 127.0.0.1:{port}" in caplog.text
            state = status_page.wyoming_state(True, server.serving, port)
            assert state.startswith("not listening")
        finally:
            server.stop()


def test_announcement_record() -> None:
    settings = WyomingSettings(host="192.0.2.10", port=10300, zeroconf_name="kitchen_bridge")
    info = announcement(settings)
    assert info is not None
    assert info.type == SERVICE_TYPE == "_wyoming._tcp.local."
    assert info.name == "kitchen_bridge._wyoming._tcp.local."
    assert info.port == 10300
    assert info.parsed_addresses() == ["192.0.2.10"]
    default_name = announcement(WyomingSettings(host="192.0.2.10"))
    assert default_name is not None and default_name.name.startswith("tts_bridge.")


def test_record_registers_and_resolves_on_loopback() -> None:
    """Registration as the server does it, bound to loopback (nothing reaches the LAN)."""
    info = service_info("tts_bridge_test", 10299, ["127.0.0.1"])

    async def run() -> tuple[bool, int | None, list[str]]:
        zeroconf = await register(info)
        browser = AsyncZeroconf(interfaces=["127.0.0.1"])
        try:
            found = AsyncServiceInfo(SERVICE_TYPE, info.name)
            resolved = await found.async_request(browser.zeroconf, 3000)
            return resolved, found.port, found.parsed_addresses()
        finally:
            await zeroconf.async_unregister_all_services()
            await zeroconf.async_close()
            await browser.async_close()

    assert asyncio.run(run()) == (True, 10299, ["127.0.0.1"])


def test_no_announcement_when_off_or_on_loopback() -> None:
    assert announcement(WyomingSettings(host="192.0.2.10", zeroconf=False)) is None
    assert announcement(WyomingSettings(host="127.0.0.1")) is None


def test_server_on_loopback_announces_nothing(running: Running) -> None:
    assert running.server.announced is None


def test_wyoming_settings_defaults() -> None:
    defaults = load_settings(None, {}, environ={}).wyoming
    assert (defaults.enabled, defaults.host, defaults.port) == (True, "0.0.0.0", 10200)
    assert defaults.zeroconf and defaults.zeroconf_name is None
    env = load_settings(None, None, environ={"TTS_BRIDGE_WYOMING__PORT": "10300"})
    assert env.wyoming.port == 10300


def test_server_off(settings: Settings, synth: Synthesizer) -> None:
    off = settings.model_copy(
        update={
            "wyoming": settings.wyoming.model_copy(update={"enabled": False, "port": free_port()})
        }
    )
    scheduler = Scheduler(1, 4)
    pipeline = Pipeline(off, synth, scheduler, TierRouter(1500, 0.7), IdleWork(off, synth))
    server = WyomingServer(off, pipeline)
    server.start()
    assert not server.serving
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", off.wyoming.port), timeout=2).close()
    server.stop()


def test_port_in_use_leaves_the_bridge_running(running: Running, settings: Settings) -> None:
    clash = WyomingServer(settings, running.pipeline)  # the same port as `running`
    clash.start()
    assert not clash.serving
    clash.stop()
    assert_serves(running)


# -- pure helpers ----------------------------------------------------------------------------


def test_sentence_stream() -> None:
    stream = SentenceStream()
    assert stream.add("Hello there") == []
    assert stream.add(".") == []  # complete only once what follows shows it
    assert stream.add(" How are") == ["Hello there."]
    assert stream.add(" you? Dr. Smith") == ["How are you?"]  # "Dr." ends no sentence
    assert stream.add(" is in. ") == []
    assert stream.add("Bye") == ["Dr. Smith is in."]
    assert stream.finish() == "Bye"
    spaced = SentenceStream()
    assert spaced.add("One. ") == []
    assert spaced.add("Two. ") == ["One."]
    assert spaced.finish() == "Two."
    chinese = SentenceStream()
    assert chinese.add("你好。今天") == ["你好。"]
    assert chinese.finish() == "今天"


def test_choose_voice() -> None:
    voices = [
        VoiceEntry("joe", "", ("en",), "piper"),
        VoiceEntry("mei", "", ("en", "zh"), "chattts"),
    ]
    assert choose_voice(RequestedVoice(), voices, "joe") == ("joe", None)
    assert choose_voice(RequestedVoice(name="mei", language="de"), voices, "joe") == ("mei", None)
    assert choose_voice(RequestedVoice(language="zh_CN"), voices, "joe") == ("mei", "zh")
    assert choose_voice(RequestedVoice(language="EN"), voices, "joe") == ("joe", "en")
    with pytest.raises(WyomingRequestError) as unknown:
        choose_voice(RequestedVoice(name="bob"), voices, "joe")
    assert unknown.value.code == "unknown_voice"
    with pytest.raises(WyomingRequestError) as language:
        choose_voice(RequestedVoice(language="fr"), voices, "joe")
    assert language.value.code == "unsupported_language"


def test_info_event_round_trips(running: Running) -> None:
    event = running.server.info_event()
    assert json.loads(json.dumps(event.data))["tts"][0]["voices"]


# -- the bridge process ----------------------------------------------------------------------


def test_bridge_process_serves_wyoming(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    """`tts-bridge run` starts the Wyoming server with the MQTT bridge, on one pipeline: a
    Wyoming answer is counted in the bridge's health, next to the MQTT answers."""
    bridge = bridge_factory(scheduler={"idle_enabled": False})
    port = int(bridge.config["wyoming"]["port"])
    probe = probe_factory(f"{BASE_TOPIC}/#")
    probe.diagnostics = bridge.log_tail
    answer = exchange(port, say("The bridge speaks Wyoming."))
    assert answer.rate == JOE_RATE and answer.pcm.size > JOE_RATE // 2
    streamed = exchange(
        port, *stream_events("heart", ["Over ", "the stream."]), ends=("synthesize-stopped",)
    )
    assert streamed.rate == HEART_RATE and streamed.events[-1].type == "synthesize-stopped"
    health = bridge_api(probe, "health_check", timeout=TIMEOUT_S)
    assert health["data"]["answers"]["quality"] == 2, health["data"]["answers"]


def test_a_streamed_ssml_document_is_spoken_whole() -> None:
    stream = SentenceStream()
    assert stream.add("<speak>One. Two.") == []
    assert stream.add(' <break time="1s"/> Three. ') == []
    assert stream.add("Four.</speak>") == []
    assert stream.finish() == '<speak>One. Two. <break time="1s"/> Three. Four.</speak>'
    # With text_format ssml the document need not start with <speak> to be kept whole.
    declared = SentenceStream(whole=True)
    assert declared.add("One. Two. Three.") == []
