"""The web UI in a real browser: headless chromium (Debian's, driven through chromedriver) on a
real bridge with a real mosquitto; what the pages change is read back over the MQTT bridge API.

One bridge and one browser for the module; the tests run in order (sign in first)."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from selenium.webdriver import Chrome as WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.web.ui_browser import (
    KEY,
    BridgeApiClient,
    IngressProxy,
    OtherSite,
    UiBridge,
    chromium,
    console_errors,
    needs_browser,
    screenshot,
    send,
    text_of,
    ui_bridge,
    wait,
    wait_done,
)

pytestmark = [pytest.mark.slow, needs_browser]

PAGES = ("", "pronunciations", "voices", "chimes", "phrases", "activity", "status")


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiBridge]:
    yield from ui_bridge(tmp_path_factory.mktemp("ui"), ui="on", api_keys=[KEY])


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    yield from chromium(tmp_path_factory.mktemp("chromium"))


@pytest.fixture(scope="module")
def probe(bridge: UiBridge) -> BridgeApiClient:
    return BridgeApiClient(bridge.broker.host, bridge.broker.port)


def api(client: BridgeApiClient, name: str, payload: dict[str, Any] | None = None) -> Any:
    body = client.ask(name, payload)
    assert body["status"] == "ok", body
    return body["data"]


def open_page(browser: WebDriver, url: str) -> None:
    browser.get(url)
    wait(browser, lambda d: d.execute_script("return document.readyState") == "complete", url)


def fill(browser: WebDriver, element_id: str, text: str) -> None:
    field = browser.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def submit(browser: WebDriver, form_id: str) -> None:
    browser.find_element(By.CSS_SELECTOR, f"#{form_id} button[type=submit]").click()


def sign_in(browser: WebDriver, bridge: UiBridge, key: str) -> None:
    fill(browser, "login-key", key)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()


@pytest.fixture
def signed_in(bridge: UiBridge, browser: WebDriver) -> WebDriver:
    """The browser signed in with a key (the LAN with http.api_keys set)."""
    open_page(browser, bridge.url())
    if browser.current_url == bridge.url("login"):
        sign_in(browser, bridge, KEY)
        wait(browser, lambda d: d.current_url == bridge.url(), "the Speak page after signing in")
    console_errors(browser)  # what earlier pages left in the console is theirs
    return browser


def test_the_lan_asks_for_a_key(bridge: UiBridge, browser: WebDriver) -> None:
    browser.delete_all_cookies()
    open_page(browser, bridge.url("voices"))
    assert browser.current_url == bridge.url("login"), "a page without a session asks for a key"
    screenshot(browser, "login")
    sign_in(browser, bridge, "not the key")
    wait(browser, lambda d: "not one of" in d.page_source, "the refusal of a wrong key")
    assert browser.get_cookie("tts_bridge_session") is None
    sign_in(browser, bridge, KEY)
    wait(browser, lambda d: d.current_url == bridge.url(), "the Speak page after signing in")
    cookie = browser.get_cookie("tts_bridge_session")
    assert cookie is not None
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    # Signing out ends the session on the bridge, not only in this browser.
    browser.find_element(By.CSS_SELECTOR, ".signout button").click()
    wait(browser, lambda d: d.current_url == bridge.url("login"), "the sign-in page again")
    status, _, _ = send(
        bridge.port, "GET", "/voices", {"Cookie": f"tts_bridge_session={cookie['value']}"}
    )
    assert status == 303


def decoded_audio(browser: WebDriver) -> dict[str, float]:
    """The player's audio as the browser decodes it: its length, rate and loudness."""
    result: dict[str, float] = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const audio = document.getElementById("player");
        const ready = audio.readyState >= 1 ? Promise.resolve()
            : new Promise(r => audio.addEventListener("loadedmetadata", r, {once: true}));
        ready.then(() => fetch(audio.src)).then(r => r.arrayBuffer())
            .then(b => new OfflineAudioContext(1, 1, 44100).decodeAudioData(b))
            .then(buffer => {
                const data = buffer.getChannelData(0);
                let sum = 0;
                for (let i = 0; i < data.length; i++) { sum += data[i] * data[i]; }
                done({element: audio.duration, decoded: buffer.duration,
                      rate: buffer.sampleRate, rms: Math.sqrt(sum / data.length)});
            }).catch(e => done({error: String(e)}));
        """
    )
    assert "error" not in result, result
    return result


def fetch_decoded(browser: WebDriver, url: str) -> dict[str, float]:
    """A URL fetched by the page and decoded by the browser."""
    result: dict[str, float] = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch(arguments[0]).then(r => r.arrayBuffer())
            .then(b => new OfflineAudioContext(1, 1, 44100).decodeAudioData(b))
            .then(buffer => {
                const data = buffer.getChannelData(0);
                let sum = 0;
                for (let i = 0; i < data.length; i++) { sum += data[i] * data[i]; }
                done({decoded: buffer.duration, rms: Math.sqrt(sum / data.length)});
            }).catch(e => done({error: String(e)}));
        """,
        url,
    )
    assert "error" not in result, result
    return result


