"""A real bridge in this process (real voices, pipeline, MQTT to a private mosquitto, HTTP on a
free loopback port) and Debian's chromium driven by selenium through /usr/bin/chromedriver
(nothing is downloaded), for the web UI's browser tests."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import pytest
from aiohttp import ClientSession, web
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.fake import settings_for
from tts_bridge import app
from tts_bridge.bench.localbroker import LocalBroker, free_port
from tts_bridge.web.server import AudioServer
from tts_bridge.web.ui import WebUi

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
KEY = "kitchen-key-for-tests"
WAIT_S = 60.0
SCREENSHOTS = os.environ.get("TTS_BRIDGE_UI_SCREENSHOTS")
"""A folder: the tests then save a screenshot of each page there (desktop and phone width)."""

needs_browser = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="chromium and chromium-driver are not installed (script/setup --dev installs them)",
)


@dataclass
class UiBridge:
    service: app.Service
    broker: LocalBroker
    base: str
    port: int
    ui: WebUi
    tmp: Path

    def url(self, path: str = "") -> str:
        return f"{self.base}/{path}"


def start_bridge(
    tmp: Path, more: dict[str, Any] | None = None, **http: Any
) -> tuple[app.Service, LocalBroker]:
    """`more`: other settings (a Wyoming server, targets, Home Assistant)."""
    broker = LocalBroker(tmp / "broker")
    broker.start()
    settings = settings_for(
        tmp,
        {
            "mqtt": {"host": broker.host, "port": broker.port},
            "http": {"host": "127.0.0.1", "port": 0, **http},
            "chimes": {"dir": str(tmp / "chimes")},
            "voices_file": str(tmp / "voices.yaml"),
            "phrases": ["The front door is open."],
            **(more or {}),
        },
    )
    service = app.build(settings)
    service.start()
    deadline = time.monotonic() + WAIT_S
    # Subscribed, not only connected: a QoS 0 request sent before the SUBACK can be dropped.
    while not service.outbox.subscribed:
        if time.monotonic() > deadline:
            service.stop()
            broker.stop()
            raise AssertionError("the bridge did not connect to its broker")
        time.sleep(0.05)
    return service, broker


def ui_bridge(tmp: Path, more: dict[str, Any] | None = None, **http: Any) -> Iterator[UiBridge]:
    service, broker = start_bridge(tmp, more, **http)
    try:
        server = next(s for s in service.servers if isinstance(s, AudioServer))
        ui = next(r for r in server.routes if isinstance(r, WebUi))
        yield UiBridge(service, broker, f"http://127.0.0.1:{server.port}", server.port, ui, tmp)
    finally:
        service.stop()
        broker.stop()


def chromium(profile: Path) -> Iterator[WebDriver]:
    """One headless chromium, its profile fresh, its console logged for the tests to read."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--autoplay-policy=no-user-gesture-required",
        "--mute-audio",
        "--window-size=1280,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(WAIT_S)
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def send(
    port: int,
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request to the bridge on loopback, as a script (not the page) would send it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


class BridgeApiClient:
    """The MQTT bridge API asked from another process (mosquitto_rr, MQTT 5 request and
    response), so what a page changed is read back through the other door."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def ask(self, name: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        command = [
            "mosquitto_rr",
            "-h", self.host,
            "-p", str(self.port),
            "-t", f"tts_bridge/bridge/request/{name}",
            "-e", f"ui-test/response/{name}",
            "-m", json.dumps(payload or {}),
            "-W", str(int(WAIT_S)),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, check=True, timeout=WAIT_S + 5)
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer


def console_errors(driver: WebDriver) -> list[str]:
    """The console's errors since the last call (reading them empties the browser's log)."""
    lines = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return [str(x["message"]) for x in lines if x["level"] == "SEVERE"]


# What chromedriver says when an element is read while the page that held it is being replaced
# (a form's answer reloads the page): not stale yet, but not there either.
_REPLACED = (
    "does not belong to the document",
    "Execution context was destroyed",
    "Cannot find context with specified id",
)


def wait(driver: WebDriver, check: Callable[[WebDriver], Any], what: str) -> Any:
    """`check` until it is true; a page in the middle of reloading counts as not yet."""

    def settled(d: WebDriver) -> Any:
        try:
            return check(d)
        except (NoSuchElementException, StaleElementReferenceException):
            return False
        except WebDriverException as exc:
            if any(marker in str(exc.msg) for marker in _REPLACED):
                return False
            raise

    return WebDriverWait(driver, WAIT_S, 0.1).until(settled, what)


def text_of(driver: WebDriver, css: str) -> str:
    """The first matching element's text, read in one script, so no element handle can go
    stale between finding it and reading it ("" when nothing matches)."""
    found = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
    )
    return str(found)


def status_text(driver: WebDriver, form_id: str) -> str:
    return str(driver.find_element(By.ID, f"{form_id}-status").text)


def wait_done(driver: WebDriver, form_id: str) -> str:
    """The form's status line once it says Done or Refused."""
    return str(
        wait(
            driver,
            lambda d: (t := status_text(d, form_id)).startswith(("Done", "Refused")) and t,
            f"the answer to the {form_id} form",
        )
    )


