"""Speech without MQTT: synthesis, the sentence cache, scheduling, tier routing, idle work
and the hardware plan."""
