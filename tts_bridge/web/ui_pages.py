"""The web UI's pages as HTML, rendered on the server from plain data (no template engine).

Every URL in a page is relative (``voices``, ``ui/speak``, ``audio/…``), so the same pages work
at ``http://host:10201/`` and under Home Assistant's ingress prefix. Every value is escaped.
Forms work with the small script in ``static/ui.js``; labels, headings and a live status line
make them usable with a keyboard and a screen reader.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tts_bridge.web.status_page import counts

PAGES = (
    ("./", "speak", "Speak"),
    ("pronunciations", "pronunciations", "Pronunciations"),
    ("voices", "voices", "Voices"),
    ("chimes", "chimes", "Chimes"),
    ("phrases", "phrases", "Phrases and cache"),
    ("activity", "activity", "Activity"),
    ("status", "status", "Status"),
)
PRIORITIES = ("normal", "high", "alert", "low")
SAMPLE_SENTENCE = "Dinner is ready."


def e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def layout(
    title: str,
    page: str,
    body: str,
    *,
    notice: str | None = None,
    signed_in: bool = False,
) -> str:
    current = ' aria-current="page"'
    links = "".join(
        f'<li><a href="{href}"{current if key == page else ""}>{e(label)}</a></li>'
        for href, key, label in PAGES
    )
    sign_out = (
        '<form method="post" action="logout" class="signout">'
        '<button type="submit">Sign out</button></form>'
        if signed_in
        else ""
    )
    banner = f'<p class="notice" role="note">{e(notice)}</p>' if notice else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · TTS Bridge</title>"
        '<link rel="icon" href="ui/static/icon.svg" type="image/svg+xml">'
        '<link rel="stylesheet" href="ui/static/ui.css">'
        '<script src="ui/static/ui.js" defer></script>'
        "</head><body>\n"
        '<a class="skip" href="#main">Skip to the content</a>\n'
        '<header><p class="brand">TTS Bridge</p>'
        f'<nav aria-label="Pages"><ul>{links}</ul></nav>{sign_out}</header>\n'
        f'<main id="main" tabindex="-1"><h1>{e(title)}</h1>{banner}\n{body}\n</main>\n'
        "</body></html>\n"
    )


def _options(values: Iterable[tuple[str, str]], selected: str | None = None) -> str:
    return "".join(
        f'<option value="{e(v)}"{" selected" if v == selected else ""}>{e(label)}</option>'
        for v, label in values
    )


def voice_options(catalog: Mapping[str, Any], selected: str | None = None) -> str:
    default = catalog["default_voice"]
    voices = [
        (v["name"], v["name"] + (" (default)" if v["name"] == default else ""))
        for v in catalog["voices"]
    ]
    presets = [(p["name"], f"{p['name']} (preset)") for p in catalog["presets"]]
    return _options([*voices, *presets], selected or default)


def status_line(form_id: str) -> str:
    return f'<p class="result" id="{form_id}-status" role="status" aria-live="polite"></p>'


def player(heading: str = "Answer") -> str:
    """Where a spoken answer plays: the audio, how it was made, a download link."""
    return (
        '<section class="player" aria-labelledby="player-h">'
        f'<h2 id="player-h">{e(heading)}</h2>'
        '<audio id="player" controls preload="auto"></audio>'
        '<dl id="details"></dl>'
        '<p><a id="download" href="#" download="speech.wav" hidden>Download the audio</a></p>'
        "</section>"
    )


def _disabled(can_change: bool) -> str:
    return "" if can_change else " disabled"


# -- Speak -------------------------------------------------------------------------------------


def speak_page(catalog: Mapping[str, Any], chimes: Sequence[Mapping[str, str]]) -> str:
    chime_choices = [("default", "Default"), ("none", "None")]
    chime_choices += [(c["name"], c["name"]) for c in chimes]
    return (
        '<form id="speak" class="card" data-action="ui/speak" data-speak>'
        '<label for="speak-text">Text (plain, or SSML starting with &lt;speak&gt;)</label>'
        '<textarea id="speak-text" name="text" rows="4" required maxlength="5000">'
        "</textarea>"
        '<div class="row">'
        f'<p><label for="speak-voice">Voice</label><select id="speak-voice" name="voice">'
        f"{voice_options(catalog)}</select></p>"
        f'<p><label for="speak-chime">Chime</label><select id="speak-chime" name="chime">'
        f"{_options(chime_choices, 'default')}</select></p>"
        f'<p><label for="speak-priority">Priority</label>'
        f'<select id="speak-priority" name="priority">'
        f"{_options((p, p) for p in PRIORITIES)}</select></p>"
        '<p><label for="speak-tier">Tier</label><select id="speak-tier" name="tier">'
        f"{_options([('', 'As the bridge routes it'), ('quality', 'Quality'), ('fast', 'Fast')])}"
        "</select></p></div>"
        '<button type="submit">Speak</button>'
        f"{status_line('speak')}</form>\n{player()}"
    )


# -- Pronunciations ----------------------------------------------------------------------------


def pronunciations_page(
    entries: Sequence[Mapping[str, Any]], catalog: Mapping[str, Any], can_change: bool
) -> str:
    off = _disabled(can_change)
    rows = "".join(
        "<tr>"
        f"<td>{e(entry['word'])}</td><td>{e(entry['say'])}</td>"
        f"<td>{e(entry.get('phonemes', ''))}</td><td>{e(entry.get('source', ''))}</td>"
        '<td class="actions">'
        f'<form data-action="ui/speak" data-speak class="inline">'
        f'<input type="hidden" name="text" value="{e(entry["word"])}">'
        f'<button type="submit" aria-label="Hear {e(entry["word"])}">Hear it</button></form>'
        + (
            '<button type="button" class="edit" data-edit-lexicon '
            f'data-word="{e(entry["word"])}" data-say="{e(entry["say"])}" '
            f'data-phonemes="{e(entry.get("phonemes", ""))}" '
            f'aria-label="Edit {e(entry["word"])}"{off}>Edit</button>'
        )
        + (
            f'<form data-action="ui/lexicon/remove" data-reload class="inline">'
            f'<input type="hidden" name="word" value="{e(entry["word"])}">'
            f'<button type="submit"{off} aria-label="Remove {e(entry["word"])}">Remove</button>'
            "</form>"
            if entry.get("source") != "configuration"
            else ""
        )
        + "</td></tr>"
        for entry in entries
    )
    table = (
        '<div class="scroll"><table><caption>The lexicon: how words are said</caption>'
        '<thead><tr><th scope="col">Word</th><th scope="col">Said as</th>'
        '<th scope="col">Phonemes</th><th scope="col">From</th><th scope="col">Actions</th>'
        f"</tr></thead><tbody>{rows}</tbody></table></div>"
        if entries
        else "<p>No entries yet.</p>"
    )
    return (
        f'<section aria-labelledby="lex-h"><h2 id="lex-h">Entries</h2>{table}</section>'
        '<section aria-labelledby="add-h"><h2 id="add-h">Add or change an entry</h2>'
        '<form id="lexicon" class="card" data-action="ui/lexicon/set" data-reload>'
        '<div class="row">'
        '<p><label for="lex-word">Word</label>'
        '<input id="lex-word" name="word" required maxlength="100"></p>'
        '<p><label for="lex-say">Said as</label>'
        '<input id="lex-say" name="say" required maxlength="200"></p>'
        '<p><label for="lex-phonemes">Phonemes (optional, IPA)</label>'
        '<input id="lex-phonemes" name="phonemes" maxlength="200"></p></div>'
        f'<button type="submit"{off}>Save</button>{status_line("lexicon")}</form></section>'
        '<section aria-labelledby="hear-h"><h2 id="hear-h">Hear it</h2>'
        '<form id="hear" class="card" data-action="ui/speak" data-speak><div class="row">'
        '<p><label for="hear-text">Text</label>'
        '<input id="hear-text" name="text" required maxlength="500"></p>'
        f'<p><label for="hear-voice">Voice</label><select id="hear-voice" name="voice">'
        f"{voice_options(catalog)}</select></p></div>"
        f'<button type="submit">Hear it</button>{status_line("hear")}</form></section>'
        f"{player('Heard')}"
    )


# -- Voices ------------------------------------------------------------------------------------


def voices_page(
    voices: Sequence[Mapping[str, Any]], catalog: Mapping[str, Any], can_change: bool
) -> str:
    off = _disabled(can_change)
    default = catalog["default_voice"]
    rows = []
    for v in voices:
        name = v["name"]
        memory = f"{v['memory_mb']:.0f} MB" if v.get("memory_mb") else "–"
        speed = f"{1 / v['rtf']:.1f}× real time" if v.get("rtf") else "–"
        rows.append(
            "<tr>"
            f'<th scope="row">{e(name)}{" (default)" if name == default else ""}</th>'
            f"<td>{e(v['engine'])}</td><td>{e(', '.join(v['languages']))}</td>"
            f"<td>{e(v['sample_rate'])} Hz</td>"
            f"<td>{e(v['tier'])}{' → ' + e(v['fast_voice']) if v.get('fast_voice') else ''}</td>"
            f"<td>{'yes' if v['loaded'] else 'no'}</td><td>{e(memory)}</td><td>{e(speed)}</td>"
            '<td class="actions">'
            '<form data-action="ui/speak" data-speak class="inline">'
            f'<input type="hidden" name="voice" value="{e(name)}">'
            f'<input type="hidden" name="text" value="{e(SAMPLE_SENTENCE)}">'
            f'<button type="submit" aria-label="Preview {e(name)}">Preview</button></form>'
            '<form data-action="ui/voices/default" data-reload class="inline">'
            f'<input type="hidden" name="voice" value="{e(name)}">'
            f'<button type="submit"{off} aria-label="Make {e(name)} the default">'
            "Make default</button></form>"
            + (
                '<form data-action="ui/voices/remove" data-reload class="inline">'
                f'<input type="hidden" name="name" value="{e(name)}">'
                f'<button type="submit"{off} aria-label="Remove {e(name)}">Remove</button>'
                "</form>"
                if v.get("removable")
                else ""
            )
            + "</td></tr>"
        )
    like = _options((v["name"], v["name"]) for v in voices)
    own = [v["name"] for v in voices if v.get("removable")]
    change = (
        '<form id="update" class="card" data-action="ui/voices/update" data-reload>'
        '<div class="row">'
        '<p><label for="update-name">Voice</label><select id="update-name" name="name">'
        f"{_options((n, n) for n in own)}</select></p>"
        '<p><label for="update-speed">Speed</label>'
        '<input id="update-speed" name="speed" type="number" min="0.5" max="2" step="0.05" '
        'placeholder="unchanged" aria-describedby="update-note"></p>'
        '<p><label for="update-speaker">Speaker</label>'
        '<input id="update-speaker" name="speaker" maxlength="64" placeholder="unchanged" '
        'aria-describedby="update-note"></p>'
        '<p><label for="update-description">Description</label>'
        '<input id="update-description" name="description" maxlength="200" '
        'placeholder="unchanged" aria-describedby="update-note"></p></div>'
        '<p id="update-note" class="hint">A field left empty stays as it is.</p>'
        f'<button type="submit"{off}>Change the voice</button>{status_line("update")}</form>'
        if own
        else "<p>Only voices added here (or in the voices file) can be changed; the "
        "configuration's are changed in the configuration.</p>"
    )
    return (
        '<section aria-labelledby="voices-h"><h2 id="voices-h">Voices</h2>'
        '<div class="scroll"><table><thead><tr><th scope="col">Voice</th>'
        '<th scope="col">Engine</th><th scope="col">Languages</th><th scope="col">Rate</th>'
        '<th scope="col">Tier</th><th scope="col">Loaded</th><th scope="col">Memory</th>'
        '<th scope="col">Speed</th><th scope="col">Actions</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div></section>"
        '<section aria-labelledby="variant-h"><h2 id="variant-h">Add a variant</h2>'
        '<form id="variant" class="card" data-action="ui/voices/add" data-reload>'
        '<div class="row">'
        '<p><label for="variant-name">Name</label><input id="variant-name" name="name" '
        'required pattern="[A-Za-z0-9_\\-]{1,64}" maxlength="64"></p>'
        f'<p><label for="variant-like">Like</label><select id="variant-like" name="like">'
        f"{like}</select></p>"
        '<p><label for="variant-speed">Speed</label><input id="variant-speed" name="speed" '
        'type="number" min="0.5" max="2" step="0.05" value="1"></p>'
        '<p><label for="variant-speaker">Speaker (optional)</label>'
        '<input id="variant-speaker" name="speaker" maxlength="64"></p></div>'
        f'<button type="submit"{off}>Add the variant</button>{status_line("variant")}'
        "</form></section>"
        '<section aria-labelledby="update-h"><h2 id="update-h">Change a variant</h2>'
        f"{change}</section>"
        f"{player('Preview')}"
    )


# -- Chimes ------------------------------------------------------------------------------------


def chimes_page(chimes: Sequence[Mapping[str, str]], can_change: bool) -> str:
    off = _disabled(can_change)
    rows = "".join(
        "<tr>"
        f'<th scope="row">{e(c["name"])}</th><td>{e(c["source"])}</td>'
        f'<td><audio controls preload="none" src="ui/chimes/{e(c["name"])}.wav" '
        f'aria-label="Chime {e(c["name"])}"></audio></td><td class="actions">'
        + (
            '<form data-action="ui/chimes/remove" data-reload class="inline">'
            f'<input type="hidden" name="name" value="{e(c["name"])}">'
            f'<button type="submit"{off} aria-label="Remove {e(c["name"])}">Remove</button>'
            "</form>"
            if c["source"] != "built-in"
            else ""
        )
        + "</td></tr>"
        for c in chimes
    )
    return (
        '<section aria-labelledby="chimes-h"><h2 id="chimes-h">Chimes</h2>'
        '<div class="scroll"><table><thead><tr><th scope="col">Chime</th>'
        '<th scope="col">From</th><th scope="col">Listen</th><th scope="col">Actions</th>'
        f"</tr></thead><tbody>{rows}</tbody></table></div></section>"
        '<section aria-labelledby="upload-h"><h2 id="upload-h">Upload a chime</h2>'
        '<form id="upload" class="card" data-action="ui/chimes/upload" data-reload '
        'enctype="multipart/form-data"><div class="row">'
        '<p><label for="upload-name">Name</label><input id="upload-name" name="name" required '
        'pattern="[A-Za-z0-9_\\-]{1,64}" maxlength="64"></p>'
        '<p><label for="upload-file">File (WAV, FLAC, OGG or MP3, a few seconds)</label>'
        '<input id="upload-file" name="file" type="file" required '
        'accept=".wav,.flac,.ogg,.mp3,audio/*"></p></div>'
        f'<button type="submit"{off}>Upload</button>{status_line("upload")}</form></section>'
    )


# -- Phrases and cache -------------------------------------------------------------------------


_SOURCES = {"configuration": "configuration", "runtime": "added here"}


def _holders(cached: Iterable[Mapping[str, str]]) -> str:
    return ", ".join(f"{c['voice']} ({c['tier']})" for c in cached) or "not yet"


def phrases_page(
    phrases: Sequence[Mapping[str, Any]], stats: Mapping[str, Any], can_change: bool
) -> str:
    off = _disabled(can_change)
    rows = "".join(
        "<tr>"
        f'<th scope="row">{e(p["phrase"])}</th>'
        f"<td>{e(_SOURCES.get(p.get('source', ''), p.get('source')))}</td>"
        f"<td>{e(_holders(p['cached']))}"
        '</td><td class="actions"><form data-action="ui/prerender" class="inline">'
        f'<input type="hidden" name="phrases" value="{e(p["phrase"])}">'
        f'<button type="submit"{off} aria-label="Render {e(p["phrase"])} now">Render now'
        "</button></form>"
        '<form data-action="ui/cache/remove" data-reload class="inline">'
        f'<input type="hidden" name="phrase" value="{e(p["phrase"])}">'
        f'<button type="submit"{off} aria-label="Remove {e(p["phrase"])} from the cache">'
        "Remove from the cache</button></form>"
        + (
            '<form data-action="ui/phrases/remove" data-reload class="inline">'
            f'<input type="hidden" name="phrase" value="{e(p["phrase"])}">'
            f'<button type="submit"{off} aria-label="Remove {e(p["phrase"])} from the list">'
            "Remove</button></form>"
            if p.get("source") == "runtime"
            else ""
        )
        + "</td></tr>"
        for p in phrases
    )
    table = (
        '<div class="scroll"><table><thead><tr><th scope="col">Phrase</th>'
        '<th scope="col">From</th><th scope="col">In the cache</th>'
        '<th scope="col">Actions</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></div>"
        if phrases
        else "<p>No phrases yet (add one below, or configure <code>phrases</code>, "
        "<code>phrases_file</code>).</p>"
    )
    rate = stats.get("hit_rate")
    shown = {**stats, "hit_rate": f"{rate:.0%}" if isinstance(rate, int | float) else rate}
    facts = "".join(
        f"<dt>{e(label)}</dt><dd>{e(shown.get(key))}</dd>"
        for label, key in (
            ("Entries", "entries"),
            ("Size (bytes)", "bytes"),
            ("Hit rate", "hit_rate"),
        )
    )
    return (
        f'<section aria-labelledby="phrases-h"><h2 id="phrases-h">Phrases</h2>{table}'
        '<form id="add-phrase" class="card" data-action="ui/phrases/set" data-reload>'
        '<p><label for="add-phrase-text">Add a phrase (kept, and rendered ahead with the '
        "default voice whenever the bridge is idle)</label>"
        '<input id="add-phrase-text" name="phrase" required maxlength="500"></p>'
        f'<button type="submit"{off}>Add the phrase</button>{status_line("add-phrase")}'
        "</form>"
        '<form id="prerender" class="card" data-action="ui/prerender">'
        '<p><label for="prerender-text">Render a phrase ahead once (not kept in the list)'
        "</label>"
        '<input id="prerender-text" name="phrases" required maxlength="500"></p>'
        f'<button type="submit"{off}>Render ahead</button>{status_line("prerender")}</form>'
        "</section>"
        f'<section aria-labelledby="cache-h"><h2 id="cache-h">Cache</h2><dl>{facts}</dl>'
        '<form id="clear" data-action="ui/cache/clear" data-reload '
        'data-confirm="Remove every sentence from the cache?">'
        f'<button type="submit" class="danger"{off}>Clear the cache</button>'
        f"{status_line('clear')}</form></section>"
    )


# -- Activity ----------------------------------------------------------------------------------


def _latency(value: Any) -> str:
    return "–" if value is None else f"{float(value):.0f} ms"


def activity_rows(entries: Iterable[Mapping[str, Any]]) -> str:
    return "".join(
        "<tr>"
        f"<td>{e(time.strftime('%H:%M:%S', time.localtime(float(x['at']))))}</td>"
        f"<td>{e(x['door'])}</td><td>{e(x.get('voice') or '–')}</td>"
        f"<td>{e(x.get('tier') or '–')}</td>"
        f"<td>{e(_latency(x.get('latency_ms')))}</td>"
        f"<td>{e(x['status'])}</td></tr>"
        for x in entries
    )


def state_facts(state: Mapping[str, Any]) -> str:
    lanes = state.get("queue_lanes") or {}
    lane_text = ", ".join(f"{k}: {sum(v.values())}" for k, v in lanes.items()) or "empty"
    reasons = state.get("degraded") or {}
    items = (
        ("Status", state.get("status", "ok")),
        ("Queue per lane", lane_text),
        ("Synthesizing now", state.get("active")),
        ("Background work pending", state.get("background_pending")),
        ("Queued per door", counts(state.get("queue_doors"))),
        ("Answers since start", counts(state.get("answers"))),
        ("Refused busy", counts(state.get("busy_refusals"))),
        ("Last latency", _latency(state.get("last_latency_ms"))),
        ("Broker", "connected" if state.get("connected") else "not connected"),
        ("Resident memory", f"{state.get('rss_mb')} MB"),
        ("Degraded", "; ".join(f"{k}: {v}" for k, v in reasons.items()) or "nothing"),
    )
    return "".join(f"<dt>{e(label)}</dt><dd>{e(value)}</dd>" for label, value in items)


def activity_page(state: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> str:
    return (
        '<section aria-labelledby="now-h"><h2 id="now-h">Now</h2>'
        f'<dl id="state" aria-live="polite">{state_facts(state)}</dl>'
        '<p class="live" id="live">Live updates are off.</p></section>'
        '<section aria-labelledby="recent-h"><h2 id="recent-h">Recent requests</h2>'
        "<p>The last requests of every door (MQTT, Hermes, Wyoming, HTTP and these pages), "
        "newest first, kept in memory without their text.</p>"
        '<div class="scroll"><table><thead><tr><th scope="col">Time</th>'
        '<th scope="col">Door</th><th scope="col">Voice</th><th scope="col">Tier</th>'
        '<th scope="col">Latency</th><th scope="col">Status</th></tr></thead>'
        f'<tbody id="recent">{activity_rows(entries)}</tbody></table></div></section>'
    )


def login_page(failed: bool) -> str:
    error = '<p class="error" role="alert">That key is not one of http.api_keys.</p>'
    return (
        (error if failed else "") + '<form method="post" action="login" class="card">'
        "<p>This bridge asks for one of its API keys (<code>http.api_keys</code>).</p>"
        '<p><label for="login-key">Key</label>'
        '<input id="login-key" name="key" type="password" required autocomplete="current-password">'
        '</p><button type="submit">Sign in</button></form>'
    )
