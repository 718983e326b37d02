"""Rhasspy Hermes text-to-speech: parse ``hermes/tts/say``, build the answers, track playback.

A Hermes satellite sends ``hermes/tts/say`` (JSON: ``text``, ``siteId``, ``id``, ``lang``,
``sessionId``, ``volume``), expects the WAV on ``hermes/audioServer/<siteId>/playBytes/<id>``,
answers ``hermes/audioServer/<siteId>/playFinished`` (``{"id": ...}``) when it has played it,
and waits for ``hermes/tts/sayFinished`` before its dialogue goes on. Errors go to
``hermes/error/tts``. Everything here is pure except ``FinishTracker``, which owns timers.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tts_bridge.speech.request import SpeechRequest
from tts_bridge.wire import JsonTooDeepError, encode_json, load_json

_LOGGER = logging.getLogger(__name__)

SAY = "hermes/tts/say"
SAY_FINISHED = "hermes/tts/sayFinished"
ERROR = "hermes/error/tts"
PLAY_FINISHED_ALL = "hermes/audioServer/+/playFinished"
"""Subscribe to this to hear every satellite's playFinished."""

DEFAULT_SITE = "default"
DEFAULT_MARGIN_S = 2.0
_MAX_LEVEL_CHARS = 128
_LANG_RE = re.compile(r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
_PLAY_FINISHED_RE = re.compile(r"^hermes/audioServer/([^/]+)/playFinished$")

_PLAY_FINISHED_MAX_DEPTH = 4


class HermesError(ValueError):
    """A Hermes message that cannot be served; the text says what is wrong with it.

    ``site_id``, ``session_id`` and ``request_id`` are what could be read from a refused say
    (None where not), so ``error_payload(exc, ...)`` still reaches the right satellite.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.site_id: str | None = None
        self.session_id: str | None = None
        self.request_id: str | None = None


@dataclass(frozen=True)
class HermesSay:
    """A valid ``hermes/tts/say`` request."""

    text: str
    """What to speak; not checked for emptiness or length here (the synthesizer's rules apply)."""
    site_id: str = DEFAULT_SITE
    """The satellite; one MQTT topic level, as it goes into the playBytes topic."""
    id: str = ""
    """The request id: the caller's, or a generated one; always one MQTT topic level."""
    lang: str | None = None
    """Language as the caller gave it (e.g. ``en_US``); see ``language`` for the short code."""
    session_id: str | None = None
    """The dialogue session, echoed in sayFinished and errors."""
    volume: float | None = None
    """Requested loudness 0..1 (scale the PCM before encoding); None means unchanged."""
    id_given: bool = False
    """True when the caller sent its own id (False: ``id`` was generated here)."""

    @property
    def language(self) -> str | None:
        """The primary language code in lower case (``en_US`` -> ``en``), or None."""
        if not self.lang:
            return None
        return re.split(r"[-_]", self.lang, maxsplit=1)[0].lower()


def speech_request(say: HermesSay, voice: str | None, received: float) -> SpeechRequest:
    """The speech core's request for a Hermes say, spoken by `voice` (hermes.voice)."""
    return SpeechRequest(
        id=say.id,
        text=say.text,
        voice=voice,
        language=say.language,
        door="hermes",
        target=say.site_id,
        volume=say.volume,
        received=received,
    )


def _is_level(value: str) -> bool:
    try:
        _check_level(value, "")
    except HermesError:
        return False
    return True


def _check_level(value: str, what: str) -> None:
    """One MQTT topic level: non-empty, no separator, wildcard, NUL or control character."""
    if not value:
        raise HermesError(f"{what} must not be empty")
    if len(value) > _MAX_LEVEL_CHARS:
        raise HermesError(f"{what} is longer than {_MAX_LEVEL_CHARS} characters")
    bad = sorted({c for c in value if c in "/+#" or ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise HermesError(f"{what} {value[:40]!r} contains {shown}; it must be one topic level")


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    return _str_field(value, key)


def _str_field(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise HermesError(f"field {key!r} must be a string, not {type(value).__name__}")
    # JSON escapes can spell lone surrogates ("\ud800"), which no UTF-8 topic or payload can
    # carry: refused here rather than failing later when the answer is encoded.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise HermesError(f"field {key!r} is not valid Unicode") from None
    return value


def parse_hermes_say(
    payload: bytes, *, max_payload_bytes: int | None = None, max_json_depth: int = 8
) -> HermesSay:
    """Parse and validate a ``hermes/tts/say`` payload; raise HermesError with the reason.

    Unknown keys are ignored: dialogue managers add their own, and refusing them would break
    satellites that work with Rhasspy. ``null`` counts as absent for the optional fields.
    """
    if max_payload_bytes is not None and len(payload) > max_payload_bytes:
        raise HermesError(f"payload has {len(payload)} bytes; the limit is {max_payload_bytes}")
    try:
        # Decoded as UTF-8 only (json.loads would also accept UTF-16 and UTF-32).
        data = load_json(payload, max_json_depth)
    except UnicodeDecodeError as exc:
        raise HermesError(f"payload is not valid UTF-8 (byte {exc.start})") from None
    except JsonTooDeepError:
        raise HermesError("payload JSON is nested too deeply") from None
    except ValueError as exc:
        raise HermesError(f"payload is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HermesError("payload must be a JSON object with a 'text' field")
    try:
        return _say_from(data)
    except HermesError as exc:
        site_id = _hint(data, "siteId")
        exc.site_id = site_id if site_id is not None and _is_level(site_id) else None
        exc.session_id = _hint(data, "sessionId")
        exc.request_id = _hint(data, "id")
        raise


def _hint(data: dict[str, Any], key: str) -> str | None:
    """A field of a refused say, if it is a usable string; never raises."""
    try:
        return _str_field(data.get(key), key) or None
    except HermesError:
        return None


def _say_from(data: dict[str, Any]) -> HermesSay:
    if "text" not in data:
        raise HermesError("field 'text' is required")
    text = _str_field(data["text"], "text")

    site_id = _optional_str(data, "siteId")
    site_id = DEFAULT_SITE if site_id is None else site_id
    _check_level(site_id, "siteId")

    # An empty id is what older Hermes clients send for "none".
    given_id = _optional_str(data, "id") or None
    if given_id is not None:
        _check_level(given_id, "id")

    lang = _optional_str(data, "lang") or None
    if lang is not None and not _LANG_RE.match(lang):
        raise HermesError(f"field 'lang' {lang[:40]!r} is not a language code like 'en' or 'en_US'")

    session_id = _optional_str(data, "sessionId")

    raw_volume = data.get("volume")
    volume: float | None = None
    if raw_volume is not None:
        # bool is an int in Python, but `"volume": true` is a client bug, not a loudness.
        if isinstance(raw_volume, bool) or not isinstance(raw_volume, int | float):
            raise HermesError(f"field 'volume' must be a number, not {type(raw_volume).__name__}")
        volume = float(raw_volume)
        if not (math.isfinite(volume) and 0.0 <= volume <= 1.0):
            raise HermesError(f"field 'volume' must be between 0 and 1, not {raw_volume}")

    return HermesSay(
        text=text,
        site_id=site_id,
        id=given_id if given_id is not None else uuid.uuid4().hex,
        lang=lang,
        session_id=session_id,
        volume=volume,
        id_given=given_id is not None,
    )


def play_bytes_topic(site_id: str, request_id: str) -> str:
    """``hermes/audioServer/<siteId>/playBytes/<requestId>``: where the WAV goes."""
    _check_level(site_id, "siteId")
    _check_level(request_id, "request id")
    return f"hermes/audioServer/{site_id}/playBytes/{request_id}"


def play_finished_topic(site_id: str) -> str:
    """``hermes/audioServer/<siteId>/playFinished``: the satellite's "I have played it"."""
    _check_level(site_id, "siteId")
    return f"hermes/audioServer/{site_id}/playFinished"


def site_of_play_finished(topic: str) -> str | None:
    """The siteId of a playFinished topic, or None for any other topic."""
    match = _PLAY_FINISHED_RE.match(topic)
    return match.group(1) if match else None


def say_finished_payload(say: HermesSay) -> bytes:
    """``hermes/tts/sayFinished`` for a request: its id, siteId and sessionId."""
    body = {"id": say.id, "siteId": say.site_id, "sessionId": say.session_id}
    return encode_json(body)


def error_payload(source: HermesSay | HermesError | None, message: str) -> bytes:
    """``hermes/error/tts``; ``context`` carries the request id so the caller can match it.

    ``source`` is the say that failed, the HermesError that refused it, or None if nothing
    about the request is known.
    """
    site_id: str | None = None
    context: str | None = None
    session_id: str | None = None
    if isinstance(source, HermesSay):
        site_id, context, session_id = source.site_id, source.id, source.session_id
    elif isinstance(source, HermesError):
        site_id, context, session_id = source.site_id, source.request_id, source.session_id
    body = {
        "error": message,
        "siteId": site_id or DEFAULT_SITE,
        "context": context,
        "sessionId": session_id,
    }
    return encode_json(body)


FinishReason = Literal["played", "timeout", "replaced"]
"""Why sayFinished is due: the satellite said playFinished, it stayed silent past the audio's
duration plus the margin, or the same site and id were tracked again before either."""

OnFinished = Callable[[HermesSay, FinishReason], None]


@dataclass(eq=False)
class _Pending:
    """One tracked request; compared by identity, so a re-tracked id is a different entry."""

    say: HermesSay
    timer: threading.Timer | None = None


class FinishTracker:
    """Calls ``on_finished`` exactly once per tracked request, when it is time for sayFinished.

    That is when the satellite reports ``playFinished`` for the request's id, or, if it never
    does, after the audio's duration plus ``margin_s``. ``close()`` cancels everything: no
    callback starts afterwards, and callbacks already running are waited for (except the one
    that calls ``close()`` itself). Thread-safe; callbacks run without the lock held, on paho's
    network thread (playFinished) or on a timer thread (timeout), so they must be quick.
    """

    def __init__(self, on_finished: OnFinished, *, margin_s: float = DEFAULT_MARGIN_S) -> None:
        if margin_s < 0:
            raise ValueError("margin_s must not be negative")
        self._on_finished = on_finished
        self._margin_s = margin_s
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, str], _Pending] = {}
        # Callbacks claimed but not yet returned; close() waits for them.
        self._running = 0
        self._closed = False
        self._in_callback = threading.local()

    @property
    def pending(self) -> int:
        """Requests still waiting for playFinished or their timeout."""
        with self._cond:
            return len(self._pending)

    def track(self, say: HermesSay, duration_s: float) -> bool:
        """Start waiting for ``say`` (already published as playBytes); False after close()."""
        key = (say.site_id, say.id)
        entry = _Pending(say)
        timer = threading.Timer(
            max(0.0, duration_s) + self._margin_s, self._finish, (key, entry, "timeout")
        )
        # A pending timer must not keep the process alive at exit.
        timer.daemon = True
        timer.name = f"hermes-finish-{say.id[:16]}"
        entry.timer = timer
        with self._cond:
            if self._closed:
                _LOGGER.debug("Not tracking %s: the tracker is closed", say.id)
                return False
            replaced = self._pending.get(key)
            self._pending[key] = entry
            if replaced is not None:
                self._running += 1
            timer.start()
        if replaced is not None:
            # The same id again before the first one finished: the first still gets its one
            # sayFinished now, so no caller waits for an answer that would never come.
            _cancel(replaced)
            self._call(replaced.say, "replaced")
        return True

    def on_play_finished(self, site_id: str, payload: bytes) -> bool:
        """Handle a satellite's playFinished; True if it finished a tracked request."""
        try:
            # An id and a session id: anything nested deeper is not a playFinished.
            data = load_json(payload, _PLAY_FINISHED_MAX_DEPTH) if payload.strip() else {}
        except ValueError:  # includes UnicodeDecodeError and JsonTooDeepError
            _LOGGER.debug("Ignoring a playFinished from %s that is not JSON", site_id)
            return False
        request_id = data.get("id") if isinstance(data, dict) else None
        if not isinstance(request_id, str) or not request_id:
            return False
        key = (site_id, request_id)
        with self._cond:
            entry = self._pending.get(key)
        if entry is None:
            return False  # another service's sound, or already finished
        return self._finish(key, entry, "played")

    def close(self, timeout_s: float = 5.0) -> None:
        """Cancel every timer; afterwards no callback starts (idempotent)."""
        with self._cond:
            self._closed = True
            entries = list(self._pending.values())
            self._pending.clear()
        for entry in entries:
            _cancel(entry)
        own = 1 if getattr(self._in_callback, "active", False) else 0
        with self._cond:
            if not self._cond.wait_for(lambda: self._running <= own, timeout_s):
                _LOGGER.warning("A sayFinished callback is still running after %.0f s", timeout_s)

    def _finish(self, key: tuple[str, str], entry: _Pending, reason: FinishReason) -> bool:
        with self._cond:
            # Only the first of playFinished and the timer gets past this check, and never
            # after close(); claiming the callback here lets close() wait for it.
            if self._closed or self._pending.get(key) is not entry:
                return False
            del self._pending[key]
            self._running += 1
        _cancel(entry)
        self._call(entry.say, reason)
        return True

    def _call(self, say: HermesSay, reason: FinishReason) -> None:
        """Run the callback claimed (``_running`` incremented) by the caller."""
        self._in_callback.active = True
        try:
            self._on_finished(say, reason)
        except Exception:
            # Runs on paho's or a timer's thread: an escaping exception would only be lost there.
            _LOGGER.exception("sayFinished callback failed for %s", say.id)
        finally:
            self._in_callback.active = False
            with self._cond:
                self._running -= 1
                self._cond.notify_all()


def _cancel(entry: _Pending) -> None:
    if entry.timer is not None:
        entry.timer.cancel()
