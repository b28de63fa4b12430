"""``POST /v1/kip``: the read-only KIP 2.0 runtime's endpoint.

Thin: the body and its content type go to the KIP component's gateway
(:class:`akrelay.components.kip.Gateway`), which parses it as strict I-JSON and
returns a status and a response envelope. Envelope-level failures are HTTP 400 with a
``status: "failed"`` envelope carrying the §86 error; operation failures are
HTTP 200 with each failed result carrying its own error. Execution runs in a
worker thread so that a long catch-up, search or a query spending its CPU
budget (``--kip-budget-ms``) never stalls the event loop or other routes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

import anyio
import anyio.to_thread
import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State

if TYPE_CHECKING:
    from litestar.handlers import BaseRouteHandler

KIP_PATH = "/v1/kip"
JSON = "application/json"
#: Worker threads KIP requests may hold at once. The runtime runs one request at a
#: time, so more threads would only wait on its lock while taking the shared
#: thread pool (40) from search; further KIP requests wait in the event loop.
KIP_THREADS = 4


def routes(handle: Callable[[bytes, str | None], tuple[int, Mapping[str, object]]]) -> list[BaseRouteHandler]:
    """The KIP route; ``handle(body, content_type)`` answers ``(status, envelope)``."""
    limiter = anyio.CapacityLimiter(KIP_THREADS)

    @post(KIP_PATH, status_code=200)
    async def kip(request: Request[object, object, State]) -> Response[bytes]:
        body = await request.body()
        status, envelope = await anyio.to_thread.run_sync(handle, body, request.headers.get("content-type"),
                                                          limiter=limiter)
        return Response(content=msgspec.json.encode(envelope), status_code=status, media_type=JSON)

    return [kip]
