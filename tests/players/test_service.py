"""The media-player service against a stub of Home Assistant's REST API on loopback: what is
called and in which order, each player's outcome, volumes noted, set and put back (also across
a restart of Home Assistant or of the bridge), turns on a busy player, the token kept secret."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.players.stub import TOKEN, HomeAssistantStub, Player
from tts_bridge.config import Settings
from tts_bridge.players.connection import HomeAssistantConnection
from tts_bridge.players.service import Outcomes, Players, PlayOrder

URL = "http://192.0.2.10:10201/audio/abc.mp3"
KITCHEN = "media_player.kitchen"
HALL = "media_player.hall"
WAIT_S = 30.0


class Answers:
    """What `done` got, per request id."""

    def __init__(self) -> None:
        self.got: dict[str | int, Outcomes] = {}
        self.threads: dict[str | int, str] = {}
        self._cond = threading.Condition()

    def done(self, request_id: str | int) -> Any:
        def record(outcomes: Outcomes) -> None:
            with self._cond:
                self.got[request_id] = outcomes
                self.threads[request_id] = threading.current_thread().name
                self._cond.notify_all()

        return record

    def wait(self, request_id: str | int, timeout_s: float = WAIT_S) -> Outcomes:
        with self._cond:
            assert self._cond.wait_for(lambda: request_id in self.got, timeout_s), request_id
            return self.got[request_id]


def settings(**target: Any) -> Settings:
    kitchen = {"media_players": [KITCHEN, HALL], "volume": 0.5, **target}
    return Settings.model_validate({"targets": {"kitchen": kitchen}})


@pytest.fixture
def stub() -> Iterator[HomeAssistantStub]:
    ha = HomeAssistantStub(players={KITCHEN: Player(), HALL: Player(volume_level=0.7)})
    ha.start()
    yield ha
    ha.stop()


def players_for(
    stub: HomeAssistantStub, tmp_path: Path, config: Settings | None = None, **kwargs: Any
) -> Players:
    connection = HomeAssistantConnection(stub.url, TOKEN, "test")
    options = {"margin_s": 0.2, "retry_s": 0.1, **kwargs}
    service = Players(config or settings(), connection, tmp_path / "volumes.json", **options)
    service.start()
    return service


def assert_forgotten(service: Players) -> None:
    """The restore is forgotten once Home Assistant has answered it, which is just after the
    stub saw the call (and a test saw the volume back)."""
    deadline = time.monotonic() + WAIT_S
    while service.pending_restores and time.monotonic() < deadline:
        time.sleep(0.02)
    assert service.pending_restores == {}


def test_plays_with_announce_sets_the_volume_and_puts_it_back(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    service = players_for(stub, tmp_path)
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 300), answers.done("r1"))
        assert answers.wait("r1") == {KITCHEN: "ok", HALL: "ok"}
        assert answers.threads["r1"].startswith("tts-players-answer")
        for entity, before in ((KITCHEN, 0.3), (HALL, 0.7)):
            calls = stub.wait_for("volume_set", entity, count=2)
            assert [c.data["volume_level"] for c in calls] == [0.5, before]
            (play,) = stub.service_calls("play_media", entity)
            assert play.data == {
                "entity_id": entity,
                "media_content_id": URL,
                "media_content_type": "music",
                "announce": True,
            }
            # Set, play, then back only after the audio's length and the margin.
            assert calls[0].at <= play.at <= calls[1].at
            assert calls[1].at - play.at >= 0.3 + 0.2 - 0.05
        assert stub.players[KITCHEN].volume_level == 0.3
        assert_forgotten(service)
        assert json.loads((tmp_path / "volumes.json").read_text()) == {}
    finally:
        service.stop()


def test_an_unavailable_or_refusing_player_costs_the_others_nothing(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    stub.players[HALL].state = "unavailable"
    stub.players["media_player.porch"] = Player(refuse=True)
    config = settings(media_players=[KITCHEN, HALL, "media_player.porch", "media_player.gone"])
    service = players_for(stub, tmp_path, config)
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 200), answers.done("r1"))
        assert answers.wait("r1") == {
            KITCHEN: "ok",
            HALL: "player_unavailable",
            "media_player.porch": "player_refused",
            "media_player.gone": "player_not_found",
        }
        assert stub.service_calls("play_media", KITCHEN)
        assert not stub.service_calls(entity=HALL), "an unavailable player is not called"
        # The refusing player's volume was set before it refused: it goes back at once.
        calls = stub.wait_for("volume_set", "media_player.porch", count=2)
        assert [c.data["volume_level"] for c in calls] == [0.5, 0.3]
    finally:
        service.stop()


def test_a_player_that_cannot_play_media_is_refused_before_its_volume_changes(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    # Like Home Assistant's demo media_player.kitchen: volume control, no play_media.
    stub.players[HALL].supported_features = 4
    service = players_for(stub, tmp_path)
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 200), answers.done("r1"))
        assert answers.wait("r1") == {KITCHEN: "ok", HALL: "player_refused"}
        stub.wait_for("volume_set", KITCHEN, count=2)
        assert not stub.service_calls(entity=HALL), "its volume is not touched"
        assert stub.players[HALL].volume_level == 0.7
    finally:
        service.stop()


def test_a_slow_player_delays_no_other_and_times_out_alone(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    gate = threading.Event()
    stub.players[HALL].gate = gate
    service = players_for(stub, tmp_path, timeout_s=1.0)
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 200), answers.done("r1"))
        # The kitchen plays while the hall's call still hangs.
        stub.wait_for("play_media", KITCHEN)
        assert not gate.is_set()
        assert answers.wait("r1") == {KITCHEN: "ok", HALL: "player_timeout"}
        # The hall's volume goes back although its play call never answered.
        calls = stub.wait_for("volume_set", HALL, count=2)
        assert [c.data["volume_level"] for c in calls] == [0.5, 0.7]
    finally:
        gate.set()
        service.stop()


def test_home_assistant_unreachable_is_every_players_outcome(tmp_path: Path) -> None:
    away = HomeAssistantStub()  # never started: nothing listens on its port
    service = players_for(away, tmp_path)
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 200), answers.done("r1"))
        assert answers.wait("r1") == {
            KITCHEN: "homeassistant_unreachable",
            HALL: "homeassistant_unreachable",
        }
    finally:
        service.stop()


def test_no_url_or_no_home_assistant_is_answered_at_once(tmp_path: Path) -> None:
    answers = Answers()
    unconfigured = Players(settings(), None, tmp_path / "volumes.json")
    unconfigured.start()
    unconfigured.play(PlayOrder("r1", "kitchen", URL, 200), answers.done("r1"))
    assert answers.got["r1"] == dict.fromkeys((KITCHEN, HALL), "homeassistant_not_configured")
    unconfigured.stop()
    away = HomeAssistantStub()
    service = players_for(away, tmp_path)
    try:
        service.play(PlayOrder("r2", "kitchen", None, 200), answers.done("r2"))
        assert answers.got["r2"] == dict.fromkeys((KITCHEN, HALL), "url_unavailable")
    finally:
        service.stop()


def test_wrong_token_is_its_own_code(stub: HomeAssistantStub, tmp_path: Path) -> None:
    connection = HomeAssistantConnection(stub.url, "not-the-token", "test")
    service = Players(settings(), connection, tmp_path / "volumes.json")
    service.start()
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 200), answers.done("r1"))
        assert set(answers.wait("r1").values()) == {"homeassistant_unauthorized"}
    finally:
        service.stop()


def test_a_player_that_restores_itself_gets_the_volume_with_the_announcement(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    service = players_for(stub, tmp_path, settings(volume_restore="player"))
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 200), answers.done("r1"))
        assert answers.wait("r1") == {KITCHEN: "ok", HALL: "ok"}
        (play,) = stub.service_calls("play_media", KITCHEN)
        assert play.data["extra"] == {"volume": 0.5} and play.data["announce"] is True
        assert not stub.service_calls("volume_set")
    finally:
        service.stop()


def test_a_player_without_a_volume_plays_at_its_own(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    stub.players[KITCHEN].volume_level = None  # off: Home Assistant reports no volume
    stub.players[HALL].supported_features = 512  # no volume control
    service = players_for(stub, tmp_path)
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 200), answers.done("r1"))
        assert answers.wait("r1") == {KITCHEN: "ok", HALL: "ok"}
        assert not stub.service_calls("volume_set")
        assert not (tmp_path / "volumes.json").exists() or service.pending_restores == {}
    finally:
        service.stop()


def test_home_assistant_restarting_before_the_restore_gets_it_later(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    service = players_for(stub, tmp_path, config=settings(media_players=[KITCHEN]))
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 3000), answers.done("r1"))
        assert answers.wait("r1") == {KITCHEN: "ok"}
        assert stub.players[KITCHEN].volume_level == 0.5
        stub.stop()  # Home Assistant restarts while the announcement plays
        on_disk = json.loads((tmp_path / "volumes.json").read_text())
        assert on_disk[KITCHEN]["volume"] == 0.3
        assert not stub.service_calls("volume_set", KITCHEN)[1:]
        restarted = HomeAssistantStub(players=stub.players, port=stub.port)
        threading.Timer(4.0, restarted.start).start()  # back after the restore was due
        try:
            calls = restarted.wait_for("volume_set", KITCHEN)
            assert calls[0].data["volume_level"] == 0.3
            assert restarted.players[KITCHEN].volume_level == 0.3
        finally:
            service.stop()
            restarted.stop()
        assert service.pending_restores == {}
    finally:
        service.stop()


def test_a_restore_waits_for_the_player_to_be_back_after_home_assistant_restarts(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    service = players_for(stub, tmp_path, config=settings(media_players=[KITCHEN]))
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 1000), answers.done("r1"))
        assert answers.wait("r1") == {KITCHEN: "ok"}
        kitchen = stub.players[KITCHEN]
        assert kitchen.volume_level == 0.5
        stub.stop()
        # Home Assistant answers again before its integrations have set up their players: a
        # volume_set then is answered 200 and does nothing.
        restarted = HomeAssistantStub(players={}, port=stub.port)
        restarted.start()
        try:
            threading.Timer(3.0, restarted.players.__setitem__, (KITCHEN, kitchen)).start()
            deadline = time.monotonic() + WAIT_S
            while kitchen.volume_level != 0.3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert kitchen.volume_level == 0.3, restarted.calls
            assert_forgotten(service)
        finally:
            service.stop()
            restarted.stop()
    finally:
        service.stop()


def test_a_bridge_that_stops_before_the_restore_does_it_at_its_next_start(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    config = settings(media_players=[KITCHEN])
    first = players_for(stub, tmp_path, config)
    answers = Answers()
    first.play(PlayOrder("r1", "kitchen", URL, 60_000), answers.done("r1"))
    assert answers.wait("r1") == {KITCHEN: "ok"}
    first.stop(restore_now=False)  # as if killed: the restore only on disk
    assert stub.players[KITCHEN].volume_level == 0.5
    assert len(stub.service_calls("volume_set", KITCHEN)) == 1
    second = players_for(stub, tmp_path, config)
    try:
        # Due in a minute: a stop puts it back at once, the next start would when due.
        assert KITCHEN in second.pending_restores
    finally:
        second.stop()
    calls = stub.service_calls("volume_set", KITCHEN)
    assert [c.data["volume_level"] for c in calls] == [0.5, 0.3]
    assert json.loads((tmp_path / "volumes.json").read_text()) == {}


def test_a_restore_due_while_the_bridge_was_away_runs_at_start(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    stub.players[KITCHEN].volume_level = 0.5
    (tmp_path / "volumes.json").write_text(json.dumps({KITCHEN: {"volume": 0.25, "due": 0}}))
    # No target names the player any more: the restore runs all the same.
    service = players_for(stub, tmp_path, Settings())
    try:
        stub.wait_for("volume_set", KITCHEN)
        assert stub.players[KITCHEN].volume_level == 0.25
    finally:
        service.stop()


def test_normal_waits_for_the_announcement_before_it_and_alert_does_not(
    stub: HomeAssistantStub, tmp_path: Path
) -> None:
    service = players_for(stub, tmp_path, settings(media_players=[KITCHEN]))
    answers = Answers()
    try:
        service.play(PlayOrder("first", "kitchen", URL + "?1", 1500), answers.done("first"))
        assert answers.wait("first") == {KITCHEN: "ok"}
        service.play(PlayOrder("normal", "kitchen", URL + "?2", 200), answers.done("normal"))
        alert = PlayOrder("alert", "kitchen", URL + "?3", 200, priority="alert")
        service.play(alert, answers.done("alert"))
        assert answers.wait("alert") == {KITCHEN: "ok"}
        assert answers.wait("normal") == {KITCHEN: "ok"}
        plays = stub.service_calls("play_media", KITCHEN)
        assert [p.data["media_content_id"][-1] for p in plays] == ["1", "3", "2"]
        assert plays[2].at - plays[0].at >= 1.5 - 0.05, "normal waited for the first's length"
        # The alert took over from the first (its volume noted once: the player's own comes
        # back after the alert, not the announcement's); the normal one notes it again.
        calls = stub.wait_for("volume_set", KITCHEN, count=5)
        assert [c.data["volume_level"] for c in calls] == [0.5, 0.5, 0.3, 0.5, 0.3]
    finally:
        service.stop()


def test_the_token_is_never_logged(
    stub: HomeAssistantStub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    stub.players[HALL].refuse = True
    service = players_for(stub, tmp_path)
    answers = Answers()
    try:
        service.play(PlayOrder("r1", "kitchen", URL, 200), answers.done("r1"))
        answers.wait("r1")
        assert TOKEN not in repr(HomeAssistantConnection(stub.url, TOKEN, "test"))
    finally:
        service.stop()
    assert caplog.records
    assert all(TOKEN not in r.getMessage() for r in caplog.records)
    assert stub.seen_tokens == {f"Bearer {TOKEN}"}
