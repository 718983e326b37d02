"""A subset of SSML for announcements: pauses, speaking rate, spelled and read-out digits, spoken
substitutes, chimes.

Supported: ``<speak>`` (the root), ``<p>`` and ``<s>`` (sentence breaks), ``<break time strength>``,
``<prosody rate>`` (other prosody attributes are ignored), ``<say-as interpret-as>`` (characters,
spell-out, digits, telephone, cardinal, ordinal, date, time), ``<sub alias>``, and ``<audio
src="CHIME">`` before or after all the words (a chime). Any other element is spoken as its text.

Parsed with defusedxml: a DOCTYPE, entity declarations and external references are refused (no
"billion laughs", no file reads); so are documents nested deeper than ``MAX_DEPTH`` or with more
than ``MAX_ELEMENTS`` elements. Every refusal is an SsmlError with the line and column where
the parser stopped.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import defusedxml
import defusedxml.ElementTree

MAX_DEPTH = 16
MAX_ELEMENTS = 500
MAX_BREAK_MS = 10_000
_STRENGTH_MS = {
    "none": 0,
    "x-weak": 100,
    "weak": 200,
    "medium": 400,
    "strong": 700,
    "x-strong": 1000,
}
_RATE_WORDS = {
    "x-slow": 0.6,
    "slow": 0.8,
    "medium": 1.0,
    "default": 1.0,
    "fast": 1.25,
    "x-fast": 1.5,
}
_MIN_RATE, _MAX_RATE = 0.25, 4.0
_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$")
_ORDINAL_SUFFIX = {1: "st", 2: "nd", 3: "rd"}


class SsmlError(ValueError):
    """SSML that is refused; the message says what and where."""


@dataclass
class Piece:
    """Words spoken at one rate, and the silence before them (None: the usual pause)."""

    text: str
    rate: float
    pause_before_ms: int | None
    joined: bool = False
    """Only the rate changed: the words may go on the sentence before them (no pause)."""


@dataclass
class Script:
    """What an SSML document says, in order."""

    pieces: list[Piece] = field(default_factory=list)
    trailing_ms: int = 0
    """Silence after the last words (a break at the end)."""
    chime: str | None = None
    chime_after: str | None = None


def is_ssml(text: str) -> bool:
    """Whether a text is meant as SSML: it starts with a <speak> element, or an XML
    declaration or DOCTYPE (which, as SSML, is refused rather than read out)."""
    return text.lstrip().startswith(("<speak", "<?xml", "<!DOCTYPE"))


def _where(exc: ET.ParseError) -> str:
    line, column = exc.position
    return f"line {line}, column {column + 1}"


def _declaration_position(text: str) -> str:
    """Where the first declaration (<!DOCTYPE, <!ENTITY) starts; defusedxml does not say."""
    index = text.find("<!")
    if index < 0:
        return "in the document"
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {column}"


def parse(text: str) -> Script:
    """Parse an SSML document into pieces to speak; raises SsmlError."""
    try:
        root = defusedxml.ElementTree.fromstring(
            text.strip(), forbid_dtd=True, forbid_entities=True, forbid_external=True
        )
    except ET.ParseError as exc:
        raise SsmlError(f"SSML is not well-formed XML at {_where(exc)}: {_reason(exc)}") from None
    except defusedxml.DefusedXmlException as exc:
        raise SsmlError(
            f"SSML with a DOCTYPE, entities or external references is refused "
            f"({type(exc).__name__} at {_declaration_position(text.strip())})"
        ) from None
    if _tag(root) != "speak":
        raise SsmlError(f"SSML must start with <speak>, not <{_tag(root)[:32]}>")
    _check_shape(root)
    builder = _Builder()
    builder.element(root, 1.0)
    return builder.finish()


def _reason(exc: ET.ParseError) -> str:
    message = str(exc)
    return message.split(":", maxsplit=1)[0] if ":" in message else message


def _tag(element: ET.Element) -> str:
    tag = element.tag if isinstance(element.tag, str) else ""
    return tag.rsplit("}", 1)[-1]  # {http://www.w3.org/2001/10/synthesis}speak -> speak


def _check_shape(root: ET.Element) -> None:
    """Depth and size, walked without recursion (the walk that speaks it recurses)."""
    count = 0
    stack = [(root, 1)]
    while stack:
        element, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise SsmlError(f"SSML is nested more than {MAX_DEPTH} levels deep (<{_tag(element)}>)")
        if count > MAX_ELEMENTS:
            raise SsmlError(f"SSML has more than {MAX_ELEMENTS} elements")
        stack.extend((child, depth + 1) for child in element)


class _Builder:
    def __init__(self) -> None:
        self.script = Script()
        self._pause: int | None = None  # silence owed before the next words
        self._split = False  # a sentence break owed (p, s)
        self._audio_before: list[str] = []
        self._after_at: int | None = None  # the number of pieces when the closing chime came

    def words(self, text: str | None, rate: float) -> None:
        if not text or not text.strip():
            return
        if self._after_at is not None:
            raise SsmlError("<audio> chimes go before or after all the words, not between them")
        pieces = self.script.pieces
        if self._pause is None and not self._split and pieces and pieces[-1].rate == rate:
            pieces[-1].text += text  # the same sentence goes on
            return
        joined = self._pause is None and not self._split and bool(pieces)
        pieces.append(Piece(text, rate, self._pause, joined))
        self._pause = None
        self._split = False

    def pause(self, ms: int) -> None:
        self._pause = (self._pause or 0) + ms

    def element(self, element: ET.Element, rate: float) -> None:
        tag = _tag(element)
        if tag == "break":
            self.pause(_break_ms(element))
        elif tag == "audio":
            self._audio(element)
        elif tag == "sub":
            alias = element.get("alias")
            if alias is None:
                raise SsmlError("<sub> needs an alias attribute")
            self.words(f" {alias} ", rate)
        elif tag == "say-as":
            self.words(f" {say_as(element.get('interpret-as', ''), _text_of(element))} ", rate)
        else:
            self._container(element, tag, rate)

    def _container(self, element: ET.Element, tag: str, rate: float) -> None:
        """An element whose text and children are spoken (<speak>, <p>, <prosody>, and any
        element this subset does not know); the text after each child is this element's."""
        inner = rate * _rate(element.get("rate")) if tag == "prosody" else rate
        inner = min(max(inner, _MIN_RATE), _MAX_RATE)
        sentence = tag in ("p", "s", "paragraph", "sentence")
        self._split = self._split or sentence
        self.words(element.text, inner)
        for child in element:
            self.element(child, inner)
            self.words(child.tail, inner)
        self._split = self._split or sentence

    def _audio(self, element: ET.Element) -> None:
        src = element.get("src", "").strip()
        if not src:
            raise SsmlError("<audio> needs a src attribute naming a chime")
        if not self.script.pieces:
            self._audio_before.append(src)
        elif self._after_at is not None:
            raise SsmlError("only one <audio> chime after the words is supported")
        else:
            # Words after it are refused (see `words`): a chime between words has no place.
            self.script.chime_after = src
            self._after_at = len(self.script.pieces)

    def finish(self) -> Script:
        script = self.script
        if len(self._audio_before) > 1:
            raise SsmlError("only one <audio> chime before the words is supported")
        if self._audio_before:
            script.chime = self._audio_before[0]
        script.trailing_ms = self._pause or 0
        return script


