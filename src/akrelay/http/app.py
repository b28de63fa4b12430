"""The Litestar application: Knowledge §9.1 endpoints as thin handlers over ``Relay``.

Handlers read raw bytes, call the service and return bytes; the service owns
every rule and :mod:`akrelay.http.errors` owns every error mapping. No DTOs,
no OpenAPI, no compression: ingest speed is a goal, and the JSON bodies are
already produced by splicing stored canonical bytes.

Other areas add endpoints without touching this file: a module listed in
:data:`ROUTE_MODULES` (or a callable appended to :data:`ROUTE_PROVIDERS`)
exposes ``routes(relay, settings) -> list[handler]`` and, optionally,
``discovery(relay, settings) -> dict`` with members merged into the discovery
document (``features``, ``search_modes`` and ``endpoints`` are merged, other
members set). Handlers that write mark themselves with ``opt={"rate": "write"}``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable
from urllib.parse import parse_qsl

import msgspec
from litestar import Litestar, Request, get, post
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Receive, Scope, Send

from akrelay.http.errors import EXCEPTION_HANDLERS, JSON, error_body
from akrelay.http.ratelimit import TokenBucket, retry_after_seconds
from akrelay.protocol.errors import ProtocolError
from akrelay.settings import Settings

log = logging.getLogger("akrelay.http")

RouteProvider = Callable[[Any, Settings], list[Any]]
DiscoveryProvider = Callable[[Any, Settings], dict[str, Any]]

#: Modules that contribute routes; a module that does not exist yet is skipped.
ROUTE_MODULES: tuple[str, ...] = ("akrelay.http.search", "akrelay.http.kip", "akrelay.http.peers")
#: Extra programmatic providers (tests, embedding applications).
ROUTE_PROVIDERS: list[RouteProvider] = []
DISCOVERY_PROVIDERS: list[DiscoveryProvider] = []

#: Threads per worker process for submissions: enough for concurrent requests to
#: meet at the store's group commit; a plain executor costs less per hop than anyio's.
SUBMIT_THREADS = 8
_submit_pool: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _submit_pool
    if _submit_pool is None:
        _submit_pool = ThreadPoolExecutor(SUBMIT_THREADS, thread_name_prefix="akrelay-submit")
    return _submit_pool


#: Query strings with more pairs than this are refused before reaching the core.
MAX_QUERY_PAIRS = 64


def _json(body: bytes) -> ASGIResponse:
    """A 200 JSON answer as Litestar's low-level response: no serialization step at all."""
    return ASGIResponse(body=body, status_code=200, media_type=JSON)


def _require_json(request: Request) -> None:
    """POST bodies are JSON (Knowledge §9.1); anything else is ``invalid_request``."""
    content_type = request.headers.get("content-type")
    if content_type is None:
        raise ProtocolError("invalid_request", "Content-Type must be application/json.")
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


def core_routes(relay: Any, settings: Settings) -> list[Any]:
    """The Knowledge §9.1 endpoints."""
    discovery_body = discovery_document_json(relay, settings)

    @get("/.well-known/agent-knowledge", sync_to_thread=False)
    def discovery() -> ASGIResponse:
        return _json(discovery_body)

    @post("/v1/knowledge/events", opt={"rate": "write"}, status_code=200)
    async def submit(request: Request) -> ASGIResponse:
        _require_json(request)
        body = await request.body()
        # In a thread: verification overlaps with other requests, and concurrent
        # submissions meet at the store's commit point, which groups them into one
        # transaction (and a SQLite busy wait never stalls the event loop).
        record, _created = await asyncio.get_running_loop().run_in_executor(_pool(), relay.submit, body)
        return _json(record.to_json())

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


def _load_modules() -> list[Any]:
    modules = []
    for name in ROUTE_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return modules


def discovery_document(relay: Any, settings: Settings) -> dict[str, Any]:
    """The relay's §9.2 document plus extension members from other areas."""
    doc = dict(relay.discovery())
    modules = [] if settings.core_only else _load_modules()
    extensions = [getattr(m, "discovery", None) for m in modules] + list(DISCOVERY_PROVIDERS)
    for provider in extensions:
        if provider is None:
            continue
        extra = provider(relay, settings) or {}
        for key, value in extra.items():
            if key == "endpoints":
                doc["endpoints"] = {**doc.get("endpoints", {}), **value}
            elif key in ("features", "search_modes"):
                merged = list(doc.get(key, []))
                merged.extend(v for v in value if v not in merged)
                doc[key] = merged
            elif key == "limits":
                doc["limits"] = {**doc.get("limits", {}), **value}
            else:
                doc[key] = value
    return doc


def discovery_document_json(relay: Any, settings: Settings) -> bytes:
    return msgspec.json.encode(discovery_document(relay, settings))


def rate_limit_middleware(settings: Settings) -> Callable[[ASGIApp], ASGIApp]:
    """Admission by token bucket per client IP; runs after routing so it knows the handler."""
    buckets = {
        "write": TokenBucket(settings.write_rate, settings.write_burst),
        "read": TokenBucket(settings.read_rate, settings.read_burst),
    }

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


async def _refuse(send: Send, retry_after: int, kind: str) -> None:
    body = error_body("rate_limited", f"Too many {kind} requests from this client; retry after {retry_after} s.")
    await send({"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(retry_after).encode()),
    ]})
    await send({"type": "http.response.body", "body": body})


def create_app(settings_or_relay: Any, settings: Settings | None = None) -> Litestar:
    """Build the app from ``Settings`` (opens the relay in ``settings.data``) or from a ``Relay``.

    With a relay, ``settings`` supplies the HTTP-level options (limits, rates);
    defaults are used when omitted.
    """
    from akrelay.settings import defaults

    owns_relay = False
    if isinstance(settings_or_relay, Settings):
        settings = settings_or_relay
        from akrelay.server import open_relay_for

        relay = open_relay_for(settings)
        owns_relay = True
    else:
        relay = settings_or_relay
        settings = settings if settings is not None else defaults()

    handlers = core_routes(relay, settings)
    for module in ([] if settings.core_only else _load_modules()):
        routes = getattr(module, "routes", None)
        if routes is not None:
            handlers.extend(routes(relay, settings))
    for provider in ROUTE_PROVIDERS:
        handlers.extend(provider(relay, settings))

    on_shutdown = [relay.close] if owns_relay else []
    app = Litestar(
        route_handlers=handlers,
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        middleware=[rate_limit_middleware(settings)],
        request_max_body_size=settings.max_envelope_bytes,
        openapi_config=None,
        compression_config=None,
        logging_config=None,
        debug=False,
        on_shutdown=on_shutdown,
    )
    app.state.relay = relay
    app.state.settings = settings
    return app


def create_app_from_env() -> Litestar:
    """Granian factory target: each worker resolves the launcher's settings."""
    from akrelay.settings import from_resolved_env

    return create_app(from_resolved_env())
