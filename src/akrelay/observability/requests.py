"""Per-request observation: the latency histogram by route and, optionally, one JSON log line.

Wraps the whole app (:class:`akrelay.http.app.RelayApp` calls it first), so the
ingest fast path, refusals by the body reader and 429s are measured like every
routed request. Every label is bounded whatever the client sends: the route is
the matched path template, ``unmatched`` when the router matched none; the method
is one of HTTP's own (:data:`METHODS`), else ``other``; the status is the app's.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from typing import TYPE_CHECKING, Awaitable, Callable

from akrelay.observability.metrics import metrics

if TYPE_CHECKING:
    from litestar.types import Message, Receive, Scope, Send

access_log = logging.getLogger("akrelay.access")

#: The methods recorded by name; any other (a client may send any token) is recorded as ``other``,
#: so made-up methods cannot grow ``/metrics`` (issue 24: 2,000 of them took it from 115 KB to 3.8 MB).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"})
#: Longest method written to the access log (a line per request stays short).
LOG_METHOD_MAX = 32


def method_label(method: str) -> str:
    """``method`` if HTTP defines it, else ``other``."""
    return method if method in METHODS else "other"


def _route(scope: Scope, fast_path: str) -> str:
    template = scope.get("path_template")
    if template:
        return str(template)
    return fast_path if scope.get("path") == fast_path else "unmatched"


def json_access_log() -> None:
    """Send ``akrelay.access`` records, already JSON, to stderr one per line (idempotent)."""
    if not any(getattr(h, "_akrelay_json", False) for h in access_log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._akrelay_json = True  # type: ignore[attr-defined] # noqa: SLF001 - our own marker
        access_log.addHandler(handler)
        access_log.setLevel(logging.INFO)
        access_log.propagate = False


class RequestObserver:
    __slots__ = ("log_json", "fast_path")

    def __init__(self, *, log_json: bool, fast_path: str) -> None:
        self.log_json = log_json
        self.fast_path = fast_path
        if log_json:
            json_access_log()

    async def __call__(self, call: Callable[[Scope, Receive, Send], Awaitable[None]], scope: Scope, receive: Receive,
                       send: Send) -> None:
        started = time.perf_counter()
        method = str(scope.get("method", ""))  # before HEAD is served as GET (a websocket scope has none)
        status = 0

        async def tracked(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await call(scope, receive, tracked)
        finally:
            seconds = time.perf_counter() - started
            route = _route(scope, self.fast_path)
            metrics().request(route, method_label(method), status or 500, seconds)
            if self.log_json:
                request_id = None
                for name, value in scope.get("headers", ()):
                    if name == b"x-request-id":
                        request_id = value.decode("latin-1")[:128]
                        break
                access_log.info(json.dumps({
                    "ts": round(time.time(), 3), "request_id": request_id or uuid.uuid4().hex,
                    "method": method[:LOG_METHOD_MAX],
                    "route": route, "path": scope.get("path"), "status": status or 500,
                    "duration_ms": round(seconds * 1000, 3)}, ensure_ascii=False))
