"""Fixtures for every test (tests/support): a private mosquitto, MQTT probes, real bridges, the
service in process on a fake connection, and the tiny ChatTTS checkpoint and export, built once
per session."""

pytest_plugins = ["tests.support.harness", "tests.support.fake", "tests.support.chattts_tiny"]
