"""Rhasspy Hermes: say parsing (good and bad input), topics, answers and the sayFinished tracker."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from tts_bridge.mqtt.hermes_protocol import (
    ERROR,
    PLAY_FINISHED_ALL,
    SAY,
    SAY_FINISHED,
    FinishReason,
    FinishTracker,
    HermesError,
    HermesSay,
    error_payload,
    parse_hermes_say,
    play_bytes_topic,
    play_finished_topic,
    say_finished_payload,
    site_of_play_finished,
)

# Generous for a loaded CI machine; the timers themselves are short.
WAIT_S = 5.0


def test_topics() -> None:
    assert SAY == "hermes/tts/say"
    assert SAY_FINISHED == "hermes/tts/sayFinished"
    assert ERROR == "hermes/error/tts"
    assert PLAY_FINISHED_ALL == "hermes/audioServer/+/playFinished"
    assert play_bytes_topic("kitchen", "r1") == "hermes/audioServer/kitchen/playBytes/r1"
    assert play_finished_topic("kitchen") == "hermes/audioServer/kitchen/playFinished"
    assert site_of_play_finished("hermes/audioServer/kitchen/playFinished") == "kitchen"
    assert site_of_play_finished("hermes/audioServer/kitchen/playBytes/x") is None
    assert site_of_play_finished("hermes/audioServer/a/b/playFinished") is None


@pytest.mark.parametrize("site", ["a/b", "+", "#", "", "tab\there"])
def test_topic_builders_refuse_bad_site(site: str) -> None:
    with pytest.raises(HermesError, match="siteId"):
        play_bytes_topic(site, "r1")
    with pytest.raises(HermesError, match="siteId"):
        play_finished_topic(site)


def test_minimal_say_gets_defaults_and_a_generated_id() -> None:
    first = parse_hermes_say(b'{"text": "Hello"}')
    second = parse_hermes_say(b'{"text": "Hello"}')
    assert first.text == "Hello"
    assert first.site_id == "default"
    assert (first.lang, first.session_id, first.volume) == (None, None, None)
    assert first.id and first.id != second.id
    assert first.id_given is False
    # A generated id is a valid topic level.
    assert play_bytes_topic(first.site_id, first.id).endswith(first.id)


def test_full_say() -> None:
    payload = {
        "text": "Ciao!",
        "siteId": "kitchen",
        "id": "req-7",
        "lang": "it_IT",
        "sessionId": "s-1",
        "volume": 0.5,
        "someOtherKey": {"ignored": True},
    }
    say = parse_hermes_say(json.dumps(payload).encode())
    assert say == HermesSay(
        text="Ciao!",
        site_id="kitchen",
        id="req-7",
        lang="it_IT",
        session_id="s-1",
        volume=0.5,
        id_given=True,
    )
    assert say.language == "it"


@pytest.mark.parametrize(
    "payload",
    [
        # What rhasspy-hermes serializes for unset fields.
        b'{"text": "Hi", "siteId": null, "lang": null, "id": null, "sessionId": null}',
        b'{"text": "Hi", "id": "", "lang": ""}',
    ],
)
def test_null_and_empty_optional_fields_count_as_absent(payload: bytes) -> None:
    say = parse_hermes_say(payload)
    assert say.site_id == "default"
    assert say.lang is None and say.language is None
    assert say.id and not say.id_given


@pytest.mark.parametrize(("volume", "expected"), [(0, 0.0), (1, 1.0), (0.25, 0.25)])
def test_volume_bounds_are_inclusive(volume: float, expected: float) -> None:
    say = parse_hermes_say(json.dumps({"text": "Hi", "volume": volume}).encode())
    assert say.volume == expected


def test_blank_text_is_left_to_the_synthesizer() -> None:
    # Emptiness and length are the synthesizer's rules, so both entry points say the same.
    assert parse_hermes_say(b'{"text": "  "}').text == "  "


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"Hello there", "not JSON"),
        (b"", "not JSON"),
        (b"\xff\xfe{}", "UTF-8"),
        (b'{"text": "caf\xe9"}', "UTF-8"),
        ('{"text": "Hi"}'.encode("utf-16"), "UTF-8"),
        (b'["text"]', "JSON object"),
        (b'"text"', "JSON object"),
        (b"{}", "'text' is required"),
        (b'{"siteId": "kitchen"}', "'text' is required"),
        (b'{"text": 5}', "'text' must be a string"),
        (b'{"text": null}', "'text' must be a string"),
        (b'{"text": ["a"]}', "'text' must be a string"),
        (b'{"text": "Hi", "siteId": "kitchen/upstairs"}', "siteId"),
        (b'{"text": "Hi", "siteId": "+"}', "siteId"),
        (b'{"text": "Hi", "siteId": "a#"}', "siteId"),
        (b'{"text": "Hi", "siteId": ""}', "siteId"),
        (b'{"text": "Hi", "siteId": "nul\\u0000"}', "siteId"),
        (b'{"text": "Hi", "siteId": "line\\nbreak"}', "siteId"),
        (b'{"text": "Hi", "siteId": "' + b"s" * 129 + b'"}', "siteId"),
        (b'{"text": "Hi", "siteId": 3}', "'siteId' must be a string"),
        (b'{"text": "Hi", "id": "a/b"}', "id"),
        (b'{"text": "Hi", "id": 42}', "'id' must be a string"),
        (b'{"text": "Hi", "lang": "english!"}', "lang"),
        (b'{"text": "Hi", "lang": 7}', "'lang' must be a string"),
        (b'{"text": "Hi", "sessionId": 7}', "'sessionId' must be a string"),
        (b'{"text": "\\ud800"}', "'text' is not valid Unicode"),
        (b'{"text": "Hi", "sessionId": "s\\udfff"}', "'sessionId' is not valid Unicode"),
        (b'{"text": "Hi", "siteId": "\\ud800"}', "'siteId' is not valid Unicode"),
        (b'{"text": "Hi", "volume": 1.5}', "between 0 and 1"),
        (b'{"text": "Hi", "volume": -0.1}', "between 0 and 1"),
        (b'{"text": "Hi", "volume": NaN}', "between 0 and 1"),
        (b'{"text": "Hi", "volume": Infinity}', "between 0 and 1"),
        (b'{"text": "Hi", "volume": "loud"}', "'volume' must be a number"),
        (b'{"text": "Hi", "volume": true}', "'volume' must be a number"),
        (b'{"text": "Hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    ],
)
def test_bad_say_payloads(payload: bytes, fragment: str) -> None:
    with pytest.raises(HermesError, match=fragment):
        parse_hermes_say(payload)


def test_a_refused_say_still_names_its_site_session_and_id() -> None:
    payload = b'{"text": 5, "siteId": "hall", "sessionId": "s3", "id": "r4"}'
    with pytest.raises(HermesError) as caught:
        parse_hermes_say(payload)
    assert (caught.value.site_id, caught.value.session_id) == ("hall", "s3")
    assert caught.value.request_id == "r4"
    assert json.loads(error_payload(caught.value, str(caught.value))) == {
        "error": "field 'text' must be a string, not int",
        "siteId": "hall",
        "context": "r4",
        "sessionId": "s3",
    }
    # A siteId that is itself the problem is not repeated back as a site.
    with pytest.raises(HermesError) as caught:
        parse_hermes_say(b'{"text": "Hi", "siteId": "a/b"}')
    assert caught.value.site_id is None
    assert json.loads(error_payload(caught.value, "x"))["siteId"] == "default"
    with pytest.raises(HermesError) as caught:
        parse_hermes_say(b'{"text": 1, "siteId": "\\ud800", "sessionId": 2, "id": ""}')
    assert (caught.value.site_id, caught.value.session_id, caught.value.request_id) == (
        None,
        None,
        None,
    )


def test_payload_size_limit() -> None:
    big = json.dumps({"text": "x" * 5000}).encode()
    with pytest.raises(HermesError, match="limit is 4096"):
        parse_hermes_say(big, max_payload_bytes=4096)
    assert parse_hermes_say(big).text == "x" * 5000


def test_say_finished_and_error_payloads() -> None:
    say = parse_hermes_say(b'{"text": "Hi", "siteId": "hall", "id": "r9", "sessionId": "s2"}')
    assert json.loads(say_finished_payload(say)) == {
        "id": "r9",
        "siteId": "hall",
        "sessionId": "s2",
    }
    assert json.loads(error_payload(say, "unknown voice 'bob'")) == {
        "error": "unknown voice 'bob'",
        "siteId": "hall",
        "context": "r9",
        "sessionId": "s2",
    }
    # Before a say could be parsed there is no site or session to name.
    assert json.loads(error_payload(None, "payload is not JSON")) == {
        "error": "payload is not JSON",
        "siteId": "default",
        "context": None,
        "sessionId": None,
    }


def test_payloads_with_a_lone_surrogate_are_escaped_not_lost() -> None:
    # parse_hermes_say refuses lone surrogates, but a say built another way, or an error message
    # quoting what a request held, may carry one UTF-8 cannot: the answer still goes out, escaped.
    say = HermesSay(text="Hi", id="r\ud800", session_id="s\udc01", id_given=True)
    finished_body = say_finished_payload(say)
    error_body = error_payload(say, "voice 'b\udfffb' is unknown")
    for payload in (finished_body, error_body):
        payload.decode("ascii")  # escaped, so plain ASCII
        assert b"\\ud800" in payload and b"\\udc01" in payload, payload
    assert json.loads(finished_body) == {
        "id": "r\ud800",
        "siteId": "default",
        "sessionId": "s\udc01",
    }
    assert json.loads(error_body) == {
        "error": "voice 'b\udfffb' is unknown",
        "siteId": "default",
        "context": "r\ud800",
        "sessionId": "s\udc01",
    }
    # Text UTF-8 can carry stays as it is (not escaped).
    assert "é".encode() in error_payload(make_say("é1"), "x")


# -- FinishTracker -------------------------------------------------------------------------


class Recorder:
    """Collects the tracker's callbacks; ``wait`` blocks until ``n`` have arrived."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, FinishReason, float]] = []
        self._cond = threading.Condition()

    def __call__(self, say: HermesSay, reason: FinishReason) -> None:
        with self._cond:
            self.calls.append((say.site_id, say.id, reason, time.monotonic()))
            self._cond.notify_all()

    def wait(self, n: int, timeout: float = WAIT_S) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.calls) >= n, timeout):
                raise AssertionError(f"expected {n} callbacks within {timeout} s: {self.calls}")


