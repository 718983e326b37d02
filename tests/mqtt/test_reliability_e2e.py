"""Reliability against real mosquitto processes: restarts, crashes, limits, floods, TLS, auth.

The same logic in process (fuzzed payloads, the size limit without a broker) is in
test_fuzz.py and test_frontends.py; here is what needs the real processes.

Goal everywhere: no accepted request is lost and none is answered twice.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from tests.support.harness import BridgeFactory, MqttProbe, ProbeFactory, RunningBridge
from tts_bridge.audio.codec import encode_wav
from tts_bridge.bench.localbroker import LocalBroker
from tts_bridge.cli.doctor import check_broker
from tts_bridge.cli.play import EXIT_OK, run_player
from tts_bridge.mqtt.settings import MqttSettings, TlsSettings

BASE = "tts_bridge"
RESPONSE = f"{BASE}/bridge/response/say"
WAIT_S = 60.0

pytestmark = pytest.mark.slow


def responses(probe: MqttProbe, since: int = 0) -> list[dict[str, Any]]:
    return [m.json() for m in probe.messages[since:] if m.topic == RESPONSE]


def wait_answers(probe: MqttProbe, ids: list[str], since: int, timeout: float = WAIT_S) -> None:
    # Polls rather than probe.wait_for: a predicate over all answers, run for every message,
    # is cubic in a 1000-request burst and starves the probe's network thread.
    wanted = set(ids)
    deadline = time.monotonic() + timeout
    while True:
        missing = wanted - {r["id"] for r in responses(probe, since)}
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no answer within {timeout} s for {len(missing)} of {len(ids)} requests, "
                f"e.g. {sorted(missing)[:5]}\n{probe.diagnostics() if probe.diagnostics else ''}"
            )
        time.sleep(0.2)


def say(probe: MqttProbe, text: str, request_id: str, target: str = "rel", **extra: Any) -> None:
    probe.publish(f"{BASE}/say/{target}", json.dumps({"text": text, "id": request_id, **extra}))


def spoken(probe: MqttProbe, since: int, request_id: str) -> int:
    """How many audio messages for ``request_id`` arrived from ``since`` on."""
    return sum(
        1
        for m in probe.messages[since:]
        if m.topic == f"{BASE}/audio/rel" and m.user_properties.get("id") == request_id
    )


def connects(bridge: RunningBridge) -> int:
    return bridge.log_path.read_text(encoding="utf-8").count("Connected to the broker")


def test_broker_restart_while_connected(
    broker: LocalBroker, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory()
    probe = probe_factory(f"{BASE}/#")
    probe.diagnostics = bridge.log_tail
    since = probe.mark()
    say(probe, "Before the restart.", "before")
    wait_answers(probe, ["before"], since)
    broker.restart()
    probe.close()
    probe = probe_factory(f"{BASE}/#")
    probe.wait_for(
        lambda m: m.topic == f"{BASE}/bridge/state" and m.json() == {"state": "online"},
        WAIT_S,
        what="online state after the broker restart",
    )
    deadline = time.monotonic() + WAIT_S
    while connects(bridge) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    since = probe.mark()
    say(probe, "After the restart.", "after")
    wait_answers(probe, ["after"], since)
    assert bridge.running


def test_requests_sent_while_the_bridge_is_down_are_answered(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    first = bridge_factory()
    probe = probe_factory(f"{BASE}/#")
    first.stop()
    since = probe.mark()
    ids = [f"offline-{i}" for i in range(3)]
    for i, request_id in enumerate(ids):
        say(probe, f"Sent while the bridge was away, number {i}.", request_id)
    probe.publish(f"{BASE}/say/rel", "Plain text while away.")
    second = bridge_factory()
    probe.diagnostics = second.log_tail
    wait_answers(probe, ids, since)
    probe.wait_for(
        lambda m: m.topic == RESPONSE and len(responses(probe, since)) >= 4, WAIT_S, since=since
    )
    # A marker sent now is answered after anything still queued (a duplicate included).
    say(probe, "A marker after the queued ones.", "marker")
    wait_answers(probe, ["marker"], since)
    answers = [r for r in responses(probe, since) if r["id"] != "marker"]
    counts = Counter(r["id"] for r in answers)
    assert all(n == 1 for n in counts.values()), counts
    assert len(counts) == 4 and all(r["status"] == "ok" for r in answers)


def test_bridge_killed_after_receipt_answers_exactly_once(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(scheduler={"idle_enabled": False})
    probe = probe_factory(f"{BASE}/#")
    since = probe.mark()
    long_text = " ".join(f"This is sentence number {i} of a long announcement." for i in range(12))
    say(probe, long_text, "crash-1", cache=False)
    deadline = time.monotonic() + WAIT_S
    # The routing line comes after the journal entry and the ack ("Request crash-1 for rel" comes
    # before them: a kill there leaves the message with the broker, which delivers it again).
    while "Request crash-1: " not in bridge.log_path.read_text(encoding="utf-8"):
        assert time.monotonic() < deadline, bridge.log_tail()
        time.sleep(0.02)
    bridge.kill()  # SIGKILL while it synthesizes: accepted, journaled, acked, not answered
    assert not [r for r in responses(probe, since) if r["id"] == "crash-1"]
    restarted = bridge_factory(scheduler={"idle_enabled": False})
    probe.diagnostics = restarted.log_tail
    wait_answers(probe, ["crash-1"], since, timeout=120)
    say(probe, "A marker after the resumed one.", "marker")
    wait_answers(probe, ["marker"], since)
    counts = Counter(r["id"] for r in responses(probe, since))
    assert counts["crash-1"] == 1, counts
    assert "Resuming 1 unfinished request" in restarted.log_path.read_text(encoding="utf-8")
    # A client that repeats the same id and text is answered from the journal, not spoken again.
    audio_before = spoken(probe, since, "crash-1")
    say(probe, long_text, "crash-1", cache=False)
    probe.wait_for(
        lambda m: (
            m.topic == RESPONSE
            and Counter(r["id"] for r in responses(probe, since))["crash-1"] == 2
        ),
        WAIT_S,
        since=since,
    )
    # Audio of a duplicate would come before the answer to a marker sent after it.
    say(probe, "A marker after the duplicate.", "marker-2")
    wait_answers(probe, ["marker-2"], since)
    assert spoken(probe, since, "marker-2") == 1  # audio carries its request's id
    assert spoken(probe, since, "crash-1") == audio_before, "a duplicate must not be spoken again"


def test_audio_larger_than_the_broker_allows(
    tmp_path: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    # The fixture broker cannot change its limit, so this test runs its own.
    with LocalBroker(tmp_path / "small", max_packet_size=150_000) as small:
        bridge_factory.broker = small
        bridge = bridge_factory()
        probe = MqttProbe(small.host, small.port).connect()
        probe.subscribe(f"{BASE}/#")
        probe.diagnostics = bridge.log_tail
        try:
            since = probe.mark()
            # About 1.5 s (66 kB) per sentence, 200 kB for the whole message.
            text = "The first sentence is here. The second one follows. The third one ends it."
            say(probe, text, "big")
            wait_answers(probe, ["big"], since)
            (answer,) = [r for r in responses(probe, since) if r["id"] == "big"]
            assert answer["status"] == "ok" and answer["data"]["stream"] is True, answer
            assert answer["data"]["bytes"] > 150_000, answer
            chunks = [m for m in probe.messages[since:] if m.topic == f"{BASE}/audio/rel/stream"]
            assert [c.user_properties["seq"] for c in chunks] == ["0", "1", "2"]
            assert [c.user_properties["last"] for c in chunks] == ["false", "false", "true"]
            assert not [m for m in probe.messages[since:] if m.topic == f"{BASE}/audio/rel"]
            huge = " ".join(["and then it went on"] * 40) + "."
            say(probe, huge, "too-big", cache=False)
            wait_answers(probe, ["too-big"], since, timeout=120)
            (refused,) = [r for r in responses(probe, since) if r["id"] == "too-big"]
            assert refused["code"] == "audio_too_large", refused
            say(probe, "Still here.", "after")
            wait_answers(probe, ["after"], since)
            assert connects(bridge) == 1, "one connection throughout, no reconnect loop"
        finally:
            probe.close()
            bridge.stop()


def test_burst_of_1000_requests_stays_bounded(
    bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    bridge = bridge_factory(
        default_voice="heart", limits={"max_queue": 64}, scheduler={"idle_enabled": False}
    )
    probe = probe_factory(RESPONSE)
    probe.diagnostics = bridge.log_tail
    process = psutil.Process(bridge.proc.pid)
    since = probe.mark()
    ids = [f"burst-{i}" for i in range(1000)]
    peak = 0
    texts = ["The front door is open.", "Dinner is ready.", "The laundry is done."]
    for i, request_id in enumerate(ids):
        say(probe, texts[i % 3], request_id, target="burst")
        if i % 50 == 0:
            peak = max(peak, process.memory_info().rss)
    wait_answers(probe, ids, since, timeout=300)
    peak = max(peak, process.memory_info().rss)
    answers = responses(probe, since)
    counts = Counter(r["id"] for r in answers)
    assert len(counts) == 1000 and max(counts.values()) == 1
    statuses = Counter(r["status"] if r["status"] == "ok" else r["code"] for r in answers)
    assert set(statuses) <= {"ok", "busy"}, statuses
    assert statuses["ok"] >= 64, statuses
    print(f"burst: {dict(statuses)}, bridge peak RSS {peak / 2**20:.0f} MB")
    assert peak < 700 * 2**20, f"peak RSS {peak / 2**20:.0f} MB"


def _make_ca(directory: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1 / localhost."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("tts_bridge test CA"))
        .issuer_name(name("tts_bridge test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths[2].chmod(0o644)  # mosquitto may run as another user
    return paths


def _player_over_tls(tmp_path: Path, tls_settings: MqttSettings, ca: Path) -> None:
    """`tts-bridge play` connects with the TLS settings and saves what a target receives."""
    out_dir = tmp_path / "heard"
    ready, results = threading.Event(), []
    player = threading.Thread(
        target=lambda: results.append(
            run_player(
                tls_settings.host,
                tls_settings.port,
                "tts_bridge",
                "kitchen",
                out_dir,
                tls=tls_settings,
                count=1,
                ready=ready,
            )
        ),
        daemon=True,
    )
    player.start()
    assert ready.wait(WAIT_S), "the player did not subscribe over TLS"
    wav = encode_wav(np.zeros(800, dtype="<i2"), 16_000)
    subprocess.run(
        [
            "mosquitto_pub",
            *("-h", tls_settings.host, "-p", str(tls_settings.port), "--cafile", str(ca)),
            *("-t", "tts_bridge/audio/kitchen", "-s"),
        ],
        input=wav,
        check=True,
        timeout=30,
    )
    player.join(WAIT_S)
    assert results == [EXIT_OK]
    assert [f.read_bytes() for f in out_dir.iterdir()] == [wav]


def test_tls_with_a_generated_ca(tmp_path: Path, bridge_factory: BridgeFactory) -> None:
    ca, cert, key = _make_ca(tmp_path)
    tls_lines = [f"cafile {ca}", f"certfile {cert}", f"keyfile {key}"]
    with LocalBroker(tmp_path / "tls", extra_config=tls_lines) as tls_broker:
        bridge_factory.broker = tls_broker
        bridge = bridge_factory(
            _wait_online=False, mqtt={"tls": {"enabled": True, "ca_file": str(ca)}}
        )
        deadline = time.monotonic() + WAIT_S
        while "Connected to the broker" not in bridge.log_path.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline, bridge.log_tail()
            time.sleep(0.1)
        bridge.stop()
        # doctor speaks TLS with the same settings
        tls_settings = MqttSettings(
            host=tls_broker.host,
            port=tls_broker.port,
            tls=TlsSettings(enabled=True, ca_file=ca),
        )
        result = check_broker(tls_settings)
        assert result.status == "PASS" and "mqtts://" in result.detail, result
        # and so does `tts-bridge play`
        _player_over_tls(tmp_path, tls_settings, ca)
        (tmp_path / "other").mkdir()
        other_ca, _, _ = _make_ca(tmp_path / "other")
        wrong = bridge_factory(
            _wait_online=False, mqtt={"tls": {"enabled": True, "ca_file": str(other_ca)}}
        )
        deadline = time.monotonic() + WAIT_S
        while "CERTIFICATE_VERIFY_FAILED" not in wrong.log_path.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline, wrong.log_tail()
            time.sleep(0.1)
        log = wrong.log_path.read_text(encoding="utf-8")
        assert "Connected to the broker" not in log
        assert "CERTIFICATE_VERIFY_FAILED" in log, wrong.log_tail()
        wrong.stop()


def test_wrong_password_is_refused_with_a_clear_log_line(
    tmp_path: Path, bridge_factory: BridgeFactory
) -> None:
    passwords = tmp_path / "passwd"
    passwords.write_text("", encoding="utf-8")
    subprocess.run(["mosquitto_passwd", "-b", str(passwords), "bridge", "s3cret"], check=True)
    passwords.chmod(0o644)
    auth = ["allow_anonymous false", f"password_file {passwords}"]
    with LocalBroker(tmp_path / "auth", extra_config=auth) as auth_broker:
        bridge_factory.broker = auth_broker
        secret_file = tmp_path / "bridge.secret"
        secret_file.write_text("s3cret\n", encoding="utf-8")
        good = bridge_factory(
            _wait_online=False, mqtt={"username": "bridge", "password_file": str(secret_file)}
        )
        deadline = time.monotonic() + WAIT_S
        while "Connected to the broker" not in good.log_path.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline, good.log_tail()
            time.sleep(0.1)
        assert "s3cret" not in good.log_path.read_text(encoding="utf-8")
        good.stop()
        bad = bridge_factory(
            _wait_online=False, mqtt={"username": "bridge", "password": "wrong-password"}
        )
        deadline = time.monotonic() + WAIT_S
        while "refused the connection" not in bad.log_path.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline, bad.log_tail()
            time.sleep(0.1)
        # paho retries after 1 s and 2 s: those refusals are no new error lines, and the
        # closed socket after each is not reported as a "Protocol error".
        time.sleep(3.5)
        log = bad.log_path.read_text(encoding="utf-8")
        assert "Not authorized" in log or "Bad user name or password" in log, bad.log_tail()
        assert "check mqtt.username/password (user 'bridge')" in log, bad.log_tail()
        assert "refused the connection again" in log, bad.log_tail()  # it did retry
        loud = [line for line in log.splitlines() if " ERROR " in line or " WARNING " in line]
        assert sum("refused the connection" in line for line in loud) == 1, bad.log_tail()
        assert not any("Protocol error" in line for line in loud), bad.log_tail()
        assert "wrong-password" not in log
        assert bad.running, "a refused bridge keeps retrying instead of crashing"
        bad.stop()


def test_two_bridges_share_the_work(
    tmp_path: Path, bridge_factory: BridgeFactory, probe_factory: ProbeFactory
) -> None:
    shared = {"share_group": "speakers", "session_expiry_s": 60}
    one = bridge_factory(
        mqtt={"client_id": "bridge-one", **shared},
        journal={"path": str(tmp_path / "j1.sqlite3")},
        cache={"dir": str(tmp_path / "c1")},
    )
    two = bridge_factory(
        mqtt={"client_id": "bridge-two", **shared},
        journal={"path": str(tmp_path / "j2.sqlite3")},
        cache={"dir": str(tmp_path / "c2")},
    )
    probe = probe_factory(RESPONSE)
    since = probe.mark()
    ids = [f"shared-{i}" for i in range(20)]
    for i, request_id in enumerate(ids):
        say(probe, f"Shared announcement {i}.", request_id, voice="heart")
    wait_answers(probe, ids, since)
    time.sleep(1.0)
    counts = Counter(r["id"] for r in responses(probe, since))
    assert len(counts) == 20 and max(counts.values()) == 1, counts
    served = [b.log_path.read_text(encoding="utf-8").count("done:") for b in (one, two)]
    assert sum(served) == 20 and min(served) > 0, served