def _text_of(element: ET.Element) -> str:
    return "".join(element.itertext())


def _break_ms(element: ET.Element) -> int:
    time = element.get("time")
    if time is not None:
        match = _TIME_RE.match(time)
        if match is None:
            raise SsmlError(
                f"<break time={time[:20]!r}>: give milliseconds or seconds ('500ms', '1.5s')"
            )
        value = float(match.group(1)) * (1000 if match.group(2) == "s" else 1)
        if value > MAX_BREAK_MS:
            raise SsmlError(f"<break> of {value:g} ms is longer than {MAX_BREAK_MS} ms")
        return round(value)
    strength = element.get("strength", "medium")
    if strength not in _STRENGTH_MS:
        raise SsmlError(f"<break strength={strength[:20]!r}>: one of {', '.join(_STRENGTH_MS)}")
    return _STRENGTH_MS[strength]


def _rate(value: str | None) -> float:
    """An SSML prosody rate as a factor: a word, a percentage of the normal rate ("80%"), a
    relative change ("+20%", "-10%"), or a number."""
    if value is None:
        return 1.0
    value = value.strip()
    if value in _RATE_WORDS:
        return _RATE_WORDS[value]
    try:
        if value.endswith("%"):
            number = float(value[:-1])
            return 1 + number / 100 if value[0] in "+-" else number / 100
        return float(value)
    except ValueError:
        raise SsmlError(
            f"<prosody rate={value[:20]!r}>: a word ({', '.join(_RATE_WORDS)}), a percentage "
            "or a number"
        ) from None


def say_as(kind: str, text: str) -> str:
    """How a <say-as> text is given to the voice."""
    text = " ".join(text.split())
    if kind in ("characters", "spell-out", "verbatim"):
        return " ".join(c for c in text if not c.isspace())
    if kind == "digits":
        return " ".join(c for c in text if c.isdigit())
    if kind == "telephone":
        # Each digit on its own; the number's groups as short pauses.
        groups = [g for g in re.split(r"[^\d+]+", text) if g]
        return ", ".join(" ".join("plus" if c == "+" else c for c in g) for g in groups)
    if kind == "ordinal" and text.isdigit():
        number = int(text)
        suffix = "th" if 10 <= number % 100 <= 20 else _ORDINAL_SUFFIX.get(number % 10, "th")
        return f"{number}{suffix}"
    # cardinal, date, time and anything else: the text front end reads numbers and times.
    return text
