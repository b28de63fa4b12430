"""The one place where failures become HTTP responses.

Every rejection leaves as the Identity §8.1 body ``{"error": {"code",
"message", "data"?}}`` with the status from ``HTTP_STATUS``. Framework errors
(unknown route, wrong method, oversized body) are translated to spec codes so a
client never sees a framework-specific shape; only a genuine bug is a 500.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import msgspec
from litestar import Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Send

from akrelay.protocol.errors import ProtocolError
from akrelay.store.base import StoreUnavailable

log = logging.getLogger("akrelay.http")

JSON = "application/json"
_encode = msgspec.json.encode


def error_response(exc: ProtocolError, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(content=_encode(exc.to_wire()), status_code=exc.http_status, media_type=JSON, headers=headers)


def error_body(code: str, message: str) -> bytes:
    return _encode({"error": {"code": code, "message": message}})


#: Framework statuses and the spec code each becomes.
_FRAMEWORK_CODES = {
    404: ("not_found", "No such resource."),
    405: ("invalid_request", "Method not allowed on this resource."),
    413: ("payload_too_large", "The request body exceeds the published max_envelope_bytes limit."),
    415: ("invalid_request", "Unsupported content type."),
    429: ("rate_limited", "Rate limit exceeded."),
}


def handle_protocol_error(request: Request[object, object, State], exc: ProtocolError) -> Response[bytes]:
    return error_response(exc)


def handle_http_exception(request: Request[object, object, State], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    if status >= 500:
        return handle_unexpected(request, exc)
    code, message = _FRAMEWORK_CODES.get(status, ("invalid_request", "The HTTP request is malformed."))
    headers = {"Allow": exc.headers["Allow"]} if exc.headers and "Allow" in exc.headers else None
    for page in getattr(request.app.state, "error_pages", ()):  # a component's own page for its URL space
        answer = page(request.url.path, status, headers["Allow"] if headers else None)
        if answer is not None:
            return answer  # type: ignore[no-any-return]
    return Response(content=error_body(code, message), status_code=status if status >= 400 else 400,
                    media_type=JSON, headers=headers)


async def send_json(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Send a complete JSON answer on a raw ASGI ``send`` (the routes outside Litestar's machinery)."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if extra:
        headers += extra
    start: HTTPResponseStartEvent = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send(HTTPResponseBodyEvent(type="http.response.body", body=body, more_body=False))  # False: the ASGI default


def internal_error_body() -> bytes:
    """The one 500 body (Identity §8.1 shape), for Litestar's handler and the ingest fast path."""
    return error_body("internal_error", "Internal server error.")


def unavailable_body(exc: StoreUnavailable) -> tuple[bytes, dict[str, str]]:
    """The 503 body and headers for a store outage (also sent by the ingest fast path)."""
    body = error_body("service_unavailable", f"The relay's store is unavailable; retry later ({exc}).")
    return body, {"Retry-After": str(exc.retry_after)}


class OutageLog:
    """Log an outage once, not once per request: a WARNING at the first 503 for a reason, then at
    most one every :attr:`interval` seconds while 503s for it go on, counting the ones not logged.

    A node under load answers thousands of requests a second during an outage; a line for each
    would bury the log and cost the disk exactly when the operator reads it. The reason (the
    message) tells outages apart: a full Redis after a restart is logged at once.
    """

    #: distinct reasons remembered (the oldest is forgotten): bounds the memory, whatever the messages
    MAX_REASONS = 64

    def __init__(self, interval: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        #: reason -> (when it was last logged, 503s since then not logged)
        self._seen: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def __call__(self, where: str, exc: StoreUnavailable) -> None:
        reason, now = str(exc), self._clock()
        with self._lock:
            last, quiet = self._seen.pop(reason, (float("-inf"), 0))
            if now - last < self.interval:
                self._seen[reason] = (last, quiet + 1)
                return
            self._seen[reason] = (now, 0)
            while len(self._seen) > self.MAX_REASONS:
                del self._seen[next(iter(self._seen))]
        more = f" ({quiet} more 503s for this since the last such line)" if quiet else ""
        log.warning("store unavailable on %s: %s%s", where, reason, more)


#: The one outage log of this process (the Litestar handler and the ingest fast path).
log_outage = OutageLog()


def handle_store_unavailable(request: Request[object, object, State], exc: StoreUnavailable) -> Response[bytes]:
    """An outage of the shared store, not a bug: 503 with ``Retry-After``, logged once (:class:`OutageLog`)."""
    log_outage(f"{request.method} {request.url.path}", exc)
    body, headers = unavailable_body(exc)
    return Response(content=body, status_code=503, media_type=JSON, headers=headers)


def handle_unexpected(request: Request[object, object, State], exc: Exception) -> Response[bytes]:
    """A bug, not bad input: log it with the request line and answer 500."""
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return Response(content=internal_error_body(), status_code=500, media_type=JSON)


EXCEPTION_HANDLERS = {
    ProtocolError: handle_protocol_error,
    StoreUnavailable: handle_store_unavailable,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