def screenshot(driver: WebDriver, name: str, *, phone: bool = False) -> None:
    """Save the page (and, with `phone`, the page at a phone's width too) when screenshots
    were asked for."""
    if not SCREENSHOTS:
        return
    folder = Path(SCREENSHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    sizes = [("", 1280, False)] + ([("-phone", 390, True)] if phone else [])
    for suffix, width, mobile in sizes:
        metrics = {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        metrics["height"] = max(int(height), 600)
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        driver.save_screenshot(str(folder / f"{name}{suffix}.png"))
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


class _LoopbackSite:
    """An aiohttp application (`app()`) on a free loopback port, served by a thread of its own
    while the `with` block runs."""

    def __init__(self) -> None:
        self.port = free_port()
        self._ready = threading.Event()
        self._stop: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def app(self) -> web.Application:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._stop()
        self._thread.join(10)

    def _run(self) -> None:
        async def serve() -> None:
            runner = web.AppRunner(self.app(), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            stopped = asyncio.Event()
            loop = asyncio.get_running_loop()

            def stop() -> None:
                loop.call_soon_threadsafe(stopped.set)

            self._stop = stop
            self._ready.set()
            await stopped.wait()
            await runner.cleanup()

        asyncio.run(serve())


class IngressProxy(_LoopbackSite):
    """What Home Assistant's Supervisor does for ingress: the page at
    /api/hassio_ingress/<token>/..., forwarded to the bridge's / with X-Ingress-Path."""

    def __init__(self, target_port: int, token: str = "TOKEN") -> None:
        super().__init__()
        self.prefix = f"/api/hassio_ingress/{token}"
        self.target = f"http://127.0.0.1:{target_port}"

    def app(self) -> web.Application:
        async def forward(request: web.Request) -> web.StreamResponse:
            path = request.path.removeprefix(self.prefix) or "/"
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() in ("content-type", "cookie", "origin", "accept", "sec-fetch-site")
            }
            headers["X-Ingress-Path"] = self.prefix
            headers["X-Forwarded-Host"] = request.host
            body = await request.read()
            query = f"?{request.query_string}" if request.query_string else ""
            async with (
                ClientSession() as session,
                session.request(
                    request.method,
                    self.target + path + query,
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                ) as upstream,
            ):
                data = await upstream.read()
                kept = {
                    k: v
                    for k, v in upstream.headers.items()
                    if k.lower() in ("content-type", "cache-control", "location", "set-cookie")
                }
                return web.Response(status=upstream.status, body=data, headers=kept)

        proxy = web.Application()
        proxy.router.add_route("*", self.prefix + "/{tail:.*}", forward)
        return proxy

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}/{path}"


class OtherSite(_LoopbackSite):
    """Another site (http://localhost:<port>, not the bridge's 127.0.0.1) serving one page."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.page = page

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}/"

    def app(self) -> web.Application:
        async def page(request: web.Request) -> web.Response:
            return web.Response(text=self.page, content_type="text/html")

        site = web.Application()
        site.router.add_get("/", page)
        return site
