"""Fixtures for every test (tests/support): a private mosquitto, MQTT probes, real bridges, and
the tiny ChatTTS checkpoint and export, built once per session."""

pytest_plugins = ["tests.support.harness", "tests.support.chattts_tiny"]
