"""The Litestar application: Knowledge §9.1 endpoints as thin handlers over ``Relay``.

Handlers read raw bytes, call the service and return bytes; the service owns
every rule and :mod:`akrelay.http.errors` owns every error mapping. No DTOs,
no OpenAPI, no compression: ingest speed is a goal, and the JSON bodies are
already produced by splicing stored canonical bytes.

The app only mounts routes: the core §9.1 routes here (the ingest route and
its commit batcher live in :mod:`akrelay.http.ingest`), and those of the
components of its :class:`akrelay.node.RelayNode` (search, KIP, KnowQL, ...).
Its lifespan starts the node's components and stops them (in reverse order,
then the store the node opened). Handlers that write mark themselves with
``opt={"rate": "write"}``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

import anyio
import msgspec
from litestar import Litestar, Request, asgi, get, post
from litestar.datastructures import State
from litestar.enums import ScopeType
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from akrelay.http.body import BODYLESS_METHODS, BodyReader, Buffered
from akrelay.http.errors import EXCEPTION_HANDLERS, JSON
from akrelay.http.health import Readiness, health_routes
from akrelay.http.querystring import query_pairs
from akrelay.http.ingest import (EVENTS_PATH, IngestFastPath, SubmitEndpoint, check_content_type, client_ip,
                                 refuse_rate_limited)
from akrelay.http.ratelimit import RateLimits, TokenBucket, retry_after_seconds
from akrelay.observability.requests import RequestObserver
from akrelay.settings import Settings
from akrelay.store.capabilities import blocking_io

if TYPE_CHECKING:  # annotations only
    from litestar import Response
    from litestar.handlers import BaseRouteHandler
    from litestar.plugins import PluginProtocol
    from akrelay.relay.core import Relay

log = logging.getLogger("akrelay.http")

def _json(body: bytes) -> ASGIResponse:
    """A 200 JSON answer as Litestar's low-level response: no serialization step at all."""
    return ASGIResponse(body=body, status_code=200, media_type=JSON)


def _require_json(request: Request[object, object, State]) -> None:
    """POST bodies are JSON (Knowledge §9.1); anything else is ``invalid_request``."""
    check_content_type(request.headers.get("content-type"))


@runtime_checkable
class Opening(Protocol):
    """A component that keeps opening something after its ``start()`` (``/readyz`` waits for it)."""

    def opening(self) -> str | None:
        """Why ``/readyz`` waits, or ``None`` once it is open."""
        ...


@runtime_checkable
class ErrorPages(Protocol):
    """A component that answers the app's 404 and 405 in its own URL space (the explorer's HTML pages)."""

    def error_page(self, path: str, status: int, allow: str | None) -> Response[bytes] | None: ...


class Node(Protocol):
    """What the app needs of its owner (:class:`akrelay.node.RelayNode`): no import upwards.

    Its components may also be :class:`Opening` or :class:`ErrorPages`.
    """

    relay: Relay
    settings: Settings

    @property
    def components(self) -> Sequence[object]: ...
    @property
    def started(self) -> bool:
        """Between a completed ``start()`` and ``stop()`` (``/readyz``)."""
        ...
    def routes(self) -> list[BaseRouteHandler]: ...
    def discovery(self) -> dict[str, object]: ...
    def rate_limits(self) -> RateLimits: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


def core_routes(node: Node, submitter: SubmitEndpoint) -> list[BaseRouteHandler]:
    """The Knowledge §9.1 endpoints (``submitter`` is shared with :class:`IngestFastPath`)."""
    relay = node.relay
    discovery_body = msgspec.json.encode(node.discovery())
    # A store on the network (Redis) waits for replies: read there off the event loop, so that an
    # outage or a slow reply never stalls other requests. An embedded store answers faster than a thread hop.
    offload = blocking_io(relay.store)

    @get("/.well-known/agent-knowledge", sync_to_thread=False)
    def discovery() -> ASGIResponse:
        return _json(discovery_body)

    @asgi(EVENTS_PATH, opt={"rate": "write"}, copy_scope=False)
    async def submit(scope: Scope, receive: Receive, send: Send) -> None:
        await submitter(scope, receive, send)

    @get("/v1/knowledge/events/{event_id:path}", sync_to_thread=offload)
    def lookup(request: Request[object, object, State]) -> ASGIResponse:
        return _json(relay.get(request.path_params["event_id"].lstrip("/")).to_json())

    @get("/v1/knowledge/query", sync_to_thread=offload)
    def query(request: Request[object, object, State]) -> ASGIResponse:
        return _json(relay.query(query_pairs(request.scope["query_string"])).to_json())

    @post("/v1/knowledge/batch", status_code=200)
    async def batch(request: Request[object, object, State]) -> ASGIResponse:
        _require_json(request)
        body = await request.body()
        if offload:
            return _json((await anyio.to_thread.run_sync(relay.batch, body)).to_json())
        return _json(relay.batch(body).to_json())

    return [discovery, submit, lookup, query, batch]


