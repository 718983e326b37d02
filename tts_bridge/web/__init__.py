"""The HTTP door: the aiohttp server, the audio store behind its URLs, delivery in each target's
format, and the status page."""
