"""Fixtures for every test: a private mosquitto, MQTT probes, real bridges (tests/support)."""

pytest_plugins = ["tests.support.harness"]
