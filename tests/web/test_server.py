"""The HTTP audio server with real HTTP clients on a free loopback port: GET, HEAD, ranges, 404s,
path tricks, expiry, stable URLs and concurrent requests."""

from __future__ import annotations

import html
import io
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt
import pytest
import soundfile

from tests.support.fake import BASE, Services, body
from tests.support.web import raw_request
from tts_bridge import app
from tts_bridge.audio.formats import AudioFormat
from tts_bridge.config import load_settings
from tts_bridge.web import status_page
from tts_bridge.web.audio_store import AudioStore
from tts_bridge.web.server import AudioServer
from tts_bridge.web.settings import HttpSettings

RATE = 22050


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000.0

    def __call__(self) -> float:
        return self.now


def _tone(seconds: float = 1.0, hz: float = 330.0) -> npt.NDArray[np.int16]:
    t = np.arange(round(seconds * RATE)) / RATE
    return np.asarray(np.sin(2 * np.pi * hz * t) * 10000, dtype=np.int16)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(tmp_path: Path, clock: Clock) -> Iterator[AudioServer]:
    store = AudioStore(tmp_path / "audio", tmp_path / "state" / "http.key", 10_000_000, clock)
    settings = HttpSettings(host="127.0.0.1", port=0, ttl_s=600)
    audio_server = AudioServer(settings, store, clock)
    audio_server.start()
    yield audio_server
    audio_server.stop()


