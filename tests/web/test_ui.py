"""The web UI's doors and rules over real HTTP, on the real service in process (real voices,
pipeline and HTTP server on a free loopback port; a fake MQTT connection): who may look and
change, the Origin and ingress checks, http.ui, and that no request text is logged."""

from __future__ import annotations

import http.client
import io
import json
import logging
import threading
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import pytest
import soundfile

from tests.support.fake import Services
from tests.web.ui_browser import send
from tts_bridge import app
from tts_bridge.web import ui_pages
from tts_bridge.web.server import AudioServer
from tts_bridge.web.ui import WebUi
from tts_bridge.web.ui_access import SUPERVISOR_ADDRESS

FORM = "application/x-www-form-urlencoded"


def _server(service: app.Service) -> AudioServer:
    return next(s for s in service.servers if isinstance(s, AudioServer))


def _post(
    server: AudioServer, path: str, form: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    own = {"Origin": f"http://127.0.0.1:{server.port}", "Content-Type": FORM}
    return send(server.port, "POST", path, {**own, **(headers or {})}, form.encode())


def test_ingress_is_believed_from_the_supervisor_only(services: Services) -> None:
    assert SUPERVISOR_ADDRESS == "172.30.32.2"  # Home Assistant's hassio network
    service, _ = services(http={"ui": "on"})
    server = _server(service)
    ui = next(r for r in server.routes if isinstance(r, WebUi))
    assert ui.access.ingress_peers == {SUPERVISOR_ADDRESS}
    ingress = {"X-Ingress-Path": "/api/hassio_ingress/abc"}
    assert send(server.port, "GET", "/", ingress)[0] == 403
    assert _post(server, "/ui/cache/clear", "", ingress)[0] == 403
    assert send(server.port, "GET", "/")[0] == 200  # the LAN without the header: no keys, on


def test_with_ui_off_the_status_page_is_at_the_root_and_no_page_changes_anything(
    services: Services,
) -> None:
    service, _ = services(http={"ui": "off"})
    server = _server(service)
    status, _, page = send(server.port, "GET", "/")
    assert status == 200 and b"<h2>Health</h2>" in page and b"ui/speak" not in page
    for path in ("/voices", "/activity", "/ui/static/ui.js"):
        assert send(server.port, "GET", path)[0] == 404, path
    assert _post(server, "/ui/lexicon/set", "word=a&say=b")[0] == 404


def test_read_only_without_keys_speaks_but_changes_nothing(services: Services) -> None:
    service, _ = services()  # http.ui is read-only by default
    server = _server(service)
    status, _, page = send(server.port, "GET", "/pronunciations")
    assert status == 200 and b"Read-only" in page
    status, _, answer = _post(server, "/ui/lexicon/set", "word=Siobhan&say=shiv+awn")
    assert status == 403, answer
    assert all(e["word"] != "Siobhan" for e in service.api.control.lexicon()["entries"])

    status, _, answer = _post(server, "/ui/speak", "text=The+front+door+is+open.&voice=joe")
    assert status == 200, answer
    data = json.loads(answer)["data"]
    assert data["audio"].startswith("audio/") and data["voice"] == "joe"  # relative: ingress
    status, headers, wav = send(server.port, "GET", "/" + data["audio"])
    assert status == 200 and headers["Content-Type"] == "audio/wav"
    audio, rate = soundfile.read(io.BytesIO(wav))
    assert abs(len(audio) / rate * 1000 - data["duration_ms"]) <= 1


def test_on_without_keys_changes_and_says_anyone_can(services: Services) -> None:
    service, _ = services(http={"ui": "on"})
    server = _server(service)
    status, _, page = send(server.port, "GET", "/pronunciations")
    assert status == 200 and b"Anyone on your network" in page
    status, _, answer = _post(server, "/ui/lexicon/set", "word=Siobhan&say=shiv+awn&phonemes=")
    assert status == 200, answer
    assert json.loads(answer)["data"]["say"] == "shiv awn"
    # A page of another site posting the same is refused, whatever the UI's mode.
    status, _, _ = _post(server, "/ui/lexicon/remove", "word=Siobhan", {"Origin": "http://x.y"})
    assert status == 403
    assert any(e["word"] == "Siobhan" for e in service.api.control.lexicon()["entries"])


def test_a_refusal_is_json_with_its_code(services: Services) -> None:
    service, _ = services(http={"ui": "on"})
    server = _server(service)
    status, _, answer = _post(server, "/ui/speak", "text=Hello.&voice=nobody")
    assert status == 400
    assert json.loads(answer)["error"]["code"] == "unknown_voice"
    status, _, answer = _post(server, "/ui/lexicon/remove", "word=never-set")
    assert status == 400
    assert json.loads(answer)["error"]["code"] == "invalid_request"
    status, _, answer = _post(server, "/ui/speak", "text=" + "a" * 70_000)
    assert status == 400
    assert json.loads(answer)["error"]["code"] == "payload_too_large"


def test_no_request_text_is_logged(services: Services, caplog: pytest.LogCaptureFixture) -> None:
    service, _ = services(http={"ui": "on"})
    server = _server(service)
    secret = "Quokka marmalade sandwiches"
    with caplog.at_level(logging.DEBUG):
        assert _post(server, "/ui/speak", f"text={secret}.&voice=joe")[0] == 200
        assert _post(server, "/ui/speak", f"text={secret}&voice=nobody")[0] == 400
    web_lines = [r.getMessage() for r in caplog.records if r.name.startswith("tts_bridge.web")]
    assert web_lines  # the refusal is logged, with its code
    assert not [line for line in web_lines if "Quokka" in line]
    # Nor anything the bridge's own modules say, nor any library at the usual level (Piper's
    # own debug line names the text it phonemizes: a debug log is the owner's choice).
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("tts_bridge") or r.levelno >= logging.INFO
    ]
    assert said and not [line for line in said if "Quokka" in line]


