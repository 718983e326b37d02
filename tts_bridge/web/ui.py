"""The web UI: pages to speak, tune pronunciations, voices and chimes, see the phrases in the
cache and watch the bridge, served by the bridge's HTTP server at ``/``.

Every action is the same as the MQTT bridge API's (`tts_bridge.control`, `VoiceAdmin`); Speak
goes through the pipeline as ``/api/speak`` does. Who may look and who may change is
`ui_access`'s; answers to the page's actions are JSON ``{"data": ...}`` or ``{"error": {"code",
"message"}}``. No request text is logged; the activity list lives in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import BodyPartReader, web

from tts_bridge.config import Settings
from tts_bridge.control.actions import Control
from tts_bridge.control.chimes import MAX_CHIME_BYTES, chime_wav, remove_chime, save_chime
from tts_bridge.control.errors import ControlError
from tts_bridge.engines.registry import UnknownVoiceError
from tts_bridge.engines.voices_file import VoicesFileError, read_voices
from tts_bridge.speech.activity import ActivityLog, sse
from tts_bridge.speech.pipeline import Pipeline, SpeechError
from tts_bridge.speech.voice_admin import VoiceAdmin, VoiceAdminError
from tts_bridge.web import ui_pages as pages
from tts_bridge.web.api_keys import ApiKeys
from tts_bridge.web.server import AudioServer
from tts_bridge.web.speech_api import ApiRequestError
from tts_bridge.web.ui_access import SESSION_COOKIE, SESSION_TTL_S, Access, Level
from tts_bridge.web.ui_speech import DOOR, speak

_LOGGER = logging.getLogger(__name__)

STATE_EVERY_S = 2.0
"""How often a watching page gets the queue and health (one stream per page, no polling)."""
MAX_FORM_BYTES = 64 * 1024
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "media-src 'self' blob:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'self'"
)
_STATIC = {"ui.css": "text/css", "ui.js": "text/javascript", "icon.svg": "image/svg+xml"}
_ERRORS = (ApiRequestError, SpeechError, ControlError, VoiceAdminError)
_SERVER_ERRORS = frozenset({"internal_error", "synthesis_failed", "chime_not_saved"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _static_files() -> dict[str, bytes]:
    folder = resources.files("tts_bridge.web") / "static"
    return {name: (folder / name).read_bytes() for name in _STATIC}


class WebUi:
    """The UI's routes on the HTTP server (`register`)."""

    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        control: Control,
        server: AudioServer,
        keys: ApiKeys,
        *,
        voice_admin: VoiceAdmin,
        info: Callable[[], dict[str, Any]],
        health: Callable[[], dict[str, Any]],
        status: Callable[[], str] | None = None,
        access: Access | None = None,
    ) -> None:
        """`info` and `health`: the bridge's reports; `status`: the status section's HTML."""
        self.settings = settings
        self.pipeline = pipeline
        self.control = control
        self.server = server
        self.voice_admin = voice_admin
        self.info = info
        self.health = health
        self.status = status
        self.access = access or Access(keys, settings.http.ui)
        # The speech core records every door's requests; a pipeline built without a list
        # (a test's) gets one here, so the page still has something to show.
        if pipeline.activity is None:
            pipeline.activity = ActivityLog()
        self.activity = pipeline.activity
        self._static = _static_files()
        self._closing = False
        """Set when the server shuts down: open event streams end (else it would wait)."""

    def register(self, app: web.Application) -> None:
        get, post = app.router.add_get, app.router.add_post
        app.on_shutdown.append(self._shutdown)
        get("/", self._page(self._speak_page))
        get("/pronunciations", self._page(self._pronunciations_page))
        get("/voices", self._page(self._voices_page))
        get("/chimes", self._page(self._chimes_page))
        get("/phrases", self._page(self._phrases_page))
        get("/activity", self._page(self._activity_page))
        get("/status", self._page(self._status_page))
        get("/login", self._login_form)
        post("/login", self._login)
        post("/logout", self._logout)
        get("/ui/static/{name}", self._static_file)
        get("/ui/chimes/{name}.wav", self._chime)
        get("/ui/events", self._events)
        post("/ui/speak", self._action(Level.VIEW, self._speak))
        post("/ui/lexicon/set", self._action(Level.CHANGE, self._sync(self.control.lexicon_set)))
        post(
            "/ui/lexicon/remove",
            self._action(Level.CHANGE, self._sync(self.control.lexicon_remove)),
        )
        post("/ui/voices/add", self._action(Level.CHANGE, self._sync(self._voice_add)))
        post("/ui/voices/update", self._action(Level.CHANGE, self._sync(self._voice_update)))
        post("/ui/voices/remove", self._action(Level.CHANGE, self._sync(self._voice_remove)))
        post(
            "/ui/voices/default",
            self._action(Level.CHANGE, self._sync(self.control.default_voice)),
        )
        post("/ui/chimes/upload", self._action(Level.CHANGE, self._chime_upload))
        post("/ui/chimes/remove", self._action(Level.CHANGE, self._sync(self._chime_remove)))
        post("/ui/prerender", self._action(Level.CHANGE, self._sync(self.control.prerender)))
        post("/ui/cache/clear", self._action(Level.CHANGE, self._sync(self.control.cache_clear)))
        post("/ui/cache/remove", self._action(Level.CHANGE, self._sync(self.control.cache_remove)))
        post("/ui/phrases/set", self._action(Level.CHANGE, self._sync(self.control.phrases_set)))
        post(
            "/ui/phrases/remove",
            self._action(Level.CHANGE, self._sync(self.control.phrases_remove)),
        )

    # -- plumbing --------------------------------------------------------------------------

    def _page(self, render: Callable[[web.Request, bool], str]) -> Handler:
        async def page(request: web.Request) -> web.StreamResponse:
            self.access.check_ingress(request)
            level = self.access.level(request)
            if level < Level.VIEW:
                if self.access.keys.required:
                    raise web.HTTPSeeOther(location="login")
                raise web.HTTPForbidden()
            can_change = level >= Level.CHANGE
            # Off the loop: the reports take the cache's and the scheduler's locks.
            body = await asyncio.get_running_loop().run_in_executor(
                None, render, request, can_change
            )
            return _html(body)

        return page

    def _wrap(self, request: web.Request, title: str, page: str, body: str, notes: bool) -> str:
        return pages.layout(
            title,
            page,
            body,
            notice=self.access.notice(request) if notes else None,
            signed_in=self.access.signed_in(request),
        )

    def _action(self, needed: Level, act: Callable[[web.Request, dict[str, Any]], Any]) -> Handler:
        async def action(request: web.Request) -> web.StreamResponse:
            self.access.require(request, needed, changes=True)
            try:
                fields = await self._fields(request)
                data = await act(request, fields)
            except _ERRORS as exc:
                code = getattr(exc, "code", "invalid_request")
                _LOGGER.warning("Web UI %s refused (%s): %s", request.path, code, exc)
                if request.path.endswith("/speak"):
                    self.pipeline.count_error(code, door=DOOR)
                return _error(code, str(exc))
            except UnknownVoiceError as exc:
                return _error("unknown_voice", str(exc.args[0]))
            return web.json_response({"data": data}, headers={"Cache-Control": "no-store"})

        return action

    def _sync(
        self, act: Callable[[Mapping[str, Any]], Any]
    ) -> Callable[[web.Request, dict[str, Any]], Awaitable[Any]]:
        """An action of the speech core, run off the loop (it writes files, takes locks)."""

        async def run(request: web.Request, fields: dict[str, Any]) -> Any:
            return await asyncio.get_running_loop().run_in_executor(None, act, fields)

        return run

    async def _fields(self, request: web.Request) -> dict[str, Any]:
        """The form's fields (URL-encoded or multipart; a file's as its bytes)."""
        files = request.content_type == "multipart/form-data"
        limit = MAX_CHIME_BYTES + MAX_FORM_BYTES if files else MAX_FORM_BYTES
        if request.content_length is None or request.content_length > limit:
            raise ControlError("payload_too_large", f"the form is larger than {limit} bytes")
        if files:
            return await self._multipart(request)
        body = await request.read()
        try:
            # A field left empty is a field not given (an optional one keeps its default).
            return dict(urllib.parse.parse_qsl(body.decode("utf-8")))
        except UnicodeDecodeError:
            raise ControlError("invalid_utf8", "the form is not UTF-8") from None

    async def _multipart(self, request: web.Request) -> dict[str, Any]:
        """A form with a file, read part by part (a chime may be larger than aiohttp's own
        limit for a whole form; the length was checked against ours)."""
        fields: dict[str, Any] = {}
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or not part.name:
                continue
            chunks = []  # read_chunk: part.read() would stop at aiohttp's limit for a form
            while chunk := await part.read_chunk():
                chunks.append(chunk)
            data = b"".join(chunks)
            if part.filename is not None:
                fields[part.name] = (part.filename, data)
            elif data:
                try:
                    fields[part.name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise ControlError("invalid_utf8", "the form is not UTF-8") from None
        return fields

    # -- actions ---------------------------------------------------------------------------

    async def _speak(self, request: web.Request, fields: dict[str, Any]) -> dict[str, Any]:
        return await speak(request, self.pipeline, self.server, fields)

    def _voice_add(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        args: dict[str, Any] = {"name": fields.get("name"), "like": fields.get("like")}
        speed = str(fields.get("speed") or "").strip()
        if speed and speed not in ("1", "1.0"):
            try:
                args["speed"] = float(speed)
            except ValueError:
                raise ControlError("invalid_request", "'speed' must be a number") from None
        speaker = str(fields.get("speaker") or "").strip()
        if speaker:
            args["speaker"] = speaker
        return self.voice_admin.add(args)

    def _voice_update(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """voices/update with the fields filled in (one left empty stays as it is)."""
        args: dict[str, Any] = {"name": fields.get("name")}
        speed = str(fields.get("speed") or "").strip()
        if speed:
            try:
                args["speed"] = float(speed)
            except ValueError:
                raise ControlError("invalid_request", "'speed' must be a number") from None
        for key in ("speaker", "description"):
            value = str(fields.get(key) or "").strip()
            if value:
                args[key] = value
        return self.voice_admin.update(args)

    def _voice_remove(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        return self.voice_admin.remove({"name": fields.get("name")})

    async def _chime_upload(self, request: web.Request, fields: dict[str, Any]) -> Any:
        upload = fields.get("file")
        if not isinstance(upload, tuple):
            raise ControlError("invalid_request", "choose a file to upload")
        filename, data = upload
        library = self.pipeline.synthesizer.chimes
        folder = Path(self.settings.chimes.dir)
        return await asyncio.get_running_loop().run_in_executor(
            None, save_chime, library, folder, fields.get("name"), str(filename or ""), data
        )

    def _chime_remove(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        return remove_chime(Path(self.settings.chimes.dir), fields.get("name"))

    # -- pages -----------------------------------------------------------------------------

    def _catalog(self) -> dict[str, Any]:
        catalog = self.pipeline.voices()
        return {
            "default_voice": catalog.default_voice,
            "voices": [asdict(v) for v in catalog.voices],
            "presets": [asdict(v) for v in catalog.presets],
        }

    def _speak_page(self, request: web.Request, can_change: bool) -> str:
        body = pages.speak_page(self._catalog(), self.control.chimes()["chimes"])
        return self._wrap(request, "Speak", "speak", body, notes=False)

    def _pronunciations_page(self, request: web.Request, can_change: bool) -> str:
        entries = self.control.lexicon()["entries"]
        body = pages.pronunciations_page(entries, self._catalog(), can_change)
        return self._wrap(request, "Pronunciations", "pronunciations", body, notes=True)

    def _voices_page(self, request: web.Request, can_change: bool) -> str:
        health = self.health()
        engines = self.pipeline.synthesizer.engines
        loaded = set(engines.loaded())
        memory = engines.resident_mb()
        rtf = health.get("rtf") or {}
        try:  # voices added at run time live in the voices file; the others are configured
            own = set(read_voices(self.settings.voices_file))
        except VoicesFileError:
            own = set()
        voices = []
        for voice in engines:
            identity = voice.engine.identity
            voices.append(
                {
                    "name": voice.name,
                    "engine": voice.engine.name,
                    "languages": sorted(voice.engine.languages),
                    "sample_rate": voice.engine.sample_rate,
                    "tier": voice.tier,
                    "fast_voice": voice.settings.fast_voice,
                    "loaded": identity in loaded,
                    "memory_mb": memory.get(identity),
                    "rtf": rtf.get(identity),
                    "removable": voice.name in own,
                }
            )
        body = pages.voices_page(voices, self._catalog(), can_change)
        return self._wrap(request, "Voices", "voices", body, notes=True)

    def _chimes_page(self, request: web.Request, can_change: bool) -> str:
        body = pages.chimes_page(self.control.chimes()["chimes"], can_change)
        return self._wrap(request, "Chimes", "chimes", body, notes=True)

    def _phrases_page(self, request: web.Request, can_change: bool) -> str:
        body = pages.phrases_page(
            self.control.phrases()["phrases"], self.control.cache_stats(), can_change
        )
        return self._wrap(request, "Phrases and cache", "phrases", body, notes=True)

    def _activity_page(self, request: web.Request, can_change: bool) -> str:
        entries = [asdict(x) for x in self.activity.entries()]
        body = pages.activity_page(self._state(), entries)
        return self._wrap(request, "Activity", "activity", body, notes=False)

    def _status_page(self, request: web.Request, can_change: bool) -> str:
        body = self.status() if self.status is not None else "<p>No status here.</p>"
        return self._wrap(request, "Status", "status", body, notes=False)

    def _state(self) -> dict[str, Any]:
        health = self.health()
        keys = (
            "status",
            "degraded",
            "queue_lanes",
            "active",
            "background_pending",
            "answers",
            "queue_doors",
            "busy_refusals",
            "last_latency_ms",
            "rss_mb",
        )
        state = {key: health.get(key) for key in keys}
        state["connected"] = "mqtt" not in (health.get("degraded") or {})
        return state

    # -- sign-in, files, events ------------------------------------------------------------

    async def _login_form(self, request: web.Request) -> web.StreamResponse:
        self.access.check_ingress(request)
        if not self.access.keys.required or self.access.via_ingress(request):
            raise web.HTTPSeeOther(location="./")
        return _html(pages.layout("Sign in", "", pages.login_page(failed=False)))

    async def _login(self, request: web.Request) -> web.StreamResponse:
        self.access.check_ingress(request)
        if not self.access.same_origin(request):
            raise web.HTTPForbidden(text="cross-origin request refused\n")
        if request.content_length is None or request.content_length > MAX_FORM_BYTES:
            raise web.HTTPRequestEntityTooLarge(MAX_FORM_BYTES, request.content_length or 0)
        form = await request.post()
        offered = form.get("key")
        token = self.access.sign_in(offered if isinstance(offered, str) else "")
        if token is None:
            _LOGGER.warning("Web UI sign-in from %s refused: not a key", request.remote)
            page = pages.layout("Sign in", "", pages.login_page(failed=True))
            return _html(page, status=401)
        response = web.HTTPSeeOther(location="./")
        response.set_cookie(
            SESSION_COOKIE,
            token,
            max_age=SESSION_TTL_S,
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )
        raise response

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        if not self.access.same_origin(request):
            raise web.HTTPForbidden(text="cross-origin request refused\n")
        self.access.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = web.HTTPSeeOther(location="login")
        response.del_cookie(SESSION_COOKIE)
        raise response

    async def _static_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        data = self._static.get(name)
        if data is None:
            raise web.HTTPNotFound()
        return web.Response(
            body=data,
            content_type=_STATIC[name],
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    async def _chime(self, request: web.Request) -> web.StreamResponse:
        self.access.require(request, Level.VIEW, changes=False)
        library = self.pipeline.synthesizer.chimes
        try:
            data = await asyncio.get_running_loop().run_in_executor(
                None, chime_wav, library, request.match_info["name"]
            )
        except ControlError:
            raise web.HTTPNotFound() from None
        return web.Response(body=data, content_type="audio/wav")

    async def _shutdown(self, app: web.Application) -> None:
        self._closing = True

    async def _events(self, request: web.Request) -> web.StreamResponse:
        self.access.require(request, Level.VIEW, changes=False)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        await response.prepare(request)
        queue = self.activity.watch()
        loop = asyncio.get_running_loop()
        try:
            await response.write(b"retry: 5000\n\n")
            while not self._closing:
                state = await loop.run_in_executor(None, self._state)
                await response.write(sse("state", state).encode())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STATE_EVERY_S):
                        while True:
                            await response.write((await queue.get()).encode())
        except ConnectionError:
            pass  # the page was closed
        finally:
            self.activity.unwatch(queue)
        return response


def _html(page: str, status: int = 200) -> web.Response:
    return web.Response(
        text=page,
        status=status,
        content_type="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": _CSP,
            "Referrer-Policy": "same-origin",
        },
    )


def _error(code: str, message: str) -> web.Response:
    status = 500 if code in _SERVER_ERRORS else 503 if code == "busy" else 400
    return web.json_response(
        {"error": {"code": code, "message": message}},
        status=status,
        headers={"Cache-Control": "no-store"},
    )