def test_every_page_opens_without_console_errors(signed_in: WebDriver, bridge: UiBridge) -> None:
    for page in PAGES:
        open_page(signed_in, bridge.url(page))
        assert signed_in.find_element(By.TAG_NAME, "h1").text
        # Every page's own stylesheet and script loaded (a relative URL that missed is a 404).
        assert signed_in.execute_script("return document.styleSheets[0].cssRules.length") > 10
        assert console_errors(signed_in) == [], page
        current = signed_in.find_elements(By.CSS_SELECTOR, "nav a[aria-current=page]")
        assert len(current) == 1, page


def test_speak_plays_the_answer_in_the_page(
    signed_in: WebDriver, bridge: UiBridge, tmp_path: Path
) -> None:
    browser = signed_in
    open_page(browser, bridge.url())
    fill(browser, "speak-text", "Dinner is ready.")
    Select(browser.find_element(By.ID, "speak-voice")).select_by_value("joe")
    submit(browser, "speak")
    assert wait_done(browser, "speak").startswith("Done"), browser.page_source
    details = browser.find_element(By.ID, "details").text
    assert "joe" in details and "Tier" in details and "Latency" in details
    played = decoded_audio(browser)

    # The same bytes, read outside the browser: the page played the whole answer.
    src = browser.find_element(By.ID, "player").get_attribute("src")
    assert src is not None and src.startswith(bridge.url("audio/"))
    status, _, wav = send(bridge.port, "GET", src.removeprefix(bridge.base))
    assert status == 200
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    seconds = len(samples) / rate
    assert 0.6 < seconds < 4.0, seconds  # "Dinner is ready." at a speaking pace
    assert abs(played["decoded"] - seconds) < 0.05, (played, seconds)
    assert abs(played["element"] - seconds) < 0.05, (played, seconds)
    assert played["rms"] > 0.02, played  # speech, not silence
    assert float(np.sqrt(np.mean(samples**2))) > 0.02
    download = browser.find_element(By.ID, "download")
    assert download.get_attribute("href") == src and download.is_displayed()
    assert console_errors(browser) == []
    screenshot(browser, "speak", phone=True)


def test_a_lexicon_entry_added_in_the_form_reaches_the_bridge_api(
    signed_in: WebDriver, bridge: UiBridge, probe: BridgeApiClient
) -> None:
    browser = signed_in
    open_page(browser, bridge.url("pronunciations"))
    fill(browser, "lex-word", "Siobhan")
    fill(browser, "lex-say", "shiv awn")
    submit(browser, "lexicon")
    wait(browser, lambda d: "shiv awn" in text_of(d, "table"), "the entry")
    entries = api(probe, "lexicon")["entries"]
    assert any(e["word"] == "Siobhan" and e["say"] == "shiv awn" for e in entries), entries

    # Edit it from its row: the form gets the entry, the change replaces it.
    browser.find_element(By.CSS_SELECTOR, "button[aria-label='Edit Siobhan']").click()
    assert browser.find_element(By.ID, "lex-word").get_attribute("value") == "Siobhan"
    assert browser.switch_to.active_element.get_attribute("id") == "lex-say"
    fill(browser, "lex-say", "shiv awn dear")
    submit(browser, "lexicon")
    wait(browser, lambda d: "shiv awn dear" in text_of(d, "table"), "edit")
    entries = api(probe, "lexicon")["entries"]
    assert [e["say"] for e in entries if e["word"] == "Siobhan"] == ["shiv awn dear"], entries

    # Hear the fix with another voice.
    fill(browser, "hear-text", "Siobhan is home.")
    Select(browser.find_element(By.ID, "hear-voice")).select_by_value("heart")
    submit(browser, "hear")
    assert wait_done(browser, "hear").startswith("Done: heart")
    assert decoded_audio(browser)["rms"] > 0.02
    assert console_errors(browser) == []
    screenshot(browser, "pronunciations", phone=True)


