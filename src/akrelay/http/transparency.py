"""The Merkle log's endpoints (issue 23).

``GET /v1/knowledge/checkpoint`` (C2SP signed note, ``text/plain``), ``/log``,
``/proof/inclusion`` and ``/proof/consistency`` (JSON), a peer's checkpoint this relay
cosigned, and the C2SP tlog-witness ``add-checkpoint``. Thin handlers over
:class:`akrelay.relay.transparency.TransparencyLog`; the component that opens the log
and runs its signer is :class:`akrelay.components.log.LogComponent`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

import anyio
import msgspec
from litestar import Request, get, post
from litestar.datastructures import State
from litestar.response.base import ASGIResponse

from akrelay.http.errors import JSON
from akrelay.protocol.errors import ProtocolError
from akrelay.relay.transparency import WITNESS_PATH
from akrelay.relay.witnessing import ADD_CHECKPOINT_PATH

if TYPE_CHECKING:  # annotations only
    from litestar.handlers import BaseRouteHandler
    from akrelay.relay.transparency import TransparencyLog

TEXT = "text/plain"  # Litestar appends "; charset=utf-8"


def routes(tlog: TransparencyLog, *, offload: bool, cosigned: Callable[[str], str | None],
           add_checkpoint: Callable[[bytes], str]) -> list[BaseRouteHandler]:
    """The log's routes. ``offload``: the store blocks (run reads in a thread); ``cosigned(origin)``: the
    cosigned checkpoint of that log, if any; ``add_checkpoint(body)``: the witness's cosignature lines."""

    def params(request: Request[object, object, State]) -> dict[str, str]:
        from akrelay.http.querystring import query_pairs

        return dict(query_pairs(request.scope["query_string"]))

    def answer(body: Mapping[str, object]) -> ASGIResponse:
        return ASGIResponse(body=msgspec.json.encode(body), status_code=200, media_type=JSON)

    @get("/v1/knowledge/checkpoint", sync_to_thread=offload)
    def checkpoint() -> ASGIResponse:
        return ASGIResponse(body=tlog.checkpoint_text().encode(), status_code=200, media_type=TEXT,
                            headers={"cache-control": "no-cache"})

    @get("/v1/knowledge/log", sync_to_thread=offload)
    def entries(request: Request[object, object, State]) -> ASGIResponse:
        return answer(tlog.entries(params(request)))

    @get("/v1/knowledge/proof/inclusion", sync_to_thread=offload)
    def inclusion(request: Request[object, object, State]) -> ASGIResponse:
        return answer(tlog.inclusion(params(request)))

    @get("/v1/knowledge/proof/consistency", sync_to_thread=offload)
    def consistency(request: Request[object, object, State]) -> ASGIResponse:
        return answer(tlog.consistency(params(request)))

    @get(WITNESS_PATH, sync_to_thread=True)
    def witnessed(request: Request[object, object, State]) -> ASGIResponse:
        """A peer's last checkpoint we verified, with our cosignature (``?origin=<its log origin>``)."""
        wanted = params(request).get("origin", "")
        text = cosigned(wanted)
        if text is None:
            raise ProtocolError("not_found", f"This relay has cosigned no checkpoint of {wanted!r}.")
        return ASGIResponse(body=text.encode(), status_code=200, media_type=TEXT)

    @post(ADD_CHECKPOINT_PATH, status_code=200, opt={"rate": "write"})
    async def add(request: Request[object, object, State]) -> ASGIResponse:
        """C2SP tlog-witness: cosign a known log's checkpoint that is consistent with the last we cosigned."""
        body = await request.body()  # bounded by the body reader (max_envelope_bytes) and again by the parser
        lines = await anyio.to_thread.run_sync(add_checkpoint, body)
        return ASGIResponse(body=lines.encode(), status_code=200, media_type=TEXT)

    return [checkpoint, entries, inclusion, consistency, witnessed, add]
