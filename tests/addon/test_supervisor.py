"""The add-on's Supervisor client against a stand-in Supervisor on loopback."""

from __future__ import annotations

import pytest

from tests.support.supervisor import TOKEN, FakeSupervisor
from tts_bridge.addon.supervisor import MqttService, SupervisorClient, SupervisorError
from tts_bridge.bench.localbroker import free_port

BROKER = {"host": "core-mosquitto", "port": 1883, "ssl": False, "protocol": "3.1.1"}


def test_from_environ_needs_the_token_and_takes_the_url() -> None:
    assert SupervisorClient.from_environ({}) is None
    client = SupervisorClient.from_environ(
        {"SUPERVISOR_TOKEN": "t", "SUPERVISOR_URL": "http://127.0.0.1:9/"}
    )
    assert client is not None and client.base_url == "http://127.0.0.1:9"
    default = SupervisorClient.from_environ({"SUPERVISOR_TOKEN": "t"})
    assert default is not None and default.base_url == "http://supervisor"


def test_mqtt_service_sends_the_token_and_reads_the_login() -> None:
    with FakeSupervisor(mqtt={**BROKER, "username": "addons", "password": "pw"}) as supervisor:
        service = SupervisorClient(TOKEN, supervisor.url).mqtt_service()
        recorded = supervisor.state.requests
    assert service == MqttService("core-mosquitto", 1883, "addons", "pw", ssl=False)
    assert [(r.method, r.path, r.authorization) for r in recorded] == [
        ("GET", "/services/mqtt", f"Bearer {TOKEN}")
    ]


def test_no_mqtt_service_is_none_not_an_error() -> None:
    with FakeSupervisor(mqtt=None) as supervisor:
        assert SupervisorClient(TOKEN, supervisor.url).mqtt_service() is None


def test_a_wrong_token_is_an_error_naming_the_request() -> None:
    with FakeSupervisor(mqtt=BROKER) as supervisor:
        client = SupervisorClient("wrong", supervisor.url)
        with pytest.raises(SupervisorError, match=r"GET .*/services/mqtt: HTTP 401 Unauthorized"):
            client.mqtt_service()


def test_a_supervisor_that_does_not_answer_is_one_clear_error() -> None:
    client = SupervisorClient(TOKEN, f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(SupervisorError, match="no answer"):
        client.mqtt_service()
    with pytest.raises(SupervisorError, match=r"POST .*/discovery: no answer"):
        client.announce("wyoming", {"uri": "tcp://host:10200"})


def test_announce_posts_the_discovery_message() -> None:
    with FakeSupervisor() as supervisor:
        uuid = SupervisorClient(TOKEN, supervisor.url).announce(
            "wyoming", {"uri": "tcp://abc-tts-bridge:10200"}
        )
        messages = supervisor.state.discovery()
    assert len(uuid) == 32
    assert messages == [{"service": "wyoming", "config": {"uri": "tcp://abc-tts-bridge:10200"}}]


def test_published_port_and_host_address() -> None:
    with FakeSupervisor(network={"10200/tcp": None, "10201/tcp": 8201}) as supervisor:
        client = SupervisorClient(TOKEN, supervisor.url)
        assert client.published_port("10201/tcp") == 8201
        assert client.published_port("10200/tcp") is None
        assert client.host_address() == "192.0.2.10"
