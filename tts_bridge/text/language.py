"""Languages as modules: one front end per language behind one small protocol, and the registry
that finds them.

A front end says how much of a text is written in its language (``detect``), reads numbers,
dates, times, units and amounts in it (``numbers``, used by the shared rules of
:mod:`tts_bridge.text.numbers`), and makes a sentence what a voice of its language is given
(``for_voice``). The bridge comes with English and Mandarin (``tts_bridge/text/languages/``).

Adding a language (German, say) is one module, ``tts_bridge/text/languages/german.py``, whose
``FRONT_END`` implements :class:`LanguageFrontEnd`, plus its line in ``BUILT_IN``. A voice whose
engine names the language (a Piper voice's config does) then gets that front end; without one,
such a voice keeps its phonemizer's own reading (espeak's, for Piper).
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tts_bridge.text.numbers import DateOrder, NumberReader

BUILT_IN = (
    "tts_bridge.text.languages.english",
    "tts_bridge.text.languages.mandarin",
)
"""The modules of the languages that come with the bridge; each has a ``FRONT_END``. The
order matters only for ties in ``detect``: the first wins."""


class LanguageFrontEnd(Protocol):
    """One language as the text front end knows it."""

    @property
    def code(self) -> str:
        """The ISO 639-1 code: "en", "zh"."""

    @property
    def names(self) -> frozenset[str]:
        """Every primary tag or name a request may give for it ("zh", "cmn", "chinese")."""

    @property
    def numbers(self) -> NumberReader:
        """How numbers, dates, times, units and amounts are read in the language."""

    def detect(self, text: str) -> int:
        """How much of ``text`` is in the language (its words, or characters where one
        carries a word's worth of speech); a text whose language is not given is read in the
        language with the most."""

    def for_voice(self, text: str, *, date_order: DateOrder) -> str:
        """``text`` as a voice of the language is given it (numbers spelled out, and what
        else its phonemizer would misread)."""


class _Registry:
    """The front ends by code; the built-in ones are imported at the first look-up."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._front_ends: dict[str, LanguageFrontEnd] = {}
        self._loaded = False

    def _load_built_in(self) -> None:
        # Imported by name (as the engine catalog does): a language module may use the text
        # functions that look languages up here.
        for module in BUILT_IN:
            front_end: LanguageFrontEnd = importlib.import_module(module).FRONT_END
            self._front_ends.setdefault(front_end.code, front_end)
        self._loaded = True

    def all(self) -> dict[str, LanguageFrontEnd]:
        """The registered front ends; call holding the lock."""
        if not self._loaded:
            self._load_built_in()
        return self._front_ends

    @property
    def lock(self) -> threading.RLock:
        return self._lock


_REGISTRY = _Registry()


def register(front_end: LanguageFrontEnd) -> LanguageFrontEnd:
    """Add (or replace) the front end of ``front_end.code``; returns it."""
    with _REGISTRY.lock:
        _REGISTRY.all()[front_end.code] = front_end
    return front_end


def unregister(code: str) -> None:
    """Forget the front end of ``code`` (a test's own language)."""
    with _REGISTRY.lock:
        _REGISTRY.all().pop(code, None)


def front_ends() -> tuple[LanguageFrontEnd, ...]:
    """Every registered front end, the built-in ones first."""
    with _REGISTRY.lock:
        return tuple(_REGISTRY.all().values())


def get(code: str) -> LanguageFrontEnd | None:
    """The front end of the language ``code`` ("en"), or None when none is registered."""
    with _REGISTRY.lock:
        return _REGISTRY.all().get(code)


def resolve(tag: str | None) -> LanguageFrontEnd | None:
    """The front end of a language tag ("en", "zh-CN", "chinese"); None for None, "" or
    "auto" (detect it). Raises ValueError for a language without a front end."""
    if tag is None:
        return None
    cleaned = tag.strip().lower().replace("_", "-")
    if cleaned in ("", "auto"):
        return None
    primary = cleaned.split("-", 1)[0]
    known = front_ends()
    for front_end in known:
        if primary in front_end.names:
            return front_end
    expected = ", ".join(repr(f.code) for f in known)
    raise ValueError(f"unsupported language {tag!r}: expected {expected} or None")


def detect(text: str) -> LanguageFrontEnd:
    """The front end of the language most of ``text`` is in (the first registered on a tie)."""
    known = front_ends()
    return max(known, key=lambda front_end: front_end.detect(text))
