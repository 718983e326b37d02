"""The pre-render phrase list edited in the web UI and over the MQTT bridge API (a real
mosquitto, the bridge API asked from another process): a phrase added is kept in the state
folder and rendered ahead, one phrase's audio is removed from the cache, configured phrases stay
read-only; and the list read back after a restart."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.web.ui_browser import BridgeApiClient, UiBridge, send, ui_bridge
from tts_bridge.speech.phrase_list import FILE_NAME, PhraseList

WAIT_S = 60.0
CONFIGURED = "The front door is open."


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiBridge]:
    tmp = tmp_path_factory.mktemp("phrases")
    # Rendered ahead however busy the machine running the tests is.
    yield from ui_bridge(tmp, {"scheduler": {"idle_delay_s": 0.1, "idle_max_load": 64.0}}, ui="on")


@pytest.fixture(scope="module")
def probe(bridge: UiBridge) -> BridgeApiClient:
    return BridgeApiClient(bridge.broker.host, bridge.broker.port)


def _post(bridge: UiBridge, path: str, fields: dict[str, str]) -> tuple[int, Any]:
    headers = {
        "Origin": bridge.base,
        "Content-Type": "application/x-www-form-urlencoded",
    }
    status, _, body = send(bridge.port, "POST", path, headers, urlencode(fields).encode())
    return status, json.loads(body)


def _api(probe: BridgeApiClient, name: str, payload: dict[str, Any] | None = None) -> Any:
    answer = probe.ask(name, payload)
    assert answer["status"] == "ok", answer
    return answer["data"]


def _row(probe: BridgeApiClient, phrase: str) -> dict[str, Any] | None:
    rows = _api(probe, "phrases")["phrases"]
    return next((r for r in rows if r["phrase"] == phrase), None)


def _wait_cached(probe: BridgeApiClient, phrase: str, cached: bool = True) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        row = _row(probe, phrase)
        assert row is not None
        if bool(row["cached"]) == cached:
            return row
        assert time.monotonic() < deadline, f"{phrase!r} never became cached={cached}: {row}"
        time.sleep(0.2)


def test_a_phrase_added_in_the_ui_is_kept_rendered_ahead_and_removed(
    bridge: UiBridge, probe: BridgeApiClient
) -> None:
    phrase = "The  washing machine\nhas finished."
    status, answer = _post(bridge, "/ui/phrases/set", {"phrase": phrase})
    assert status == 200, answer
    one_line = "The washing machine has finished."
    assert answer["data"]["phrase"] == one_line and answer["data"]["added"] is True
    assert answer["data"]["saved"] is True and answer["data"]["queued_sentences"] == 1
    saved = json.loads((bridge.tmp / FILE_NAME).read_text())
    assert saved["phrases"] == [one_line]

    # Read back through the other door: listed as added at run time, and rendered ahead.
    row = _wait_cached(probe, one_line)
    assert row["source"] == "runtime"
    assert row["cached"][0]["voice"] == bridge.service.pipeline.voices().default_voice
    assert _row(probe, CONFIGURED)["source"] == "configuration"  # type: ignore[index]
    status, _, page = send(bridge.port, "GET", "/phrases")
    assert status == 200 and one_line.encode() in page and b"added here" in page

    # Its audio removed from the cache over MQTT: the page no longer shows it cached.
    removed = _api(probe, "cache/remove", {"phrase": one_line})
    assert removed["removed_sentences"] >= 1
    assert _row(probe, one_line)["cached"] == []  # type: ignore[index]
    assert _api(probe, "cache/remove", {"phrase": one_line})["removed_sentences"] == 0

    # A configured phrase is read-only; one added is taken off the list (and the file).
    status, answer = _post(bridge, "/ui/phrases/remove", {"phrase": CONFIGURED})
    assert status == 400 and answer["error"]["code"] == "invalid_request"
    assert "configured" in answer["error"]["message"]
    status, answer = _post(bridge, "/ui/phrases/remove", {"phrase": one_line})
    assert status == 200 and answer["data"] == {"removed": one_line, "saved": True}
    assert _row(probe, one_line) is None
    assert json.loads((bridge.tmp / FILE_NAME).read_text())["phrases"] == []


def test_the_bridge_api_adds_and_refuses_phrases(bridge: UiBridge, probe: BridgeApiClient) -> None:
    added = _api(probe, "phrases/set", {"phrase": "The bins go out tonight."})
    assert added["added"] is True and added["saved"] is True
    again = _api(probe, "phrases/set", {"phrase": "The bins go out tonight."})
    assert again["added"] is False and again["queued_sentences"] == 0
    refused = probe.ask("phrases/set", {"phrase": "   "})
    assert refused["status"] == "error" and refused["code"] == "invalid_request"
    refused = probe.ask("phrases/remove", {"phrase": "Never added."})
    assert refused["status"] == "error" and "not in the list" in refused["error"]
    assert _api(probe, "phrases/remove", {"phrase": "The bins go out tonight."})["saved"]


def test_the_list_is_read_back_at_the_next_start(tmp_path: Any) -> None:
    path = tmp_path / FILE_NAME
    first = PhraseList(["Configured."], path)
    first.add("Added.")
    first.add("Configured.")  # already there: not added twice
    again = PhraseList(["Configured."], path)
    assert again.entries() == [("Configured.", "configuration"), ("Added.", "runtime")]
    path.write_text("not json")
    assert PhraseList(["Configured."], path).all() == ["Configured."]  # logged, not fatal
