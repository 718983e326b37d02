"""The bridge's actions behind every door that changes or inspects it (the MQTT bridge API, the
web UI): plain arguments in, plain results out, a `ControlError` with the API's code when
refused. No door is imported here."""