def make_say(request_id: str = "r1", site: str = "kitchen") -> HermesSay:
    return HermesSay(text="Hi", site_id=site, id=request_id, session_id="s1", id_given=True)


def finished(request_id: str) -> bytes:
    return json.dumps({"id": request_id, "sessionId": "s1"}).encode()


def test_fires_once_on_play_finished_and_not_again_on_timeout() -> None:
    recorder = Recorder()
    tracker = FinishTracker(recorder, margin_s=0.1)
    try:
        assert tracker.track(make_say(), duration_s=0.1)
        assert tracker.pending == 1
        assert tracker.on_play_finished("kitchen", finished("r1")) is True
        assert [c[:3] for c in recorder.calls] == [("kitchen", "r1", "played")]
        assert tracker.pending == 0
        # Past the timeout, and a repeated playFinished: still one call.
        time.sleep(0.5)
        assert tracker.on_play_finished("kitchen", finished("r1")) is False
        assert len(recorder.calls) == 1
    finally:
        tracker.close()


def test_fires_once_on_timeout_when_no_play_finished_comes() -> None:
    recorder = Recorder()
    tracker = FinishTracker(recorder, margin_s=0.15)
    try:
        started = time.monotonic()
        tracker.track(make_say(), duration_s=0.1)
        recorder.wait(1)
        site, request_id, reason, at = recorder.calls[0]
        assert (site, request_id, reason) == ("kitchen", "r1", "timeout")
        # Timers never fire early: the satellite gets the whole audio plus the margin.
        assert at - started >= 0.25 - 0.01
        # A late playFinished changes nothing.
        assert tracker.on_play_finished("kitchen", finished("r1")) is False
        time.sleep(0.2)
        assert len(recorder.calls) == 1
    finally:
        tracker.close()


