"""The MQTT door: the paho connection (client), the contract's codecs (protocol, Hermes, Home
Assistant discovery) and the front ends served over it (say, bridge API, reports, Hermes), with
the outbox every answer leaves by and the journal that keeps accepted requests across a crash."""