def _multipart(fields: dict[str, str], filename: str, data: bytes) -> tuple[str, bytes]:
    boundary = "----tts-bridge-test-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    return f"multipart/form-data; boundary={boundary}", b"".join(
        parts
    ) + f"--{boundary}--\r\n".encode()


def test_a_chime_larger_than_a_form_usually_is_uploaded_and_a_huge_one_refused(
    services: Services, tmp_path: Path
) -> None:
    service, _ = services(http={"ui": "on"}, chimes={"dir": str(tmp_path / "chimes")})
    server = _server(service)
    rate = 48000
    t = np.arange(6 * rate) / rate
    stereo = np.stack([np.sin(2 * np.pi * 660 * t)] * 2, axis=1) * 0.4
    buffer = io.BytesIO()
    soundfile.write(buffer, stereo, rate, format="WAV", subtype="PCM_16")
    wav = buffer.getvalue()
    assert len(wav) > 2**20  # past aiohttp's own limit for a whole form
    kind, body = _multipart({"name": "long_bell"}, "long_bell.wav", wav)
    origin = f"http://127.0.0.1:{server.port}"
    headers = {"Origin": origin, "Content-Type": kind}
    status, _, answer = send(server.port, "POST", "/ui/chimes/upload", headers, body)
    assert status == 200, answer
    assert json.loads(answer)["data"]["source"] == "long_bell.wav"
    assert (tmp_path / "chimes" / "long_bell.wav").read_bytes() == wav
    names = [c["name"] for c in service.api.control.chimes()["chimes"]]
    assert "long_bell" in names

    kind, body = _multipart({"name": "huge"}, "huge.wav", wav * 4)
    headers = {"Origin": origin, "Content-Type": kind}
    status, _, answer = send(server.port, "POST", "/ui/chimes/upload", headers, body)
    assert status == 400 and json.loads(answer)["error"]["code"] == "payload_too_large"
    assert not (tmp_path / "chimes" / "huge.wav").exists()


def test_ssml_is_spoken_and_the_default_voice_is_set(services: Services) -> None:
    service, _ = services(http={"ui": "on"})
    server = _server(service)
    ssml = "<speak>The door is open.<break time='400ms'/>Please close it.</speak>"
    status, _, answer = _post(server, "/ui/speak", urlencode({"text": ssml, "voice": "joe"}))
    assert status == 200, answer
    data = json.loads(answer)["data"]
    assert data["sentences"] == 2 and data["sentence_voices"] == ["joe", "joe"]
    status, _, answer = _post(server, "/ui/voices/default", "voice=heart")
    assert status == 200, answer
    assert service.pipeline.voices().default_voice == "heart"
    status, _, page = send(server.port, "GET", "/voices")
    assert b"heart (default)" in page


def test_an_open_activity_stream_follows_and_ends_when_the_bridge_stops(
    services: Services,
) -> None:
    service, _ = services(http={"ui": "on"})
    server = _server(service)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
    conn.request("GET", "/ui/events")
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    first = response.read1(4096).decode()
    while "event: state" not in first:
        first += response.read1(4096).decode()
    state = json.loads(first.split("event: state\ndata: ", 1)[1].split("\n", 1)[0])
    assert state["connected"] is True and state["status"] == "ok"
    assert set(state["queue_lanes"]) == {"quality", "fast"}

    # A request on a page arrives on the stream as it happens, without its text.
    assert _post(server, "/ui/speak", "text=Marmalade+toast.&voice=joe")[0] == 200
    seen = ""
    while "event: request" not in seen:
        seen += response.read1(4096).decode()
    entry = json.loads(seen.split("event: request\ndata: ", 1)[1].split("\n", 1)[0])
    assert entry["door"] == "web" and entry["status"] == "ok" and entry["voice"] == "joe"
    assert "Marmalade" not in seen

    # Stopping the bridge ends the stream (the server does not wait on the open page).
    stopper = threading.Thread(target=service.stop)
    stopper.start()
    while response.read1(4096):
        pass
    stopper.join(20)
    assert not stopper.is_alive()
    conn.close()


def test_an_open_speech_api_is_said_once_at_start(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """The speech API and the web UI read the same keys: the warning is the API's, once."""
    with caplog.at_level(logging.INFO, logger="tts_bridge"):
        services(http={"ui": "on"})
    said = [r for r in caplog.records if "takes no key" in r.getMessage()]
    assert len(said) == 1


def test_the_cache_hit_rate_reads_as_a_percentage() -> None:
    page = ui_pages.phrases_page([], {"entries": 4, "bytes": 10, "hit_rate": 0.25}, True)
    assert "<dt>Hit rate</dt><dd>25%</dd>" in page
    assert "<dt>Entries</dt><dd>4</dd>" in page