def rate_limit_middleware(buckets: dict[str, TokenBucket]) -> Callable[[ASGIApp], ASGIApp]:
    """Admission by token bucket per client IP; runs after routing so it knows the handler.

    ``buckets``: one worker's, from the node's backend (per process, or shared in Redis),
    also used by the ingest fast path; the app's shutdown closes them.
    """

    def factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == ScopeType.HTTP:
                handler = scope.get("route_handler")
                kind = handler.opt.get("rate", "read") if handler is not None else "read"
                bucket = buckets.get(kind)
                wait = await bucket.acquire(client_ip(scope)) if bucket is not None else 0.0
                if wait > 0:
                    await refuse_rate_limited(send, retry_after_seconds(wait), kind)
                    return
            await app(scope, receive, send)
        return middleware

    return factory


class RelayApp(Litestar):
    """The Litestar app behind two shared front steps, then the ingest fast path.

    Every request that may carry a body is read whole by one
    :class:`~akrelay.http.body.BodyReader` (size cap, time bound, clean 400/408/413)
    and handed on as one buffered message, so no route reads a socket itself.
    ``HEAD`` is served as ``GET`` without the body, for every GET resource.
    ``POST /v1/knowledge/events`` then short-circuits to :class:`IngestFastPath`;
    every other request goes through Litestar unchanged, so routing, the
    405/OPTIONS answers and the error mapping stay in one place.
    """

    ingest: "IngestFastPath | None" = None  # set by build_app
    read_body: "BodyReader | None" = None  # set by build_app
    observer: "RequestObserver | None" = None  # set by build_app: latency metrics, JSON access log

    @staticmethod
    def _get_default_plugins(plugins: list[PluginProtocol]) -> list[PluginProtocol]:
        """Litestar's default plugins less the pydantic and attrs ones, which akrelay does not use.

        Litestar adds those whenever the libraries are installed, and importing its pydantic
        plugin (pydantic, its DTOs) was the largest single cost of a worker's start (issue 25:
        about 0.3 s of CPU of each worker, before it can answer). The msgspec plugin stays: it
        is the one the handlers' parameters go through.
        """
        from litestar.plugins.core import MsgspecDIPlugin

        return [*plugins, MsgspecDIPlugin()]

    # Litestar's __call__ takes a scope and its receive and send of one kind (HTTP, websocket or lifespan) as
    # independent unions; the kind is known only after the scope's type is read, which narrows the scope alone.
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:  # Any: one ASGI kind per call (above)
        if scope["type"] != "http":  # lifespan, websocket: Litestar's own
            await super().__call__(scope, receive, send)
        elif self.observer is not None:
            await self.observer(self._serve, scope, receive, send)
        else:
            await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            method = scope["method"]
            if method == "HEAD":
                scope["method"] = "GET"  # in place: the observer reads the matched route from this scope
                send = _headers_only(send)
            elif method not in BODYLESS_METHODS and self.read_body is not None:
                body = await self.read_body(scope, receive, send)
                if body is None:  # the reader answered (413, 400, 408)
                    return
                receive = Buffered(body, receive)
                if scope["path"] == EVENTS_PATH and method == "POST" and self.ingest:
                    await self.ingest(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)


def _headers_only(send: Send) -> Send:
    """``send`` for a HEAD request: the GET answer's status and headers, an empty body."""

    async def head(message: Message) -> None:
        if message["type"] == "http.response.body":
            if message.get("more_body", False):
                return
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await send(message)

    return head


def opening(node: Node) -> str | None:
    """What a component of ``node`` still opens in the background (``/readyz`` waits for it), or ``None``."""
    for component in node.components:
        reason = component.opening() if isinstance(component, Opening) else None
        if reason:
            return str(reason)
    return None


def build_app(node: Node) -> "RelayApp":
    """The app over ``node``: the core routes and the node's; the lifespan starts and stops the node.

    :func:`akrelay.process.worker.create_app` builds the node from settings or a relay.
    """
    relay, settings = node.relay, node.settings
    read_body = BodyReader(settings.max_envelope_bytes, settings.body_timeout)
    submitter = SubmitEndpoint(relay, read_body)
    readiness = Readiness(relay.store, lambda: node.started, lambda: opening(node))
    handlers = core_routes(node, submitter) + health_routes(readiness) + node.routes()
    buckets = node.rate_limits()
    app = RelayApp(
        route_handlers=handlers,
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        middleware=[rate_limit_middleware(buckets)],
        request_max_body_size=settings.max_envelope_bytes,
        openapi_config=None,
        compression_config=None,
        logging_config=None,
        debug=False,
        on_startup=[node.start],
        on_shutdown=[submitter.close, node.stop, readiness.close, buckets.close],
    )
    app.state.node = node
    app.state.relay = relay
    app.state.settings = settings
    #: Components that answer 404/405 in their own URL space (the explorer's HTML pages).
    app.state.error_pages = [c.error_page for c in node.components if isinstance(c, ErrorPages)]
    app.ingest = IngestFastPath(submitter, buckets["write"])
    app.read_body = read_body
    app.observer = RequestObserver(log_json=settings.observability.log_json, fast_path=EVENTS_PATH)
    return app
