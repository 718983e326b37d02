"""MQTT side of the bridge: topics and payloads (protocol) and the paho connection (client)."""