def _request(
    server: AudioServer, method: str, target: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    return raw_request(server.port, method, target, headers)


def _path(url: str) -> str:
    return urlsplit(url).path


def test_get_serves_the_encoded_audio_with_its_type_and_length(server: AudioServer) -> None:
    published = server.publish(_tone(1.5), RATE, AudioFormat("mp3", 44100))
    assert published.url.startswith(f"http://127.0.0.1:{server.port}/audio/")
    assert published.url.endswith(".mp3")
    status, headers, body = _request(server, "GET", _path(published.url))
    assert status == 200
    assert headers["Content-Type"] == "audio/mpeg"
    assert headers["Accept-Ranges"] == "bytes"
    assert int(headers["Content-Length"]) == len(body) == published.bytes
    audio, rate = soundfile.read(io.BytesIO(body))
    assert rate == 44100
    assert audio.shape[0] == round(1.5 * 44100)
    assert published.duration_ms == 1500


def test_head_gives_the_headers_without_a_body(server: AudioServer) -> None:
    published = server.publish(_tone(), RATE, AudioFormat("flac"))
    status, headers, body = _request(server, "HEAD", _path(published.url))
    assert status == 200
    assert body == b""
    assert headers["Content-Type"] == "audio/flac"
    assert int(headers["Content-Length"]) == published.bytes
    assert headers["Accept-Ranges"] == "bytes"


def test_validators_are_stable_and_never_in_the_future(server: AudioServer, clock: Clock) -> None:
    published = server.publish(_tone(), RATE, AudioFormat("wav"))
    status, headers, _ = _request(server, "GET", _path(published.url))
    assert status == 200
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Server"] == "tts_bridge"  # no version banner
    etag = headers["ETag"]
    # Last-Modified is when the audio was made (here: the server's clock), not its expiry.
    made = parsedate_to_datetime(headers["Last-Modified"]).timestamp()
    assert made <= clock.now
    clock.now += 60
    again = server.publish(_tone(), RATE, AudioFormat("wav"))  # pushes the expiry back
    assert again.url == published.url
    _, headers, _ = _request(server, "GET", _path(published.url))
    assert headers["ETag"] == etag
    status, headers, body = _request(server, "GET", _path(published.url), {"If-None-Match": etag})
    assert status == 304 and body == b""
    assert headers["ETag"] == etag
    status, _, _ = _request(server, "GET", _path(published.url), {"If-None-Match": '"other"'})
    assert status == 200
    other = server.publish(_tone(hz=440.0), RATE, AudioFormat("wav"))
    _, headers, _ = _request(server, "GET", _path(other.url))
    assert headers["ETag"] != etag


def test_ranges_first_bytes_suffix_and_unsatisfiable(server: AudioServer) -> None:
    published = server.publish(_tone(), RATE, AudioFormat("wav"))
    _, _, whole = _request(server, "GET", _path(published.url))
    size = len(whole)
    assert whole[:4] == b"RIFF"

    status, headers, body = _request(server, "GET", _path(published.url), {"Range": "bytes=0-99"})
    assert status == 206
    assert body == whole[:100]
    assert headers["Content-Range"] == f"bytes 0-99/{size}"
    assert headers["Content-Length"] == "100"
    assert headers["Content-Type"] == "audio/wav"

    status, headers, body = _request(server, "GET", _path(published.url), {"Range": "bytes=-64"})
    assert status == 206
    assert body == whole[-64:]
    assert headers["Content-Range"] == f"bytes {size - 64}-{size - 1}/{size}"

    status, headers, body = _request(server, "GET", _path(published.url), {"Range": "bytes=100-"})
    assert (status, body) == (206, whole[100:])

    status, headers, _ = _request(
        server, "GET", _path(published.url), {"Range": f"bytes={size + 10}-"}
    )
    assert status == 416
    assert headers["Content-Range"] == f"bytes */{size}"


def test_unknown_tokens_and_other_paths_are_404(server: AudioServer) -> None:
    published = server.publish(_tone(), RATE, AudioFormat("mp3"))
    token = published.token
    for target in [
        "/audio/" + "A" * 32 + ".mp3",  # well-formed, unknown
        f"/audio/{token}.wav",  # known token, another format
        f"/audio/{token}.txt",
        f"/audio/{token}",
        f"/audio/{token[:-1]}.mp3",
        f"/audio/{token}x.mp3",
        f"/audio/{token}.mp3/",
        "/",
        "/audio/",
        f"/{token}.mp3",
    ]:
        status, _, _ = _request(server, "GET", target)
        assert status == 404, target
    status, _, _ = _request(server, "POST", _path(published.url))
    assert status == 405


def test_path_tricks_are_refused(server: AudioServer, tmp_path: Path) -> None:
    secret_file = tmp_path / "state" / "http.key"
    secret = secret_file.read_bytes()
    published = server.publish(_tone(), RATE, AudioFormat("mp3"))
    (server.store.directory / "notes.mp3").write_bytes(b"not audio")  # a file that is no token
    for target in [
        "/audio/../state/http.key",
        "/audio/..%2fstate%2fhttp.key",
        "/audio/%2e%2e/%2e%2e/state/http.key",
        "/audio/%2e%2e%2f%2e%2e%2fstate%2fhttp.key",
        "/audio/..%5c..%5cstate%5chttp.key",
        f"/audio/{published.token}.mp3%00.key",
        f"/audio/%2F{published.token}.mp3",
        "/audio/" + str(secret_file).replace("/", "%2F"),
        "/audio//etc/passwd",
        "/audio/notes.mp3",
        "/audio/.part-0000.mp3",
        f"http://127.0.0.1:{server.port}/audio/../state/http.key",
        "//etc/passwd",
    ]:
        status, _, body = _request(server, "GET", target)
        assert status in (400, 404), target
        assert secret not in body and b"not audio" not in body and b"root:" not in body


def test_the_same_audio_in_the_same_format_keeps_its_url(server: AudioServer) -> None:
    fmt = AudioFormat("mp3")
    first = server.publish(_tone(), RATE, fmt)
    again = server.publish(_tone(), RATE, fmt)
    assert again.url == first.url
    assert first.encoded and not again.encoded  # served from the store, not encoded twice
    assert again.bytes == first.bytes
    # A content key names the audio without hashing it (the cache's keys, for example).
    keyed = server.publish(_tone(), RATE, fmt, key="sentence-1")
    assert keyed.url == server.publish(_tone(2.0), RATE, fmt, key="sentence-1").url
    assert keyed.url != first.url


def test_other_audio_or_another_format_gets_another_url(server: AudioServer) -> None:
    base = server.publish(_tone(), RATE, AudioFormat("mp3"))
    urls = {
        base.url,
        server.publish(_tone(hz=440.0), RATE, AudioFormat("mp3")).url,
        server.publish(_tone(), RATE, AudioFormat("mp3", 44100)).url,
        server.publish(_tone(), RATE, AudioFormat("mp3", None, 2)).url,
        server.publish(_tone(), RATE, AudioFormat("opus")).url,
        server.publish(_tone(), RATE, AudioFormat("flac")).url,
    }
    assert len(urls) == 6
    tokens = {urlsplit(u).path.rsplit("/", 1)[1].split(".")[0] for u in urls}
    assert len(tokens) == 6
    assert all(len(t) == 32 for t in tokens)  # 192 bits


def test_urls_survive_a_restart_and_differ_between_installs(tmp_path: Path, clock: Clock) -> None:
    key = tmp_path / "state" / "http.key"
    settings = HttpSettings(host="127.0.0.1", port=0)
    first = AudioServer(settings, AudioStore(tmp_path / "a", key, 10**7, clock), clock)
    url = first.publish(_tone(), RATE, AudioFormat("mp3")).url
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    second = AudioServer(settings, AudioStore(tmp_path / "a", key, 10**7, clock), clock)
    republished = second.publish(_tone(), RATE, AudioFormat("mp3"))
    assert _path(republished.url) == _path(url)
    assert not republished.encoded
    other_install = AudioStore(tmp_path / "b", tmp_path / "other.key", 10**7, clock)
    assert other_install.token("k", AudioFormat("mp3")) != second.store.token(
        "k", AudioFormat("mp3")
    )


def test_audio_expires_and_republishing_brings_the_same_url_back(
    server: AudioServer, clock: Clock
) -> None:
    published = server.publish(_tone(), RATE, AudioFormat("mp3"), ttl_s=60)
    clock.now += 59
    assert _request(server, "GET", _path(published.url))[0] == 200
    clock.now += 2
    assert _request(server, "HEAD", _path(published.url))[0] == 404
    assert not any(server.store.directory.iterdir())  # the expired file went too
    again = server.publish(_tone(), RATE, AudioFormat("mp3"), ttl_s=60)
    assert again.url == published.url and again.encoded
    assert _request(server, "GET", _path(again.url))[0] == 200


def test_republishing_pushes_the_expiry_back(server: AudioServer, clock: Clock) -> None:
    published = server.publish(_tone(), RATE, AudioFormat("mp3"), ttl_s=60)
    clock.now += 50
    server.publish(_tone(), RATE, AudioFormat("mp3"), ttl_s=60)
    clock.now += 50
    status, headers, _ = _request(server, "GET", _path(published.url))
    assert status == 200
    assert headers["Cache-Control"] == "private, max-age=10"


def test_the_folder_stays_within_its_bound(tmp_path: Path, clock: Clock) -> None:
    store = AudioStore(tmp_path / "a", tmp_path / "k", 60_000, clock)
    server = AudioServer(HttpSettings(host="127.0.0.1", port=0), store, clock)
    urls = []
    for i in range(12):  # about 18 KB of WAV each
        clock.now += 1
        urls.append(server.publish(_tone(0.4, hz=200.0 + i), RATE, AudioFormat("wav")).url)
    store.sweep()
    kept = [p for p in store.directory.iterdir()]
    assert sum(p.stat().st_size for p in kept) <= 60_000
    names = {p.name for p in kept}
    # The newest (expiring last) stay; the oldest went first.
    assert _path(urls[-1]).rsplit("/", 1)[1] in names
    assert _path(urls[0]).rsplit("/", 1)[1] not in names


def test_concurrent_requests_and_publishes(server: AudioServer) -> None:
    published = [server.publish(_tone(hz=300.0 + i), RATE, AudioFormat("mp3")) for i in range(4)]
    expected = {p.url: p.bytes for p in published}

    def fetch(i: int) -> tuple[str, int, int]:
        url = published[i % 4].url
        headers = {"Range": "bytes=0-511"} if i % 3 == 0 else {}
        status, _, body = _request(server, "GET", _path(url), headers)
        return url, status, len(body)

    def publish(i: int) -> str:
        return server.publish(_tone(hz=300.0 + i % 4), RATE, AudioFormat("mp3")).url

    with ThreadPoolExecutor(max_workers=8) as pool:
        fetched = list(pool.map(fetch, range(48)))
        republished = list(pool.map(publish, range(16)))
    for i, (url, status, length) in enumerate(fetched):
        if i % 3 == 0:
            assert (status, length) == (206, 512)
        else:
            assert (status, length) == (200, expected[url])
    assert set(republished) == set(expected)


def test_bad_requests_do_not_stop_the_server(server: AudioServer) -> None:
    published = server.publish(_tone(), RATE, AudioFormat("mp3"))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"GARBAGE \x00\xff nonsense\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.")  # 400, then closed
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        raw.sendall(b"GET /audio/x HTTP/1.1\r\n")  # a client that goes away mid-request
    status, _, _ = _request(server, "GET", _path(published.url), {"Range": "bytes=zz"})
    assert status in (200, 416)
    assert _request(server, "GET", _path(published.url))[0] == 200


