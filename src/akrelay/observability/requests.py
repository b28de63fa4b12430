"""Per-request observation: the latency histogram by route and, optionally, one JSON log line.

Wraps the whole app (:class:`akrelay.http.app.RelayApp` calls it first), so the
ingest fast path, refusals by the body reader and 429s are measured like every
routed request. The route label is the matched path template (bounded
cardinality), ``unmatched`` for a 404 from the router.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from typing import Any, Awaitable, Callable

from akrelay.observability.metrics import metrics

access_log = logging.getLogger("akrelay.access")


def _route(scope: dict[str, Any], fast_path: str) -> str:
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

    async def __call__(self, call: Callable[..., Awaitable[None]], scope: Any, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        method = scope.get("method", "")  # before HEAD is served as GET
        status = 0

        async def tracked(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await call(scope, receive, tracked)
        finally:
            seconds = time.perf_counter() - started
            route = _route(scope, self.fast_path)
            metrics().request(route, method, status or 500, seconds)
            if self.log_json:
                request_id = None
                for name, value in scope.get("headers", ()):
                    if name == b"x-request-id":
                        request_id = value.decode("latin-1")[:128]
                        break
                access_log.info(json.dumps({
                    "ts": round(time.time(), 3), "request_id": request_id or uuid.uuid4().hex, "method": method,
                    "route": route, "path": scope.get("path"), "status": status or 500,
                    "duration_ms": round(seconds * 1000, 3)}, ensure_ascii=False))