def test_a_voice_variant_is_added_and_removed(
    signed_in: WebDriver, bridge: UiBridge, probe: BridgeApiClient
) -> None:
    browser = signed_in
    open_page(browser, bridge.url("voices"))
    fill(browser, "variant-name", "joe_slow")
    Select(browser.find_element(By.ID, "variant-like")).select_by_value("joe")
    fill(browser, "variant-speed", "0.8")
    submit(browser, "variant")
    wait(browser, lambda d: "joe_slow" in text_of(d, "table"), "the variant")
    assert "joe_slow" in api(probe, "voices")
    assert "joe_slow" in (bridge.tmp / "voices.yaml").read_text(encoding="utf-8")

    # Changed in the form (voices/update): the voices file has the new speed.
    Select(browser.find_element(By.ID, "update-name")).select_by_value("joe_slow")
    fill(browser, "update-speed", "1.25")
    fill(browser, "update-description", "Joe, unhurried")
    submit(browser, "update")
    wait(browser, lambda d: "Joe, unhurried" in _voices_file(bridge), "the variant changed")
    assert "1.25" in _voices_file(bridge)
    open_page(browser, bridge.url("voices"))
    screenshot(browser, "voices", phone=True)

    browser.find_element(By.CSS_SELECTOR, "button[aria-label='Remove joe_slow']").click()
    wait(
        browser,
        lambda d: "joe_slow" not in text_of(d, "table"),
        "the variant gone",
    )
    assert "joe_slow" not in api(probe, "voices")
    assert console_errors(browser) == []


def _voices_file(bridge: UiBridge) -> str:
    path = bridge.tmp / "voices.yaml"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def test_a_chime_is_uploaded(
    signed_in: WebDriver, bridge: UiBridge, probe: BridgeApiClient, tmp_path: Path
) -> None:
    rate = 16000
    t = np.arange(int(0.5 * rate)) / rate
    tone = tmp_path / "bell.wav"
    soundfile.write(tone, 0.5 * np.sin(2 * np.pi * 880 * t), rate)
    browser = signed_in
    open_page(browser, bridge.url("chimes"))
    fill(browser, "upload-name", "doorbell")
    browser.find_element(By.ID, "upload-file").send_keys(str(tone))
    submit(browser, "upload")
    wait(browser, lambda d: "doorbell.wav" in text_of(d, "table"), "chime")
    chimes = api(probe, "chimes")["chimes"]
    assert {"name": "doorbell", "source": "doorbell.wav"} in chimes
    # The preview plays the chime as the bridge made it (a file is cut to chimes.max_seconds).
    preview = fetch_decoded(browser, "ui/chimes/doorbell.wav")
    assert abs(preview["decoded"] - 0.5) < 0.05 and preview["rms"] > 0.02, preview
    status, _, _ = send(bridge.port, "GET", "/ui/chimes/doorbell.wav")
    assert status == 401  # outside a signed-in browser: no
    assert console_errors(browser) == []
    screenshot(browser, "chimes")

    # Not audio: refused with the reason, nothing saved.
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"RIFF not really")
    open_page(browser, bridge.url("chimes"))
    fill(browser, "upload-name", "junk")
    browser.find_element(By.ID, "upload-file").send_keys(str(junk))
    submit(browser, "upload")
    assert "invalid_chime" in wait_done(browser, "upload")
    assert not (bridge.tmp / "chimes" / "junk.wav").exists()
    # The refusal's 400 is the only line the console got.
    assert [m for m in console_errors(browser) if "/ui/chimes/upload" not in m] == []


def test_the_cache_is_cleared(
    signed_in: WebDriver, bridge: UiBridge, probe: BridgeApiClient
) -> None:
    browser = signed_in
    fill(browser, "speak-text", "The washing is done.")
    submit(browser, "speak")
    assert wait_done(browser, "speak").startswith("Done")
    assert api(probe, "cache/stats")["entries"] > 0
    open_page(browser, bridge.url("phrases"))
    assert "The front door is open." in browser.page_source
    # A phrase added in the form is listed (the bridge API reads it back) and kept.
    fill(browser, "add-phrase-text", "The dishwasher has finished.")
    submit(browser, "add-phrase")
    wait(browser, lambda d: "The dishwasher has finished." in d.page_source, "the new phrase")
    listed = {p["phrase"]: p["source"] for p in api(probe, "phrases")["phrases"]}
    assert listed["The dishwasher has finished."] == "runtime"
    assert listed["The front door is open."] == "configuration"
    screenshot(browser, "phrases", phone=True)
    submit(browser, "clear")
    browser.switch_to.alert.accept()
    wait(browser, lambda d: "Entries" in d.page_source and _entries(d) == "0", "an empty cache")
    assert api(probe, "cache/stats")["entries"] == 0
    assert console_errors(browser) == []