@pytest.mark.parametrize(
    ("site", "payload"),
    [
        ("hall", finished("r1")),  # another satellite
        ("kitchen", finished("r2")),  # another request
        ("kitchen", b'{"sessionId": "s1"}'),  # no id
        ("kitchen", b'{"id": 5}'),
        ("kitchen", b"not json"),
        ("kitchen", b"\xff"),
        ("kitchen", b"[]"),
        ("kitchen", b""),
    ],
)
def test_other_play_finished_messages_do_not_finish(site: str, payload: bytes) -> None:
    recorder = Recorder()
    tracker = FinishTracker(recorder, margin_s=30.0)
    try:
        tracker.track(make_say(), duration_s=1.0)
        assert tracker.on_play_finished(site, payload) is False
        assert recorder.calls == []
        assert tracker.pending == 1
    finally:
        tracker.close()


def test_nothing_fires_after_close() -> None:
    recorder = Recorder()
    tracker = FinishTracker(recorder, margin_s=0.05)
    tracker.track(make_say("r1"), duration_s=0.05)
    tracker.track(make_say("r2"), duration_s=0.05)
    tracker.close()
    assert tracker.pending == 0
    time.sleep(0.4)
    assert tracker.on_play_finished("kitchen", finished("r1")) is False
    assert tracker.track(make_say("r3"), duration_s=0.0) is False
    time.sleep(0.2)
    assert recorder.calls == []
    tracker.close()  # idempotent


