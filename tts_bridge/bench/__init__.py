"""Benchmarks (`tts-bridge bench`), their shared helpers and the local broker manager."""
