"""KnowQL routes at the origin root: ``POST /query`` and its companions (seed 003).

Thin: every handler goes through :func:`_answer`, which resolves the
``X-Pinecone-Api-Version`` header first (absent: ``2026-07``; ``unstable``
accepted; anything else 400 ``unsupported_api_version``), maps every refusal to
the seed 000 §9.4 body ``{"error": {"code", "message"}}`` and echoes the
resolved version on every response, errors included. The work happens in
:class:`akrelay.knowql.engine.KnowqlEngine`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, Protocol, TypeAlias

import anyio
import anyio.to_thread
import msgspec
from litestar import Request, delete, get, post
from litestar.datastructures import State
from litestar.handlers import HTTPRouteHandler
from litestar.response.base import ASGIResponse
from litestar.exceptions import HTTPException
from litestar.response.streaming import ASGIStreamingResponse

from akrelay.http.ingest import client_ip
from akrelay.knowql import API_VERSIONS, VERSION, VERSION_HEADER
from akrelay.knowql.contexts import ContextRegistry
from akrelay.knowql.errors import KnowqlError, bad_request
from akrelay.knowql.request import parse_document
from akrelay.knowql.engine import SESSION_PAGE, SESSION_PAGE_MAX, KnowqlEngine
from akrelay.knowql.sse import tail
from akrelay.protocol.errors import ProtocolError
from akrelay.settings import Settings

if TYPE_CHECKING:  # annotations only
    from akrelay import jsontypes
    from litestar.handlers import BaseRouteHandler
    from akrelay.relay.core import Relay

JSON = "application/json"
SSE = "text/event-stream"
QUERY_PATH = "/query"
#: Query Documents checked at once per worker (a shape within the caps takes up to ~0.2 s of CPU).
SHAPE_CHECKS = 2

#: What a handler's work returns: a status and the document to encode (built and checked by
#: akrelay.knowql; the HTTP layer only encodes it), or a started event stream.
Answer: TypeAlias = "tuple[int, object] | ASGIStreamingResponse"


class KnowqlHost(Protocol):
    """What the routes read from the KnowQL component (:class:`akrelay.components.knowql.KnowqlComponent`)."""

    @property
    def engine(self) -> KnowqlEngine:
        """The running service (:class:`~akrelay.http.lifecycle.NotRunning`, a 503, before start or after stop)."""
        ...

    @property
    def checks(self) -> anyio.CapacityLimiter:
        """The threads Query Document checks may use at once in this worker."""
        ...


def resolve_version(value: str | None) -> str:
    if value is None:
        return API_VERSIONS[0]
    if value.strip() in API_VERSIONS:
        return value.strip()
    raise KnowqlError(400, "unsupported_api_version",
                      f"X-Pinecone-Api-Version {value[:64]!r} is not served; use one of {', '.join(API_VERSIONS)}")


def parse_body(raw: bytes) -> jsontypes.JSON:
    """The request document under the strict JSON rules of every other endpoint (I-JSON, RFC 7493).

    ``akrelay.protocol.ijson.parse_strict``, as ``POST /v1/knowledge/events`` and the
    read endpoints parse: UTF-8 only (no UTF-16, no byte order mark), no duplicate
    member names, no NaN or Infinity, integers within ±(2^53-1), no lone surrogates.
    A defect is the KnowQL ``400 bad_request``, naming it.
    """
    from akrelay.protocol.ijson import parse_strict

    try:
        return parse_strict(raw, code="invalid_request")
    except ProtocolError as exc:
        raise bad_request(f"the body is not strict JSON: {exc.message}") from None


def _json_response(body: object, status: int, version: str, headers: dict[str, str] | None = None) -> ASGIResponse:
    return ASGIResponse(body=msgspec.json.encode(body), status_code=status, media_type=JSON,
                        headers={VERSION_HEADER: version, **(headers or {})})


async def _answer(request: Request[object, object, State], work: Callable[[str], Awaitable[Answer]]) -> ASGIResponse:
    """Run ``work(version)``; refusals become seed 000 §9.4 bodies; the version is echoed."""
    version = API_VERSIONS[0]
    try:
        version = resolve_version(request.headers.get(VERSION_HEADER))
        result = await work(version)
    except KnowqlError as exc:
        return _json_response(exc.to_wire(), exc.status, version, exc.headers)
    except ProtocolError as exc:  # the shared Content-Type rule
        return _json_response(bad_request(exc.message).to_wire(), 400, version)
    except HTTPException as exc:
        if exc.status_code == 413:
            body = KnowqlError(413, "payload_too_large", "the request body is too large").to_wire()
            return _json_response(body, 413, version)
        if exc.status_code >= 500:
            raise
        return _json_response(bad_request(str(exc.detail)).to_wire(), 400, version)
    if isinstance(result, ASGIStreamingResponse):
        return result
    status, document = result
    return _json_response(document, status, version)


def _sse(frames: AsyncIterator[bytes], version: str) -> ASGIStreamingResponse:
    """An SSE response (built directly: a handler's JSON media type would override a ``Stream``'s)."""
    return ASGIStreamingResponse(iterator=frames, media_type=SSE, headers={
        "Cache-Control": "no-store", "X-Accel-Buffering": "no", VERSION_HEADER: version})


def routes(component: KnowqlHost) -> list[BaseRouteHandler]:
    def current() -> KnowqlEngine:
        return component.engine

    # The turn's own token bucket (``knowql``, per client; shared in Redis with --store), charged
    # by the rate-limit middleware instead of the read bucket.
    @post(QUERY_PATH, status_code=200, opt={"rate": "knowql"})
    async def query(request: Request[object, object, State]) -> ASGIResponse:
        async def work(version: str) -> Answer:
            from akrelay.http.ingest import check_content_type

            check_content_type(request.headers.get("content-type"))
            value = parse_body(await request.body())
            if isinstance(value, dict) and value.get("shape") is not None:
                # Off the loop: checking a shape is bounded (knowql.shape) but not free, and a
                # hostile one must not stall /healthz; at most SHAPE_CHECKS run at once per worker.
                doc = await anyio.to_thread.run_sync(parse_document, value, limiter=component.checks)
            else:  # the other checks are cheap (bounded sizes): no thread hop
                doc = parse_document(value)
            if (isinstance(value, dict) and value.get("stream") is None and not doc.background
                    and SSE in (request.headers.get("accept") or "")):
                doc = replace(doc, stream=True)  # seed 000 §6.2: negotiated through Accept
            service = current()
            accepted, turn = await anyio.to_thread.run_sync(service.accept, doc, version, client_ip(request.scope))
            if doc.background:
                service.start(turn)
                return 202, accepted
            if doc.stream:
                service.start(turn)
                return _sse(tail(service.store, turn.query_id), version)
            future = asyncio.wrap_future(service.start(turn))
            try:
                await asyncio.wait_for(asyncio.shield(future), timeout=max(0.0, turn.deadline - time.time()))
            except asyncio.TimeoutError:
                message = f"timed out after {turn.timeout} s"
                await anyio.to_thread.run_sync(service.fail, turn.query_id, message)
            final = await anyio.to_thread.run_sync(service.query, turn.query_id)
            if final["status"] == "failed" and str(final.get("error", "")).startswith("timed out"):
                raise KnowqlError(504, "timeout", str(final["error"]), query_id=turn.query_id,
                                  session_id=turn.session_id)
            return 200, final

        return await _answer(request, work)

    @get("/queries/{query_id:str}/events")
    async def query_events(request: Request[object, object, State]) -> ASGIResponse:
        query_id = request.path_params["query_id"]

        async def work(version: str) -> Answer:
            service = current()
            await anyio.to_thread.run_sync(service.query, query_id)  # 404 before any SSE byte
            last = (request.headers.get("last-event-id") or "").strip()
            # isdigit() alone admits "²", which int() refuses: ASCII digits only.
            start = int(last) if last.isascii() and last.isdigit() and len(last) < 12 else 1
            client = client_ip(request.scope)
            service.admission.enter_tail(client)  # 429 past the client's open streams
            return _sse(_counted_tail(_TailSlot(service, client), tail(service.store, query_id, start)), version)

        return await _answer(request, work)

    resources = [
        _resource(get, "/queries/{id:str}", lambda *a: current().query(*a)),
        _resource(post, "/queries/{id:str}/cancel", lambda *a: current().cancel(*a)),
        _resource(delete, "/sessions/{id:str}", lambda *a: current().delete_session(*a)),
        _resource(get, "/models", lambda *a: current().models(*a)),
        _resource(get, "/contexts", lambda *a: current().context_list(*a)),
    ]

    @get("/sessions/{id:str}", status_code=200, name="knowql get /sessions/{id:str}")
    async def session(request: Request[object, object, State]) -> ASGIResponse:
        session_id = request.path_params["id"]

        async def work(version: str) -> Answer:
            offset = _page_param(request, "offset", 0, 0, None)
            limit = _page_param(request, "limit", SESSION_PAGE, 1, SESSION_PAGE_MAX)
            return 200, await anyio.to_thread.run_sync(current().session, session_id, offset, limit)

        return await _answer(request, work)

    return [query, query_events, session, *resources]


class _TailSlot:
    """One of a client's open-stream slots, given back once, however the stream ends.

    Also when the stream never starts (the client left before the first byte): the
    generator holding the slot is then dropped unstarted, and so is the slot.
    """

    def __init__(self, service: KnowqlEngine, client: str) -> None:
        self.admission, self.client, self.held = service.admission, client, True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.admission.leave_tail(self.client)

    def __del__(self) -> None:
        self.release()


async def _counted_tail(slot: _TailSlot, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``frames``, giving the client's stream slot back when the stream ends (or the client leaves)."""
    try:
        async for frame in frames:
            yield frame
    finally:
        slot.release()


