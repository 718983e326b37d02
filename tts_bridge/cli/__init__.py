"""The `tts-bridge` command line."""
