"""The manual's examples work when pasted: the "Try it" page's shell commands (the README's
"Try it" section, which the page includes) and the Rhasspy page's run as written against a
private broker and a real bridge (only the broker's host and port are added), the Node-RED
page's flow is one Node-RED can import and that sends a fresh id each press, and every YAML and
JSON example parses (the bridge's configuration examples load as its configuration)."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.answers import parse_wav
from tests.support.harness import REPO_ROOT, BridgeFactory, ProbeFactory, ReceivedMessage
from tts_bridge.bench.localbroker import LocalBroker
from tts_bridge.config import Settings, load_settings

DOCS = REPO_ROOT / "docs"
_MOSQUITTO_RE = re.compile(r"\b(mosquitto_(?:pub|sub|rr))\b")
_SHELL_TIMEOUT_S = 240.0
# pymdownx.snippets' include line: --8<-- "FILE" or --8<-- "FILE:SECTION" (mkdocs.yml's
# base_path is the repository root), and the section markers inside the included file.
_SNIPPET_RE = re.compile(r'^--8<-- "([^":]+)(?::([\w-]+))?"$', re.M)


def _section_of(text: str, name: str) -> str:
    start = re.search(rf"^.*--8<-- \[start:{re.escape(name)}\].*$", text, re.M)
    end = re.search(rf"^.*--8<-- \[end:{re.escape(name)}\].*$", text, re.M)
    assert start and end and start.end() < end.start(), f"no snippet section {name!r}"
    return text[start.end() : end.start()]


def _page(relative: str) -> str:
    """A docs page's Markdown as the site shows it: its snippet includes expanded."""

    def include(match: re.Match[str]) -> str:
        text = (REPO_ROOT / match[1]).read_text(encoding="utf-8")
        return _section_of(text, match[2]) if match[2] else text

    return _SNIPPET_RE.sub(include, (DOCS / relative).read_text(encoding="utf-8"))


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def _mqtt_blocks() -> list[str]:
    """The "Try it" shell blocks that talk to the broker (the others need no broker)."""
    return [b for b in _blocks(_page("usage/try-it.md"), "sh") if _MOSQUITTO_RE.search(b)]