def _page_param(request: Request[object, object, State], name: str, default: int, low: int, high: int | None) -> int:
    """A paging query parameter: ASCII digits within ``low``..``high``, else 400."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) < 10) or int(raw) < low or (high is not None and int(raw) > high):
        bound = f"{low} to {high}" if high is not None else f"at least {low}"
        raise bad_request(f"{name} must be an integer, {bound}")
    return int(raw)


def _resource(method: Callable[..., HTTPRouteHandler], path: str, call: Callable[..., object]) -> HTTPRouteHandler:
    """A JSON resource route: ``call(id)`` (or ``call()`` without ``{id}``) in a thread, answered 200."""
    @method(path, status_code=200, name=f"knowql {method.__name__} {path}")
    async def resource(request: Request[object, object, State]) -> ASGIResponse:
        args = [request.path_params["id"]] if "id" in request.path_params else []

        async def work(version: str) -> tuple[int, object]:
            return 200, await anyio.to_thread.run_sync(call, *args)

        return await _answer(request, work)

    return resource


def discovery(relay: Relay, settings: Settings) -> dict[str, object]:
    """The ``knowql`` member: version, endpoint, API versions and contexts."""
    origin = relay.config.origin
    registry = ContextRegistry.load(origin, settings.knowql.contexts or None)
    return {"knowql": {
        "version": VERSION,
        "endpoint": origin + QUERY_PATH,
        "api_versions": list(API_VERSIONS),
        "default_api_version": API_VERSIONS[0],
        "version_header": VERSION_HEADER,
        "models": origin + "/models",
        "contexts": [{"id": c.id, "slug": c.slug, "name": c.name, "queryable": c.queryable}
                     for c in registry.contexts],
    }}