def _entries(browser: WebDriver) -> str:
    facts = browser.find_elements(By.CSS_SELECTOR, "#cache-h ~ dl dd")
    return str(facts[0].text) if facts else ""


# A phone in portrait (the Home Assistant app's sidebar panel): 390 CSS pixels wide.
PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True}


def test_on_a_phone_every_table_fits_the_screen(signed_in: WebDriver, bridge: UiBridge) -> None:
    """No sideways scrolling to reach a row's buttons: each row is a card, each cell under its
    column's name."""
    browser = signed_in
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
    try:
        for page in ("voices", "phrases", "chimes", "pronunciations", "activity", "status"):
            open_page(browser, bridge.url(page))
            widths = browser.execute_script(
                "return Array.from(document.querySelectorAll('.scroll, body'))"
                ".map(e => [e.className || e.tagName, e.scrollWidth, e.clientWidth]);"
            )
            wide = [w for w in widths if w[1] > w[2] + 1]
            assert wide == [], f"{page}: {wide} scroll sideways"
            cells = browser.execute_script(
                "return Array.from(document.querySelectorAll('tbody td'))"
                ".map(td => [td.getAttribute('data-label'), "
                "(td.closest('table').querySelectorAll('thead th')[td.cellIndex] || {})"
                ".textContent ?? null]);"
            )
            if page in ("voices", "phrases", "status"):
                assert cells, f"{page} has a table with rows"
            assert all(label == column for label, column in cells), (page, cells)
            # Every row's buttons are on the screen, not past its right edge.
            outside = browser.execute_script(
                "return Array.from(document.querySelectorAll('tbody button'))"
                ".filter(b => b.getBoundingClientRect().right > window.innerWidth).length;"
            )
            assert outside == 0, f"{page}: {outside} button(s) off the screen"
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert console_errors(browser) == []


def test_activity_follows_the_bridge_live(signed_in: WebDriver, bridge: UiBridge) -> None:
    browser = signed_in
    open_page(browser, bridge.url("activity"))
    wait(browser, lambda d: text_of(d, "#live") == "Live.", "the event stream")
    before = len(browser.find_elements(By.CSS_SELECTOR, "#recent tr"))
    # A request made elsewhere (another tab) arrives without reloading this page.
    browser.switch_to.new_window("tab")
    open_page(browser, bridge.url())
    fill(browser, "speak-text", "The post has arrived.")
    submit(browser, "speak")
    assert wait_done(browser, "speak").startswith("Done")
    browser.close()
    browser.switch_to.window(browser.window_handles[0])
    wait(
        browser,
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#recent tr")) == before + 1,
        "the new request in the list",
    )
    newest = text_of(browser, "#recent tr")
    assert "web" in newest and "joe" in newest and "ok" in newest, newest
    # A say over MQTT (another process) arrives on the same page: every door is listed.
    say = ["mosquitto_pub", "-h", bridge.broker.host, "-p", str(bridge.broker.port)]
    say += ["-t", "tts_bridge/say/kitchen", "-m", "The bins go out tonight.", "-q", "1"]
    subprocess.run(say, check=True, timeout=30)
    wait(
        browser,
        lambda d: "mqtt" in text_of(d, "#recent tr"),
        "the MQTT say in the list",
    )
    assert "Broker" in browser.find_element(By.ID, "state").text
    assert "connected" in browser.find_element(By.ID, "state").text
    assert console_errors(browser) == []
    screenshot(browser, "activity", phone=True)
    open_page(browser, bridge.url("status"))
    screenshot(browser, "status")


def test_a_cross_origin_post_is_refused(
    signed_in: WebDriver, bridge: UiBridge, probe: BridgeApiClient
) -> None:
    cookie = signed_in.get_cookie("tts_bridge_session")
    assert cookie is not None
    body = "word=Evil&say=hacked"
    base = {
        "Cookie": f"tts_bridge_session={cookie['value']}",
        "Content-Type": "application/x-www-form-urlencoded",
        "Content-Length": str(len(body)),
    }

    def post(headers: dict[str, str]) -> int:
        status, _, _ = send(bridge.port, "POST", "/ui/lexicon/set", headers, body.encode())
        return status

    assert post({**base, "Origin": "http://evil.example"}) == 403
    assert post({**base, "Sec-Fetch-Site": "cross-site"}) == 403
    assert post({**base, "Sec-Fetch-Site": "same-site", "Origin": bridge.base}) == 403
    assert post(base) == 403  # neither Origin nor Sec-Fetch-Site: not from the page
    assert all(e["word"] != "Evil" for e in api(probe, "lexicon")["entries"])
    # The same request from the page's own origin is the page's: accepted.
    assert post({**base, "Origin": bridge.base}) == 200
    api(probe, "lexicon/remove", {"word": "Evil"})