def test_lifecycle_bind_errors_and_restart(tmp_path: Path) -> None:
    store = AudioStore(tmp_path / "a", tmp_path / "k", 10**7)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = AudioServer(HttpSettings(host="127.0.0.1", port=port), store)
        with pytest.raises(OSError):
            busy.start()
    server = AudioServer(HttpSettings(host="127.0.0.1", port=0), store)
    server.start()
    url = server.publish(_tone(), RATE, AudioFormat("wav")).url
    assert _request(server, "GET", _path(url))[0] == 200
    server.stop()
    server.stop()  # idempotent
    assert not [t for t in threading.enumerate() if t.name == "http-audio"]
    server.start()
    assert _request(server, "GET", _path(url))[0] == 200
    server.stop()


def test_base_url_from_settings_or_the_bound_address(tmp_path: Path) -> None:
    store = AudioStore(tmp_path / "a", tmp_path / "k", 10**7)
    fixed = AudioServer(HttpSettings(base_url="https://tts.home.example/sub/"), store)
    assert fixed.url_for("T" * 32, AudioFormat("opus")) == (
        "https://tts.home.example/sub/audio/" + "T" * 32 + ".opus"
    )
    lan = AudioServer(HttpSettings(host="0.0.0.0", port=10201), store)
    host = urlsplit(lan.base_url).hostname
    assert host is not None and host != "0.0.0.0"
    assert urlsplit(lan.base_url).port == 10201


