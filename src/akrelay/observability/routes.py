"""``GET /metrics`` (listed in ``akrelay.http.app.ROUTE_MODULES``): the Prometheus text exposition."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from litestar import get
from litestar.response.base import ASGIResponse

import akrelay.observability.options  # noqa: F401  (declares --log-json)
from akrelay.observability.metrics import scrape

METRICS_PATH = "/metrics"


def routes(relay: Any, settings: Any) -> list[Any]:
    @get(METRICS_PATH, include_in_schema=False)
    async def metrics_page() -> ASGIResponse:
        body, content_type = await anyio.to_thread.run_sync(scrape, relay, settings)
        return ASGIResponse(body=body, status_code=200, media_type=content_type)

    return [metrics_page]
