"""The Litestar application: Knowledge §9.1 endpoints as thin handlers over ``Relay``.

Handlers read raw bytes, call the service and return bytes; the service owns
every rule and :mod:`akrelay.http.errors` owns every error mapping. No DTOs,
no OpenAPI, no compression: ingest speed is a goal, and the JSON bodies are
already produced by splicing stored canonical bytes.

The app only mounts routes: the core §9.1 routes here, and those of the
components of its :class:`akrelay.node.RelayNode` (search, KIP, KnowQL, ...).
Its lifespan starts the node's components and stops them (in reverse order,
then the store the node opened). Handlers that write mark themselves with
``opt={"rate": "write"}``.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Protocol
from urllib.parse import parse_qsl

import msgspec
from litestar import Litestar, Request, asgi, get, post
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Receive, Scope, Send

from akrelay.http.body import BODYLESS_METHODS, BodyReader, Buffered
from akrelay.http.errors import EXCEPTION_HANDLERS, JSON, error_body, internal_error_body, send_json
from akrelay.http.ratelimit import TokenBucket, retry_after_seconds
from akrelay.observability.metrics import metrics
from akrelay.observability.requests import RequestObserver
from akrelay.protocol.errors import ProtocolError
from akrelay.settings import Settings

log = logging.getLogger("akrelay.http")

#: Threads per worker process for submissions: enough for concurrent requests to
#: meet at the store's group commit; a plain executor costs less per hop than anyio's.
SUBMIT_THREADS = 8


#: The §9.1 submission path (the routed handler and the fast path share it).
EVENTS_PATH = "/v1/knowledge/events"

#: Event-loop passes a commit group waits for before it is written (see ``SubmitEndpoint._drain``).
GATHER_PASSES = 3

#: Query strings with more pairs than this are refused before reaching the core.
MAX_QUERY_PAIRS = 64


def _json(body: bytes) -> ASGIResponse:
    """A 200 JSON answer as Litestar's low-level response: no serialization step at all."""
    return ASGIResponse(body=body, status_code=200, media_type=JSON)


def _require_json(request: Request) -> None:
    """POST bodies are JSON (Knowledge §9.1); anything else is ``invalid_request``."""
    check_content_type(request.headers.get("content-type"))


def check_content_type(content_type: str | None) -> None:
    """The content-type rule of :func:`_require_json` on the header value itself."""
    if content_type is None:
        raise ProtocolError("invalid_request", "Content-Type must be application/json.")
    if content_type == JSON:  # the common case, no parsing
        return
    media, _, params = content_type.partition(";")
    if media.strip().lower() != "application/json":
        raise ProtocolError("invalid_request", f"Content-Type must be application/json, not {media.strip()!r}.")
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise ProtocolError("invalid_request", "JSON bodies must be UTF-8.")


def query_pairs(raw: bytes) -> list[tuple[str, str]]:
    """Decode a query string as application/x-www-form-urlencoded, keeping order and repeats."""
    try:
        text = raw.decode("ascii")
        return parse_qsl(text, keep_blank_values=True, strict_parsing=False,
                         encoding="utf-8", errors="strict", max_num_fields=MAX_QUERY_PAIRS)
    except UnicodeDecodeError:
        raise ProtocolError("invalid_request", "The query string is not valid percent-encoded UTF-8.") from None
    except ValueError:
        raise ProtocolError("invalid_request", f"The query string has more than {MAX_QUERY_PAIRS} parameters.") from None


def client_ip(scope: Scope) -> str:
    client = scope.get("client")
    return client[0] if client else "unknown"


class Node(Protocol):
    """What the app needs of its owner (:class:`akrelay.node.RelayNode`): no import upwards."""

    relay: Any
    settings: Settings

    def routes(self) -> list[Any]: ...
    def discovery(self) -> dict[str, Any]: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