def test_another_sites_form_cannot_change_the_lexicon(
    signed_in: WebDriver, bridge: UiBridge, probe: BridgeApiClient
) -> None:
    # The classic cross-site request: a page elsewhere posts a form to the bridge while the
    # owner is signed in there.
    page = (
        "<!DOCTYPE html><html><body>"
        f'<form id="f" method="post" action="{bridge.url("ui/lexicon/set")}">'
        '<input name="word" value="Evil"><input name="say" value="hacked"></form>'
        '<script>document.getElementById("f").submit();</script></body></html>'
    )
    with OtherSite(page) as site:
        signed_in.get(site.url)
        wait(signed_in, lambda d: d.current_url == bridge.url("ui/lexicon/set"), "the post")
        assert "cross-origin request refused" in signed_in.page_source
    assert all(e["word"] != "Evil" for e in api(probe, "lexicon")["entries"])
    console_errors(signed_in)  # the refused post's 403 is expected there


def test_an_ingress_header_from_anyone_but_the_supervisor_is_refused(bridge: UiBridge) -> None:
    ingress = {"X-Ingress-Path": "/api/hassio_ingress/TOKEN"}
    status, _, _ = send(bridge.port, "GET", "/", ingress)
    assert status == 403
    status, _, _ = send(bridge.port, "GET", "/")
    assert status == 303  # on the LAN: the sign-in page


def test_the_ui_works_under_an_ingress_prefix(
    browser: WebDriver, bridge: UiBridge, probe: BridgeApiClient
) -> None:
    # This test's proxy plays the Supervisor, from loopback.
    bridge.ui.access.ingress_peers = frozenset({"127.0.0.1"})
    try:
        with IngressProxy(bridge.port) as proxy:
            browser.delete_all_cookies()  # Home Assistant has signed the user in, not the bridge
            open_page(browser, proxy.url())
            assert browser.current_url == proxy.url()
            assert browser.find_element(By.TAG_NAME, "h1").text == "Speak"
            fill(browser, "speak-text", "Dinner is ready.")
            submit(browser, "speak")
            assert wait_done(browser, "speak").startswith("Done")
            src = browser.find_element(By.ID, "player").get_attribute("src")
            assert src is not None and src.startswith(proxy.url("audio/"))
            assert decoded_audio(browser)["rms"] > 0.02
            browser.find_element(By.LINK_TEXT, "Pronunciations").click()
            wait(browser, lambda d: d.current_url == proxy.url("pronunciations"), "the link")
            fill(browser, "lex-word", "Aoife")
            fill(browser, "lex-say", "ee fa")
            submit(browser, "lexicon")
            wait(browser, lambda d: "ee fa" in text_of(d, "table"), "entry")
            assert any(e["word"] == "Aoife" for e in api(probe, "lexicon")["entries"])
            assert console_errors(browser) == []
    finally:
        bridge.ui.access.ingress_peers = frozenset({"172.30.32.2"})


def test_without_keys_read_only_pages_say_so_and_refuse_changes(
    tmp_path_factory: pytest.TempPathFactory, browser: WebDriver
) -> None:
    for plain in _read_only_bridge(tmp_path_factory):
        open_page(browser, plain.url("pronunciations"))
        notice = browser.find_element(By.CSS_SELECTOR, ".notice").text
        assert "Read-only" in notice
        assert not browser.find_element(By.CSS_SELECTOR, "#lexicon button").is_enabled()
        # Speaking is as open as /api/speak is without keys.
        open_page(browser, plain.url())
        fill(browser, "speak-text", "Hello.")
        submit(browser, "speak")
        assert wait_done(browser, "speak").startswith("Done")
        body = "word=x&say=y"
        status, _, answer = send(
            plain.port,
            "POST",
            "/ui/lexicon/set",
            {
                "Origin": plain.base,
                "Content-Type": "application/x-www-form-urlencoded",
                "Content-Length": str(len(body)),
            },
            body.encode(),
        )
        assert status == 403, answer
        assert console_errors(browser) == []


def _read_only_bridge(factory: pytest.TempPathFactory) -> Iterator[UiBridge]:
    yield from ui_bridge(factory.mktemp("ro"))
