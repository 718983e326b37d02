"""The Wyoming door: the TTS server Home Assistant talks to (server) and its event codec."""
