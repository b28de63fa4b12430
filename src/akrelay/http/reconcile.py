"""``POST /v1/knowledge/reconcile``: one negentropy V1 message in, the next one out (issue 26).

Thin on purpose: the body (binary, ``application/octet-stream``) was already read within
``max_envelope_bytes`` by the app's body reader; the ``since`` / ``until`` / ``type`` filter and the
answer's ``frame_limit`` are parsed,
the answer computed by :func:`akrelay.federation.reconcile.respond` over the store's index,
and every failure leaves through the app's one error mapping (malformed: 400
``invalid_request``; store outage: 503). Rate limited as a read. The server keeps nothing
between rounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
from litestar import Request, post
from litestar.datastructures import State
from litestar.response.base import ASGIResponse

from akrelay.federation.reconcile import MEDIA_TYPE, RECONCILE_PATH, index_of, parse_request, respond

__all__ = ["MEDIA_TYPE", "RECONCILE_PATH", "enabled", "routes"]
from akrelay.protocol.errors import ProtocolError
from akrelay.store.recon import ResponderCopy

if TYPE_CHECKING:  # annotations only
    from litestar.handlers import BaseRouteHandler
    from akrelay.relay.core import Relay
    from akrelay.settings import Settings
    from akrelay.store.recon_copy import KeptCopy


def _count(source: str) -> None:
    from akrelay.observability.metrics import metrics

    metrics().reconcile_messages.labels(source).inc()


def enabled(relay: Relay, settings: Settings) -> bool:
    """Served (and advertised) unless ``--no-reconcile``, for a store that keeps the index."""
    return not settings.federation.no_reconcile and index_of(relay.store) is not None


def routes(relay: Relay, settings: Settings, *, kept: KeptCopy | None = None) -> list[BaseRouteHandler]:
    """The endpoint; ``kept``: the node's kept copy of the set (answers from memory while it is current)."""
    if not enabled(relay, settings):
        return []
    index = index_of(relay.store)
    assert index is not None
    copies = ResponderCopy()  # this worker's: every message shares it (the copy of a large reconciliation)

    @post(RECONCILE_PATH, status_code=200)
    async def reconcile(request: Request[object, object, State]) -> ASGIResponse:
        from akrelay.http.querystring import query_pairs

        media = (request.headers.get("content-type") or "").partition(";")[0].strip().lower()
        if media != MEDIA_TYPE:
            raise ProtocolError("invalid_request", f"Content-Type must be {MEDIA_TYPE} (one negentropy V1 message)")
        window, frame_limit = parse_request(query_pairs(request.scope["query_string"]))
        body = await request.body()
        # always off the event loop: one message may read up to the view's budget of index rows
        # (or, filtered by type, up to MAX_FILTERED records through the store's term index)
        answer = await anyio.to_thread.run_sync(lambda: respond(index, body, since=window.since, until=window.until,
                                                                types=window.types, store=relay.store,
                                                                frame_limit=frame_limit, copies=copies,
                                                                kept=kept, answered=_count))
        return ASGIResponse(body=answer, status_code=200, media_type=MEDIA_TYPE, headers={"cache-control": "no-store"})

    return [reconcile]
