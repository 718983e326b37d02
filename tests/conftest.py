"""Fixtures for every test (tests/support): a private mosquitto, MQTT probes, real bridges, the
service in process on a fake connection, the tiny ChatTTS checkpoint and export, built once
per session (once per worker under ``pytest -n``), and slow tests first."""

pytest_plugins = [
    "tests.support.harness",
    "tests.support.fake",
    "tests.support.chattts_tiny",
    "tests.support.ordering",
    "tests.support.logging_guard",
]