def core_routes(node: Node, submitter: "SubmitEndpoint") -> list[Any]:
    """The Knowledge §9.1 endpoints (``submitter`` is shared with :class:`IngestFastPath`)."""
    relay = node.relay
    discovery_body = msgspec.json.encode(node.discovery())

    @get("/.well-known/agent-knowledge", sync_to_thread=False)
    def discovery() -> ASGIResponse:
        return _json(discovery_body)

    @asgi(EVENTS_PATH, opt={"rate": "write"}, copy_scope=False)
    async def submit(scope: Scope, receive: Receive, send: Send) -> None:
        await submitter(scope, receive, send)

    @get("/v1/knowledge/events/{event_id:path}", sync_to_thread=False)
    def lookup(request: Request) -> ASGIResponse:
        return _json(relay.get(request.path_params["event_id"].lstrip("/")).to_json())

    @get("/v1/knowledge/query", sync_to_thread=False)
    def query(request: Request) -> ASGIResponse:
        return _json(relay.query(query_pairs(request.scope["query_string"])).to_json())

    @post("/v1/knowledge/batch", status_code=200)
    async def batch(request: Request) -> ASGIResponse:
        _require_json(request)
        return _json(relay.batch(await request.body()).to_json())

    return [discovery, submit, lookup, query, batch]


_ALLOW = "OPTIONS, POST"


