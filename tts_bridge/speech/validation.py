"""Validation: a door's request -> a plan (the voice or preset, the sentences, the language,
the options, the chimes, SSML's pauses and rates). Cheap, no model: it runs on any thread.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tts_bridge.config import Settings
from tts_bridge.engines.base import SynthesisOptions
from tts_bridge.engines.registry import EnginePool, Voice
from tts_bridge.speech.chimes import ChimeError, ChimeLibrary
from tts_bridge.speech.request import Announcement, SpeechRequest
from tts_bridge.text.normalize import detect_language
from tts_bridge.text.sentences import clean, has_cjk, is_speakable, split_sentences
from tts_bridge.text.ssml import Script, SsmlError, is_ssml
from tts_bridge.text.ssml import parse as parse_ssml

_LOGGER = logging.getLogger(__name__)

_SENTENCE_ENDS = (".", "!", "?", "。", "！", "？", "…")
_SSML_MARKUP_FACTOR = 4
"""An SSML document may be this many times the text limit (its markup is not spoken)."""


class RequestError(Exception):
    """A request that cannot be served; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def prepare_text(text: str, max_chars: int) -> list[str]:
    """Validate and split user text; raises RequestError with a user-facing reason."""
    if not text.strip():
        raise RequestError("empty_text", "the text is empty")
    cleaned = clean(text)
    if len(cleaned) > max_chars:
        raise RequestError(
            "text_too_long", f"the text has {len(cleaned)} characters; the limit is {max_chars}"
        )
    if not cleaned or not is_speakable(cleaned):
        raise RequestError(
            "nothing_speakable", "the text has no letters or digits to speak (only symbols?)"
        )
    return [s for s in split_sentences(cleaned) if is_speakable(s)]


@dataclass(frozen=True)
class Plan:
    """A validated request: the voice asked for, the sentences and the language spoken."""

    voice: Voice
    sentences: list[str]
    language: str | None
    overrides: dict[str, object]
    """The request's own synthesis options (applied to whichever voice answers)."""
    options: SynthesisOptions
    """The options for `voice`, validated."""
    others: tuple[Voice | None, ...] = ()
    """Per sentence, the voice that speaks it instead of the rendering voice because that one
    does not speak its language (None: the rendering voice); empty when there is none."""
    chime: str | None = None
    """The chime before the speech."""
    chime_after: str | None = None
    """The chime after the speech."""
    gaps_ms: tuple[int, ...] = ()
    """Silence before each sentence and after the last (len(sentences) + 1; SSML breaks);
    empty = the configured sentence pause between sentences."""
    rates: tuple[float, ...] = ()
    """Per sentence, a factor on the speed (SSML prosody rate); empty = 1 for all."""


def options_for(voice: Voice, overrides: Mapping[str, object] | None = None) -> SynthesisOptions:
    """The voice's options with a request's overrides, validated by the engine's type.

    Raises RequestError('invalid_options') for an unknown option or a value out of range.
    """
    fields: dict[str, Any] = {"speed": voice.settings.speed, **voice.settings.options}
    fields.update(overrides or {})
    kind = voice.spec.options
    names = [f.name for f in dataclasses.fields(kind) if f.init]
    known = ", ".join(names)
    unknown = [name for name in fields if name not in names]
    if unknown:
        # In the bridge's words, not the dataclass's "unexpected keyword argument".
        raise RequestError(
            "invalid_options",
            f"unknown option {unknown[0]!r} for voice {voice.name}; "
            f"{voice.engine.name} options are {known}",
        )
    try:
        return kind(**fields)
    except TypeError:
        raise RequestError(
            "invalid_options", f"{voice.engine.name} options are {known}, each a number"
        ) from None
    except ValueError as exc:
        raise RequestError("invalid_options", str(exc)) from None


def options_for_plan(voice: Voice, plan: Plan) -> SynthesisOptions:
    """The options `voice` renders `plan` with: the plan's own for its voice; for the fast
    voice, the request's speed carries over, engine-only options do not."""
    if voice is plan.voice:
        return plan.options
    speed = plan.overrides.get("speed")
    return options_for(voice, {"speed": speed} if speed is not None else None)


