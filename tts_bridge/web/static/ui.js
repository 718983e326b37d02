// The web UI's behaviour: forms send their fields to the bridge (relative URLs, so it works
// under Home Assistant's ingress prefix) and show the answer; Speak plays its audio; the
// Activity page follows the bridge's event stream. No library, no build step.
"use strict";

(function () {
  function say(form, text, isError) {
    var out = form.querySelector("[role=status]") || document.getElementById("page-status");
    if (!out) { return; }
    out.textContent = text;
    out.classList.toggle("error", Boolean(isError));
  }

  function describe(data) {
    var rows = [
      ["Voice", data.voice],
      ["Voice per sentence", data.sentence_voices.join(", ")],
      ["Tier", data.tier],
      ["Cached", data.cached ? "yes" : (data.cached_sentences + " of " + data.sentences + " sentences")],
      ["Latency", Math.round(data.latency_ms) + " ms"],
      ["Length", (data.duration_ms / 1000).toFixed(2) + " s"]
    ];
    facts(document.getElementById("details"), rows);
  }

  // A <dl> made anew from [term, value] pairs (as text: values may come from the settings).
  function facts(list, rows) {
    if (!list) { return; }
    list.textContent = "";
    rows.forEach(function (row) {
      var dt = document.createElement("dt");
      var dd = document.createElement("dd");
      dt.textContent = row[0];
      dd.textContent = row[1];
      list.appendChild(dt);
      list.appendChild(dd);
    });
  }

  function play(data) {
    var audio = document.getElementById("player");
    var link = document.getElementById("download");
    if (link) {
      link.href = data.audio;
      link.hidden = false;
    }
    describe(data);
    if (!audio) { return; }
    audio.src = data.audio;
    var started = audio.play();
    if (started && started.catch) {
      started.catch(function () { /* the browser wants a gesture first: the controls are there */ });
    }
  }

  function body(form) {
    var fields = new FormData(form);
    if (form.enctype === "multipart/form-data") { return fields; }
    return new URLSearchParams(fields);
  }

  async function send(form) {
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { return; }
    var buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.setAttribute("aria-busy", "true"); b.disabled = true; });
    say(form, form.hasAttribute("data-speak") ? "Speaking…" : "Working…", false);
    try {
      var response = await fetch(form.getAttribute("data-action"), {
        method: "POST",
        body: body(form),
        credentials: "same-origin",
        headers: { "Accept": "application/json" }
      });
      if (response.status === 401) {  // the session ended (a restart): sign in again
        window.location.href = "login";
        return;
      }
      var answer = null;
      try { answer = await response.json(); } catch (ignored) { answer = null; }
      if (!response.ok || !answer || answer.error) {
        var reason = answer && answer.error ? answer.error.message + " (" + answer.error.code + ")"
          : "the bridge answered " + response.status;
        say(form, "Refused: " + reason, true);
        return;
      }
      if (form.hasAttribute("data-speak")) {
        play(answer.data);
        say(form, "Done: " + answer.data.voice + ", " + answer.data.tier + " tier.", false);
      } else if (form.hasAttribute("data-reload")) {
        say(form, "Done.", false);
        window.location.reload();
      } else {
        say(form, "Done: " + JSON.stringify(answer.data), false);
      }
    } catch (failure) {
      say(form, "The bridge could not be reached: " + failure.message, true);
    } finally {
      buttons.forEach(function (b) { b.removeAttribute("aria-busy"); b.disabled = false; });
    }
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.hasAttribute || !form.hasAttribute("data-action")) { return; }
    event.preventDefault();
    send(form);
  });

  // Edit a lexicon entry: its row's values into the form, the cursor on what is said.
  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-edit-lexicon]") : null;
    if (!button) { return; }
    document.getElementById("lex-word").value = button.getAttribute("data-word");
    document.getElementById("lex-say").value = button.getAttribute("data-say");
    document.getElementById("lex-phonemes").value = button.getAttribute("data-phonemes");
    document.getElementById("lex-say").focus();
  });

  function text(value) { return value === null || value === undefined ? "–" : String(value); }

  function counts(values) {
    if (!values || typeof values !== "object") { return "none"; }
    return Object.keys(values).filter(function (k) { return values[k]; })
      .map(function (k) { return k + ": " + values[k]; }).join(", ") || "none";
  }

  function showState(state) {
    var lanes = state.queue_lanes || {};
    var laneText = Object.keys(lanes).map(function (lane) {
      var ranks = lanes[lane];
      var total = Object.keys(ranks).reduce(function (sum, k) { return sum + ranks[k]; }, 0);
      return lane + ": " + total;
    }).join(", ") || "empty";
    var degraded = state.degraded || {};
    var rows = [
      ["Status", state.status || "ok"],
      ["Queue per lane", laneText],
      ["Synthesizing now", text(state.active)],
      ["Background work pending", text(state.background_pending)],
      ["Queued per door", counts(state.queue_doors)],
      ["Answers since start", counts(state.answers)],
      ["Refused busy", counts(state.busy_refusals)],
      ["Last latency", state.last_latency_ms === null || state.last_latency_ms === undefined
        ? "–" : Math.round(state.last_latency_ms) + " ms"],
      ["Broker", state.connected ? "connected" : "not connected"],
      ["Resident memory", text(state.rss_mb) + " MB"],
      ["Degraded", Object.keys(degraded).map(function (k) { return k + ": " + degraded[k]; }).join("; ") || "nothing"]
    ];
    facts(document.getElementById("state"), rows);
  }

  function addRequest(entry) {
    var table = document.getElementById("recent");
    if (!table) { return; }
    var row = document.createElement("tr");
    var when = new Date(entry.at * 1000);
    var at = [when.getHours(), when.getMinutes(), when.getSeconds()].map(function (n) {
      return String(n).padStart(2, "0");
    }).join(":");
    var latency = entry.latency_ms === null ? "–" : Math.round(entry.latency_ms) + " ms";
    [at, entry.door, text(entry.voice), text(entry.tier), latency, entry.status].forEach(function (v) {
      var cell = document.createElement("td");
      cell.textContent = v;
      row.appendChild(cell);
    });
    table.insertBefore(row, table.firstChild);
    label(table.parentNode);
    while (table.rows.length > 50) { table.deleteRow(table.rows.length - 1); }
  }

  // On a phone each row is a card (ui.css) with every cell under its column's name: the
  // names come from the header, so a table needs nothing more in its markup.
  function label(table) {
    var names = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) {
      return th.textContent;
    });
    Array.prototype.forEach.call(table.querySelectorAll("tbody tr"), function (row) {
      Array.prototype.forEach.call(row.cells, function (cell, i) {
        if (cell.tagName === "TD" && names[i]) { cell.setAttribute("data-label", names[i]); }
      });
    });
  }

  function follow() {
    if (!document.getElementById("state") || !window.EventSource) { return; }
    var live = document.getElementById("live");
    var source = new EventSource("ui/events");
    source.addEventListener("open", function () { live.textContent = "Live."; });
    source.addEventListener("error", function () { live.textContent = "Reconnecting…"; });
    source.addEventListener("state", function (event) { showState(JSON.parse(event.data)); });
    source.addEventListener("request", function (event) { addRequest(JSON.parse(event.data)); });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  function start() {
    Array.prototype.forEach.call(document.querySelectorAll("table"), label);
    follow();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
}());