class SubmitEndpoint:
    """``POST /v1/knowledge/events`` as a lean ASGI route inside the Litestar app.

    It is the ingest hot path, so it skips the generic request/response
    machinery but keeps the same semantics: the shared body reader (in
    :class:`RelayApp`) and the write bucket (:class:`IngestFastPath`, or the
    middleware for ``opt={"rate": "write"}``) run first, then the method, the
    content type, the body as :class:`~akrelay.http.body.BodyReader` hands it over, and
    every ``ProtocolError`` mapped exactly as :mod:`akrelay.http.errors` does;
    any other exception propagates to Litestar's handlers (a logged 500).

    §8.1 steps 1–6 run on the event loop (CPU-bound, a thread would not run
    them in parallel anyway); admitted envelopes queue for step 7, and one
    thread hop commits everything that queued meanwhile in one transaction
    (group commit without a hop per request). The answer is sent only after
    that transaction committed, so every 200 is durable.
    """

    def __init__(self, relay: Any, read_body: BodyReader) -> None:
        self.relay = relay
        self.read_body = read_body
        self._queue: list[tuple[Any, int, asyncio.Future]] = []
        self._draining = False
        #: threads start on first use (a busy commit point) and end with the app (:meth:`close`)
        self._pool = ThreadPoolExecutor(SUBMIT_THREADS, thread_name_prefix="akrelay-submit")

    def close(self) -> None:
        """Stop the commit threads (the app's shutdown, after the last request)."""
        self._pool.shutdown(wait=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method != "POST":
            if method == "OPTIONS":
                await send({"type": "http.response.start", "status": 204, "headers": [(b"allow", _ALLOW.encode())]})
                await send({"type": "http.response.body", "body": b""})
                return
            body = error_body("invalid_request", "Method not allowed on this resource.")
            await send_json(send, 405, body, [(b"allow", _ALLOW.encode())])
            return
        content_type = None
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value.decode("latin-1")
                break
        try:
            check_content_type(content_type)
        except ProtocolError as exc:
            metrics().refuse(exc.code)
            await send_json(send, exc.http_status, msgspec.json.encode(exc.to_wire()))
            return
        raw = await self.read_body(scope, receive, send)
        if raw is None:  # answered by the reader (413, 400, 408)
            return
        created = False
        try:
            existing, envelope, accepted_at = self.relay.check(raw, expect_new=True)
            if existing is None:
                try:
                    existing, created = await self._commit(envelope, accepted_at)
                except Exception:
                    # Step 2 was deferred to the commit: if the envelope is already
                    # retained, a failed write must not turn its resubmission into a 500.
                    existing = self.relay.retained(envelope.id)
                    if existing is None:
                        raise
        except ProtocolError as exc:
            metrics().refuse(exc.code)
            await send_json(send, exc.http_status, msgspec.json.encode(exc.to_wire()))
            return
        if created:
            metrics().accept(envelope.event["type"])
        else:
            metrics().duplicates.inc()
        await send_json(send, 200, existing.to_json())

    def _commit(self, envelope: Any, accepted_at: int) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.append((envelope, accepted_at, future))
        if not self._draining:
            self._draining = True
            loop.create_task(self._drain(loop))
        return future

    async def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            # Let requests whose bodies have already arrived reach the queue first:
            # larger groups write each shared page (the log's last leaf, a term's
            # last leaf) once for more acceptances. Measured: +3-5 % accepted/s.
            for _ in range(GATHER_PASSES):
                await asyncio.sleep(0)
            while self._queue:
                group, self._queue = self._queue, []
                items = [(envelope, accepted_at) for envelope, accepted_at, _ in group]
                try:
                    # On the loop thread when no one else is writing (no thread hop);
                    # in a worker thread when the commit point is busy.
                    results = self.relay.try_commit_admitted(items)
                    if results is None:
                        results = await loop.run_in_executor(self._pool, self.relay.commit_admitted, items)
                except BaseException as exc:  # every waiter learns of the failure
                    for _, _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for (_, _, future), result in zip(group, results):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._draining = False


def rate_buckets(settings: Settings) -> dict[str, TokenBucket]:
    """One worker's token buckets, shared by the middleware and the ingest fast path."""
    return {
        "write": TokenBucket(settings.write_rate, settings.write_burst),
        "read": TokenBucket(settings.read_rate, settings.read_burst),
    }


def rate_limit_middleware(settings: Settings, buckets: dict[str, TokenBucket] | None = None) -> Callable[[ASGIApp], ASGIApp]:
    """Admission by token bucket per client IP; runs after routing so it knows the handler."""
    buckets = buckets if buckets is not None else rate_buckets(settings)

    def factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                handler = scope.get("route_handler")
                kind = handler.opt.get("rate", "read") if handler is not None else "read"
                bucket = buckets.get(kind)
                wait = bucket.take(client_ip(scope)) if bucket is not None else 0.0
                if wait > 0:
                    await _refuse(send, retry_after_seconds(wait), kind)
                    return
            await app(scope, receive, send)
        return middleware

    return factory


class IngestFastPath:
    """``POST`` to the events path without Litestar's layers, with the same semantics.

    Litestar's router, middleware chain and exception wrapper cost about as much
    per request as the rest of the HTTP handling; on the ingest hot path the
    route is known from the path alone. This does exactly what the routed
    handler does: the write token bucket, then :class:`SubmitEndpoint`, and an
    unexpected exception is logged and answered as the app's 500.
    """

    __slots__ = ("submitter", "bucket")

    def __init__(self, submitter: "SubmitEndpoint", bucket: TokenBucket) -> None:
        self.submitter = submitter
        self.bucket = bucket

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        wait = self.bucket.take(client_ip(scope))
        if wait > 0:
            await _refuse(send, retry_after_seconds(wait), "write")
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.submitter(scope, receive, tracked)
        except Exception:
            log.exception("unhandled error on POST %s", scope.get("path"))
            if not started:
                await send_json(send, 500, internal_error_body())


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

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.observer is not None:
            await self.observer(self._serve, scope, receive, send)
        else:
            await self._serve(scope, receive, send)

    async def _serve(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
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

    async def head(message: Any) -> None:
        if message["type"] == "http.response.body":
            if message.get("more_body", False):
                return
            message = {"type": "http.response.body", "body": b""}
        await send(message)

    return head


async def _refuse(send: Send, retry_after: int, kind: str) -> None:
    metrics().rate_limited.labels(kind).inc()
    body = error_body("rate_limited", f"Too many {kind} requests from this client; retry after {retry_after} s.")
    await send_json(send, 429, body, [(b"retry-after", str(retry_after).encode())])


def build_app(node: Node) -> "RelayApp":
    """The app over ``node``: the core routes and the node's; the lifespan starts and stops the node.

    :func:`akrelay.app.create_app` builds the node from settings or a relay.
    """
    relay, settings = node.relay, node.settings
    read_body = BodyReader(settings.max_envelope_bytes, settings.body_timeout)
    submitter = SubmitEndpoint(relay, read_body)
    handlers = core_routes(node, submitter) + node.routes()
    buckets = rate_buckets(settings)
    app = RelayApp(
        route_handlers=handlers,
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        middleware=[rate_limit_middleware(settings, buckets)],
        request_max_body_size=settings.max_envelope_bytes,
        openapi_config=None,
        compression_config=None,
        logging_config=None,
        debug=False,
        on_startup=[node.start],
        on_shutdown=[submitter.close, node.stop],
    )
    app.state.node = node
    app.state.relay = relay
    app.state.settings = settings
    app.ingest = IngestFastPath(submitter, buckets["write"])
    app.read_body = read_body
    app.observer = RequestObserver(log_json=getattr(settings, "log_json", False), fast_path=EVENTS_PATH)
    return app