class Validator:
    """Checks requests against the configured voices, presets, chimes and limits."""

    def __init__(self, settings: Settings, engines: EnginePool, chimes: ChimeLibrary) -> None:
        self._settings = settings
        self.engines = engines
        self.chimes = chimes

    def plan(self, request: SpeechRequest) -> Plan:
        """`validate` for a door's request."""
        return self.validate(
            request.text, request.voice, request.language, request.options, request.announcement
        )

    def validate(
        self,
        text: str,
        voice_name: str | None,
        lang: str | None,
        options: Mapping[str, object] | None = None,
        announcement: Announcement | None = None,
    ) -> Plan:
        """Check a request cheaply (no model): the voice (or preset), the text, the language,
        the options, the chimes.

        Raises UnknownVoiceError or RequestError.
        """
        announcement = announcement or Announcement()
        preset = self._settings.presets.get(voice_name) if voice_name else None
        voice = self.engines.voice(preset.voice if preset is not None else voice_name)
        if not (announcement.ssml if announcement.ssml is not None else is_ssml(text)):
            sentences = prepare_text(text, self._settings.limits.max_text_chars)
            plan = self._validate_speech(voice, sentences, lang, options)
        else:
            script = self._parse_ssml(text)
            sentences, gaps, rates = self._ssml_sentences(script)
            plan = self._validate_speech(voice, sentences, lang, options)
            plan = dataclasses.replace(plan, gaps_ms=tuple(gaps), rates=tuple(rates))
            # A chime in the SSML is the request's own, unless the request names one too.
            announcement = dataclasses.replace(
                announcement,
                chime=announcement.chime if announcement.chime is not None else script.chime,
                chime_after=(
                    announcement.chime_after
                    if announcement.chime_after is not None
                    else script.chime_after
                ),
            )
        chime, after = self._chimes_for(voice_name, announcement)
        if chime or after:
            plan = dataclasses.replace(plan, chime=chime, chime_after=after)
        return plan

    def _parse_ssml(self, text: str) -> Script:
        limit = self._settings.limits.max_text_chars
        # Markup is not speech, but a document many times the text limit is not an announcement.
        if len(text) > _SSML_MARKUP_FACTOR * limit:
            raise RequestError(
                "text_too_long",
                f"the SSML has {len(text)} characters; the limit is {_SSML_MARKUP_FACTOR * limit}",
            )
        try:
            return parse_ssml(text)
        except SsmlError as exc:
            raise RequestError("invalid_ssml", str(exc)) from None

    def _ssml_sentences(self, script: Script) -> tuple[list[str], list[int], list[float]]:
        """The sentences of an SSML script, the silence before each and after the last (ms),
        and each one's rate."""
        # The whole text is checked as plain text is (empty, too long, nothing to say).
        prepare_text(" ".join(p.text for p in script.pieces), self._settings.limits.max_text_chars)
        pause = self._settings.synthesis.sentence_pause_ms
        sentences: list[str] = []
        gaps: list[int] = []
        rates: list[float] = []
        owed: int | None = 0  # silence before the next sentence; None: the usual pause
        for piece in script.pieces:
            if piece.pause_before_ms is not None:
                owed = piece.pause_before_ms if owed is None else owed + piece.pause_before_ms
            elif piece.joined and sentences and not sentences[-1].endswith(_SENTENCE_ENDS):
                owed = 0  # a rate change inside a sentence: no pause where none is written
            for sentence in split_sentences(clean(piece.text)):
                if not is_speakable(sentence):
                    continue
                gaps.append(pause if owed is None else owed)
                sentences.append(sentence)
                rates.append(piece.rate)
                owed = None
        gaps.append(script.trailing_ms + (owed or 0))
        if sum(gaps) / 1000 > self._settings.limits.max_audio_s:
            raise RequestError(
                "invalid_ssml",
                f"the breaks add up to {sum(gaps) / 1000:.0f} s; the limit is "
                f"{self._settings.limits.max_audio_s:g} s of audio",
            )
        return sentences, gaps, rates

    def _chimes_for(
        self, voice_name: str | None, announcement: Announcement
    ) -> tuple[str | None, str | None]:
        """The request's chimes: its own, else its preset's, else its target's ("" = none)."""
        preset = self._settings.presets.get(voice_name) if voice_name else None
        chosen: list[str | None] = []
        for own, of_preset, default in (
            (announcement.chime, preset.chime if preset else None, announcement.default_chime),
            (
                announcement.chime_after,
                preset.chime_after if preset else None,
                announcement.default_chime_after,
            ),
        ):
            name = next((n for n in (own, of_preset, default) if n is not None), None)
            if name:
                try:
                    self.chimes.check(name)
                except ChimeError as exc:
                    raise RequestError(exc.code, str(exc)) from None
            chosen.append(name or None)
        return chosen[0], chosen[1]

    def _validate_speech(
        self,
        voice: Voice,
        sentences: list[str],
        lang: str | None,
        options: Mapping[str, object] | None,
    ) -> Plan:
        if lang is not None:  # asked for: the whole text, by this voice
            self._check_language(voice, lang)
            return Plan(voice, sentences, lang, dict(options or {}), options_for(voice, options))
        # Each sentence's language is what most of it is: an English sentence with a Chinese name
        # is English (its voice reads the name in pinyin); a Chinese sentence goes to a voice
        # that speaks Chinese when this one does not.
        chinese = [has_cjk(s) and detect_language(s) == "zh" for s in sentences]
        others: list[Voice | None] = [None] * len(sentences)
        if any(chinese) and "zh" not in voice.engine.languages:
            other = self._voice_speaking("zh")
            if other is None:
                self._check_language(voice, "zh")  # raises: no voice here speaks Chinese
            others = [other if c else None for c in chinese]
        spoken = (
            "zh" if any(c and o is None for c, o in zip(chinese, others, strict=True)) else None
        )
        return Plan(
            voice,
            sentences,
            spoken,
            dict(options or {}),
            options_for(voice, options),
            tuple(others) if any(others) else (),
        )

    @staticmethod
    def _check_language(voice: Voice, lang: str) -> None:
        if lang not in voice.engine.languages:
            raise RequestError(
                "unsupported_language",
                f"voice {voice.name!r} speaks {', '.join(sorted(voice.engine.languages))}, "
                f"not {lang!r}",
            )

    def _voice_speaking(self, lang: str) -> Voice | None:
        """The first configured voice that speaks ``lang`` (the default voice first)."""
        default = self.engines.voice(None)
        if lang in default.engine.languages:
            return default
        return next((v for v in self.engines if lang in v.engine.languages), None)
