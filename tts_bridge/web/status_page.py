"""The audio server's status page at ``/``: what the bridge is and how it is doing, as plain HTML.

It is Home Assistant's "Visit" link of the device. It shows what bridge/info and bridge/health
already publish, picked field by field: never an audio URL or the server's key (URLs are the
only secret guarding the audio), never a request's text. Every value is escaped, since voice
names and descriptions come from the settings.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

# (label, health key, unit): the counters worth a glance; the rest stays in bridge/health.
_HEALTH_ROWS = (
    ("Queue depth", "queue_depth", ""),
    ("Synthesizing now", "active", ""),
    ("Estimated backlog", "estimated_backlog_s", " s"),
    ("Answers", "answers", ""),
    ("Tier in use", "tier_in_use", ""),
    ("Last latency", "last_latency_ms", " ms"),
    ("Cache hit rate", "cache_hit_rate", ""),
    ("Cache entries", "cache_entries", ""),
    ("Background work pending", "background_pending", ""),
    ("Resident memory", "rss_mb", " MB"),
    ("Uptime", "uptime_s", " s"),
)


def render(
    name: str,
    info: Mapping[str, Any],
    health: Mapping[str, Any],
    wyoming: str,
) -> str:
    """The page from the bridge's info and health reports (`Reports.info()`, `.health()`);
    `wyoming` says what the Wyoming server does (`wyoming_state`)."""
    version = str(info.get("version", ""))
    title = f"{name} {version}".strip()
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title></head><body>\n"
        f"<h1>{_e(name)}</h1>\n"
        f"{render_section(info, health, wyoming)}"
        "</body></html>\n"
    )


def render_section(info: Mapping[str, Any], health: Mapping[str, Any], wyoming: str) -> str:
    """The page's content without the document around it (the web UI's Status section)."""
    version = str(info.get("version", ""))
    default_voice = str(info.get("default_voice", ""))
    voices: Mapping[str, Mapping[str, Any]] = info.get("voices") or {}
    voice_rows = "".join(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
            _e(voice) + (" (default)" if voice == default_voice else ""),
            _e(details.get("engine")),
            _e(details.get("tier")),
            _e(", ".join(str(lang) for lang in details.get("languages") or ())),
            _e(details.get("description")),
        )
        for voice, details in voices.items()
    )
    health_rows = "".join(
        f'<tr><th scope="row">{_e(label)}</th>'
        f"<td>{_e(_value(key, health.get(key)))}{_e(unit)}</td></tr>"
        for label, key, unit in _HEALTH_ROWS
        if key in health
    )
    return (
        f"<p>Version {_e(version)}. Default voice: <b>{_e(default_voice)}</b>. "
        f"Wyoming: {_e(wyoming)}.</p>\n"
        "<h2>Voices</h2>\n"
        # In the web UI a .scroll table becomes one card per row on a phone.
        '<div class="scroll"><table><thead><tr><th scope="col">Voice</th>'
        '<th scope="col">Engine</th><th scope="col">Tier</th><th scope="col">Languages</th>'
        f'<th scope="col">Description</th></tr></thead><tbody>{voice_rows}</tbody></table></div>\n'
        f'<h2>Health</h2>\n<div class="scroll"><table><tbody>{health_rows}</tbody></table></div>\n'
    )


def wyoming_state(enabled: bool, serving: bool, port: int) -> str:
    """The Wyoming line of the page: the port only while the server really listens on it, so a
    port taken by another program shows here and not only in the log."""
    if not enabled:
        return "off"
    if serving:
        return f"port {port}"
    return f"not listening (port {port} could not be opened; see the log)"


def counts(value: Any) -> str:
    """{"quality": 2, "fast": 0} as "quality: 2" (zeros left out; "none" when all are)."""
    if not isinstance(value, Mapping):
        return "none"
    return ", ".join(f"{k}: {v}" for k, v in value.items() if v) or "none"


def _value(key: str, value: Any) -> str:
    if value is None:
        return "–"
    if key == "cache_hit_rate" and isinstance(value, int | float):
        return f"{value:.0%}"
    if isinstance(value, Mapping):  # counts per tier or door, not a Python dict's repr
        return counts(value)
    return str(value)


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))