def test_from_settings_puts_files_in_the_cache_and_the_key_in_the_state_folder(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        overrides={
            "cache": {"dir": str(tmp_path / "cache")},
            "journal": {"path": str(tmp_path / "state" / "journal.sqlite3")},
            "http": {"host": "127.0.0.1", "port": 0},
        },
        environ={},
    )
    server = AudioServer.from_settings(settings)
    assert server.store.directory == tmp_path / "cache" / "http"
    assert (tmp_path / "state" / "http.key").stat().st_size >= 32
    published = server.publish(_tone(), RATE)
    assert published.format == AudioFormat("mp3", 44100)  # http.format's default
    assert os.path.exists(server.store.directory / f"{published.token}.mp3")


# -- the status page at / (the service's, in process) ------------------------------------------


def _audio_server(service: app.Service) -> AudioServer:
    return next(s for s in service.servers if isinstance(s, AudioServer))


@pytest.mark.parametrize(
    ("ui", "path"),
    [("off", "/"), ("read-only", "/status")],
    ids=["at / without the web UI", "as the web UI's Status section"],
)
def test_the_status_page_shows_voices_and_health_but_no_url(
    services: Services, ui: str, path: str
) -> None:
    service, conn = services(scheduler={"idle_enabled": False}, http={"ui": ui})
    server = _audio_server(service)
    since = conn.mark()
    conn.deliver(f"{BASE}/say/kitchen", json.dumps({"text": "Secret words here.", "id": "s1"}))
    answer = body(conn.wait_for(lambda m: m.topic == f"{BASE}/bridge/response/say", since=since))
    token = _path(answer["data"]["url"]).rsplit("/", 1)[1].split(".")[0]

    status, headers, page = _request(server, "GET", path)
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    text = page.decode()
    catalog = service.pipeline.voices()
    for voice in catalog.voices:
        assert f"<td>{html.escape(voice.name)}" in text, voice.name
    assert f"<b>{html.escape(catalog.default_voice)}</b>" in text
    assert "Queue depth" in text and "Cache hit rate" in text
    assert "Wyoming: off" in text  # wyoming.enabled is false on fake connections
    for secret in (token, "/audio/", "Secret words"):
        assert secret not in text, secret

    status, headers, empty = _request(server, "HEAD", path)
    assert (status, empty) == (200, b"")
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert _request(server, "GET", "/index.html")[0] == 404


def test_the_status_page_escapes_what_it_shows() -> None:
    page = status_page.render(
        "<b>bridge</b>",
        {
            "version": "1.0",
            "default_voice": "a&b",
            "voices": {"a&b": {"engine": "piper", "description": "<script>x</script>"}},
        },
        {"queue_depth": 2, "cache_hit_rate": 0.5, "tier_in_use": "<i>"},
        status_page.wyoming_state(enabled=True, serving=True, port=10200),
    )
    assert "<script>" not in page and "<b>bridge</b>" not in page and "<i>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page
    assert "<td>a&amp;b (default)</td>" in page
    assert "<td>50%</td>" in page and "<td>2</td>" in page
    assert "Wyoming: port 10200" in page


def test_the_status_page_shows_counts_per_tier_as_words() -> None:
    health = {"answers": {"quality": 3, "fast": 0, "<x>": 1}}
    page = status_page.render("bridge", {}, health, "off")
    assert "<td>quality: 3, &lt;x&gt;: 1</td>" in page, page
    assert "{" not in page
    assert "<td>none</td>" in status_page.render("bridge", {}, {"answers": {"fast": 0}}, "off")


def test_the_status_page_says_when_the_wyoming_port_could_not_be_opened() -> None:
    assert status_page.wyoming_state(enabled=False, serving=False, port=10200) == "off"
    assert status_page.wyoming_state(enabled=True, serving=True, port=10200) == "port 10200"
    state = status_page.wyoming_state(enabled=True, serving=False, port=10200)
    assert "not listening" in state and "10200" in state
    page = status_page.render("bridge", {}, {}, state)
    assert "Wyoming: not listening" in page