def test_same_id_tracked_again_finishes_the_first_at_once() -> None:
    recorder = Recorder()
    tracker = FinishTracker(recorder, margin_s=30.0)
    try:
        tracker.track(make_say("r1"), duration_s=1.0)
        tracker.track(make_say("r1"), duration_s=1.0)
        assert [c[2] for c in recorder.calls] == ["replaced"]
        assert tracker.on_play_finished("kitchen", finished("r1")) is True
        assert [c[2] for c in recorder.calls] == ["replaced", "played"]
        # The same id on another site is another request.
        tracker.track(make_say("r1", site="hall"), duration_s=1.0)
        tracker.track(make_say("r1", site="kitchen"), duration_s=1.0)
        assert tracker.pending == 2
    finally:
        tracker.close()


def test_exactly_once_when_play_finished_races_the_timer() -> None:
    recorder = Recorder()
    tracker = FinishTracker(recorder, margin_s=0.05)
    ids = [f"r{i}" for i in range(60)]
    go = threading.Event()

    def spam() -> None:
        go.wait()
        for request_id in ids:
            tracker.on_play_finished("kitchen", finished(request_id))

    threads = [threading.Thread(target=spam) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for request_id in ids:
            tracker.track(make_say(request_id), duration_s=0.0)
        go.set()
        for thread in threads:
            thread.join(WAIT_S)
        recorder.wait(len(ids))
        time.sleep(0.3)  # let any duplicate show up
        fired = sorted(c[1] for c in recorder.calls)
        assert fired == sorted(ids)
        assert {c[2] for c in recorder.calls} <= {"played", "timeout"}
    finally:
        tracker.close()


def test_a_failing_callback_is_logged_and_the_tracker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()

    def callback(say: HermesSay, reason: FinishReason) -> None:
        recorder(say, reason)
        if say.id == "bad":
            raise RuntimeError("publish failed")

    tracker = FinishTracker(callback, margin_s=30.0)
    try:
        with caplog.at_level(logging.ERROR, logger="tts_bridge.mqtt.hermes_protocol"):
            tracker.track(make_say("bad"), duration_s=1.0)
            assert tracker.on_play_finished("kitchen", finished("bad")) is True
        assert "sayFinished callback failed for bad" in caplog.text
        tracker.track(make_say("good"), duration_s=1.0)
        assert tracker.on_play_finished("kitchen", finished("good")) is True
        assert [c[1] for c in recorder.calls] == ["bad", "good"]
    finally:
        tracker.close()


def test_close_from_inside_a_callback_does_not_deadlock() -> None:
    done = threading.Event()
    holder: list[FinishTracker] = []

    def callback(say: HermesSay, reason: FinishReason) -> None:
        holder[0].close(timeout_s=WAIT_S)
        done.set()

    tracker = FinishTracker(callback, margin_s=0.01)
    holder.append(tracker)
    tracker.track(make_say(), duration_s=0.0)
    assert done.wait(WAIT_S)


def test_close_waits_for_a_running_callback() -> None:
    entered, release = threading.Event(), threading.Event()
    returned: list[float] = []

    def slow(say: HermesSay, reason: FinishReason) -> None:
        entered.set()
        release.wait(WAIT_S)
        returned.append(time.monotonic())

    tracker = FinishTracker(slow, margin_s=0.01)
    tracker.track(make_say(), duration_s=0.0)
    assert entered.wait(WAIT_S)
    threading.Timer(0.2, release.set).start()
    tracker.close(timeout_s=WAIT_S)
    closed_at = time.monotonic()
    assert returned and returned[0] <= closed_at


def test_negative_margin_is_refused() -> None:
    with pytest.raises(ValueError, match="margin"):
        FinishTracker(Recorder(), margin_s=-1.0)