def test_the_try_it_page_shows_the_readme_section() -> None:
    """The README's "Try it" and the site's page are one text, so the examples run here are
    the ones both show."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    heading = readme.index("\n## Try it\n")
    section = _section_of(readme, "try-it")
    assert readme.index(section) > heading
    assert readme.find("\n## ", heading + 1) > readme.index(section), "in the Try it section"
    assert section.strip() in _page("usage/try-it.md")


def _runnable(block: str, broker: LocalBroker) -> str:
    """The block as a user pastes it, pointed at the test broker; players are not run."""
    lines = [line for line in block.splitlines() if not line.lstrip().startswith("aplay ")]
    script = "\n".join(lines)
    return _MOSQUITTO_RE.sub(rf"\1 -h {broker.host} -p {broker.port}", script)


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", "-eu", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=_SHELL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{script}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _exact_wav(path: Path) -> None:
    """A whole WAV and nothing after it (mosquitto_sub without -N appends a newline)."""
    data = path.read_bytes()
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", data[:16]
    (riff_size,) = struct.unpack("<I", data[4:8])
    extra = len(data) - riff_size - 8
    assert extra == 0, f"{path.name}: {extra} bytes after the WAV"
    assert parse_wav(data).duration_s > 0.3


@pytest.mark.slow
def test_shell_examples_work_when_pasted(
    tmp_path: Path, broker: LocalBroker, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    blocks = _mqtt_blocks()
    assert len(blocks) >= 2, "the Try it page lost its MQTT examples"
    # Hermes on, as the Rhasspy page's configuration turns it on, for that page's example.
    bridge_factory(hermes={"enabled": True})
    probe = probe_factory("tts_bridge/bridge/response/say")
    satellite = probe_factory("hermes/audioServer/+/playBytes/#")
    work = tmp_path / "pasted"
    work.mkdir()

    first = _run(_runnable(blocks[0], broker), work)
    written = re.findall(r"> (\S+\.wav)", blocks[0])
    assert written, "the first example records the audio"
    for name in written:
        _exact_wav(work / name)
    # The block ends by printing the answer to the sentence asked for again: a cache hit.
    answer = json.loads(first.stdout.strip().splitlines()[-1])
    assert answer["status"] == "ok", answer
    assert answer["data"]["cached"] is True, answer

    for block in blocks[1:]:
        since = probe.mark()
        _run(_runnable(block, broker), work)
        ids = re.findall(r'"id": "([^"]+)"', block)
        for request_id in ids:

            def is_answer(m: ReceivedMessage, rid: str = request_id) -> bool:
                return bool(m.json()["id"] == rid)

            found = probe.wait_for(
                is_answer,
                120,
                since=since,
                what=f"the answer to the Try it page's {request_id}",
            )
            assert found.json()["status"] == "ok", found.json()

    # The Rhasspy page's say: the satellite it names gets the WAV under the id it gives.
    hermes = [b for b in _blocks(_page("integrations/rhasspy.md"), "sh") if "hermes/" in b]
    assert hermes, "the Rhasspy page lost its example"
    for block in hermes:
        site, request_id = re.findall(r'"(?:siteId|id)": "([^"]+)"', block)
        topic = f"hermes/audioServer/{site}/playBytes/{request_id}"
        since = satellite.mark()
        _run(_runnable(block, broker), work)

        def on_topic(m: ReceivedMessage, t: str = topic) -> bool:
            return m.topic == t

        heard = satellite.wait_for(on_topic, 120, since=since, what=f"the WAV on {topic}")
        assert parse_wav(heard.payload).duration_s > 0.3


# -- the Node-RED flow ---------------------------------------------------------------------------

# The fields Node-RED's editor needs to place and wire each node of the flow, and the ones each
# node type's own form (its defaults in Node-RED's node definitions) checks as valid.
_FLOW_NODE_FIELDS = {"id", "type", "z", "x", "y", "wires"}
_TYPE_FIELDS = {
    "inject": {"name", "props", "repeat", "crontab", "once", "onceDelay", "topic", "payload"},
    "mqtt out": {"name", "topic", "qos", "retain", "broker"},
    "mqtt in": {"name", "topic", "qos", "datatype", "broker", "nl", "rap", "rh", "inputs"},
    "debug": {"name", "active", "tosidebar", "console", "complete", "targetType"},
}
_BROKER_FIELDS = {"name", "broker", "port", "clientid", "usetls", "protocolVersion", "keepalive"}


def _flow() -> list[dict[str, Any]]:
    blocks = _blocks(_page("integrations/node-red.md"), "json")
    assert len(blocks) == 1, "the Node-RED page has one flow"
    flow = json.loads(blocks[0])
    assert isinstance(flow, list)
    return flow


def test_node_red_flow_imports_cleanly() -> None:
    flow = _flow()
    by_id = {node["id"]: node for node in flow}
    assert len(by_id) == len(flow), "node ids are unique"
    tabs = {i for i, n in by_id.items() if n["type"] == "tab"}
    brokers = {i for i, n in by_id.items() if n["type"] == "mqtt-broker"}
    assert len(tabs) == 1 and len(brokers) == 1, flow
    flow_nodes = [n for n in flow if n["id"] not in tabs | brokers]
    assert {n["type"] for n in flow_nodes} == set(_TYPE_FIELDS)
    places = set()
    for node in flow_nodes:
        missing = (_FLOW_NODE_FIELDS | _TYPE_FIELDS[node["type"]]) - set(node)
        assert not missing, f"{node['id']} lacks {sorted(missing)}"
        assert node["z"] in tabs, node
        assert isinstance(node["x"], int) and isinstance(node["y"], int), node
        places.add((node["x"], node["y"]))
        for outputs in node["wires"]:
            for target in outputs:
                assert target in by_id and target not in tabs | brokers, (node["id"], target)
        if node["type"].startswith("mqtt"):
            assert node["broker"] in brokers, node
    assert len(places) == len(flow_nodes), "nodes are not stacked on one spot"
    (broker,) = (by_id[i] for i in brokers)
    assert not _BROKER_FIELDS - set(broker), sorted(_BROKER_FIELDS - set(broker))
    assert broker["protocolVersion"] == "5"
    assert not {"x", "y", "wires"} & set(broker) and not broker.get("z"), "a config node"
    mqtt_out = next(n for n in flow_nodes if n["type"] == "mqtt out")
    assert mqtt_out["topic"] == "tts_bridge/say/kitchen"
    mqtt_in = next(n for n in flow_nodes if n["type"] == "mqtt in")
    assert mqtt_in["topic"] == "tts_bridge/bridge/response/say" and mqtt_in["datatype"] == "json"
    inject = next(n for n in flow_nodes if n["type"] == "inject")
    assert inject["wires"] == [[mqtt_out["id"]]]


def test_node_red_inject_sends_a_fresh_id_each_press() -> None:
    inject = next(n for n in _flow() if n["type"] == "inject")
    # A fixed id would be answered from the journal as a duplicate and not spoken again.
    assert inject["payloadType"] == "jsonata", "a fixed JSON payload repeats its id"
    expression = inject["payload"]
    assert re.search(r'"id"\s*:\s*[^,}]*\$millis\(\)', expression), expression
    assert '"text"' in expression


# -- every YAML and JSON example -----------------------------------------------------------------


def _examples(language: str) -> list[tuple[str, str]]:
    """(page, block) for every fenced block of `language` on every page, includes expanded."""
    return [
        (str(page.relative_to(DOCS)), block)
        for page in sorted(DOCS.rglob("*.md"))
        for block in _blocks(_page(str(page.relative_to(DOCS))), language)
    ]


def test_every_yaml_and_json_example_parses() -> None:
    yaml_blocks, json_blocks = _examples("yaml"), _examples("json")
    assert len(yaml_blocks) >= 10 and len(json_blocks) >= 5, "the examples were not found"
    for page, block in yaml_blocks:
        try:
            yaml.safe_load(block)
        except yaml.YAMLError as exc:
            pytest.fail(f"{page}: a YAML example does not parse: {exc}\n{block}")
    for page, block in json_blocks:
        try:
            json.loads(block)
        except ValueError as exc:
            pytest.fail(f"{page}: a JSON example does not parse: {exc}\n{block}")


def test_configuration_examples_are_valid_settings(tmp_path: Path) -> None:
    """A YAML example made only of the bridge's settings keys (the others are Home Assistant's)
    loads as a configuration file: the keys exist and the values are valid."""
    checked = 0
    for page, block in _examples("yaml"):
        data = yaml.safe_load(block)
        if not isinstance(data, dict) or not set(data) <= set(Settings.model_fields):
            continue
        # A voices file of the user's own must not change what is checked.
        data["voices_file"] = str(tmp_path / "no-voices.yaml")
        path = tmp_path / "example.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        try:
            load_settings(path, environ={})
        except Exception as exc:
            pytest.fail(f"{page}: a configuration example is refused: {exc}\n{block}")
        checked += 1
    assert checked >= 5, f"only {checked} configuration examples found"
