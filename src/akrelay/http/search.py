"""``POST /v1/knowledge/search`` (Agent Knowledge §9.5).

Thin: the body goes to :class:`akrelay.search.SearchEngine`, which parses it
strictly and returns a page; errors leave through the common error mapping. The
component that opens the service is :class:`akrelay.components.search.SearchComponent`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import anyio.to_thread
from litestar import Request, post
from litestar.datastructures import State
from litestar.response.base import ASGIResponse

from akrelay.http.errors import JSON

if TYPE_CHECKING:  # annotations only
    from litestar.handlers import BaseRouteHandler
    from akrelay.search import SearchEngine


def routes(path: str, service: Callable[[], SearchEngine]) -> list[BaseRouteHandler]:
    """The search route at ``path``; ``service`` is the running service (503 before start or after stop)."""

    @post(path, status_code=200)
    async def search(request: Request[object, object, State]) -> ASGIResponse:
        from akrelay.http.ingest import check_content_type

        check_content_type(request.headers.get("content-type"))
        body = await request.body()
        page = await anyio.to_thread.run_sync(service().search, body)
        return ASGIResponse(body=page.to_json(), status_code=200, media_type=JSON)

    return [search]
