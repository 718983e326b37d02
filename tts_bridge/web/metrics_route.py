"""``GET /metrics``: the service's Prometheus metrics on the HTTP server (``http.metrics``).

Open like the status page: the metrics hold names and numbers, never a request's text.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from tts_bridge.speech.metrics import CONTENT_TYPE, Metrics


class MetricsRoute:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def register(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        # Off the loop: reading the levels takes the cache's and the scheduler's locks.
        body = await asyncio.get_running_loop().run_in_executor(None, self._metrics.exposition)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
