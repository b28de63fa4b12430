"""Reading request bodies: one bounded, timed reader in front of every route.

Every request that may carry a body is read here, completely, before any
route (Litestar's or the ingest fast path) sees it; routes then receive the
buffered body as one ASGI message. That puts every body-level failure in one
place, each with a clean answer instead of a reset, a 500 or a stuck worker:

* a body over ``max_body`` (declared or counted) is read and discarded, up to
  :data:`DISCARD_LIMIT` bytes past the limit, before the 413 goes out, so a client that is
  still sending reads the answer instead of a TCP reset (unless it asked for
  ``Expect: 100-continue``: then it has sent nothing and the 413 goes out at once);
* a body that ends early is a 400: Granian reports both a client that closed
  mid-body and malformed chunked framing as ``http.disconnect``, and the answer
  reaches the client only in the second case (logged as one INFO line, no traceback);
* a body that has not fully arrived ``timeout`` seconds after the headers is
  a 408 and the connection is closed (``--body-timeout``).
"""

from __future__ import annotations

import asyncio
import logging
import enum
from typing import Final, Literal

import msgspec

from litestar.types import Receive, ReceiveMessage, Scope, Send

from akrelay.http.errors import send_json
from akrelay.protocol.errors import ProtocolError

log = logging.getLogger("akrelay.http")

#: Most bytes past ``max_body`` read and thrown away to deliver a 413 cleanly;
#: beyond, the connection is closed after the answer (the client may then see a reset).
DISCARD_LIMIT = 4 * 1024 * 1024

#: Methods whose requests are answered without reading a body.
BODYLESS_METHODS = frozenset({"GET", "HEAD"})

_TOO_LARGE = ProtocolError("payload_too_large", "The request body exceeds the published max_envelope_bytes limit.")
_INCOMPLETE = ProtocolError("invalid_request", "The request body is incomplete or its chunked framing is malformed.")
_CLOSE = [(b"connection", b"close")]
class _Past(enum.Enum):
    OVERSIZED = "oversized"


#: What ``_collect`` returns once the body is past ``max_body``.
_OVERSIZED: Final = _Past.OVERSIZED


class BodyReader:
    """Reads a whole request body within ``max_body`` bytes and ``timeout`` seconds.

    ``await reader(scope, receive, send)`` returns the body, or ``None`` after
    it has answered the request itself (413, 400 or 408).
    """

    __slots__ = ("max_body", "timeout")

    def __init__(self, max_body: int, timeout: float) -> None:
        self.max_body = max_body
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        if type(receive) is Buffered:  # read already, in front of the route
            return receive.body
        declared, expects_continue = _declared_length(scope)
        too_large = declared is not None and declared > self.max_body
        if too_large and expects_continue:  # nothing sent yet: refuse before the body
            await _refuse(send, _TOO_LARGE.http_status, _TOO_LARGE)
            return None
        try:
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + self.timeout):
                body = await self._collect(receive)
        except TimeoutError:
            if not too_large:
                await _refuse(send, 408, ProtocolError(
                    "invalid_request", f"The request body did not arrive within {self.timeout:g} s."))
                return None
            body = _OVERSIZED
        if too_large or body is _OVERSIZED:
            await _refuse(send, _TOO_LARGE.http_status, _TOO_LARGE)
            return None
        if body is None:
            log.info("request body ended early on %s %s (client closed or malformed framing)",
                     scope.get("method"), scope.get("path"))
            await _refuse(send, _INCOMPLETE.http_status, _INCOMPLETE)
            return None
        return body

    async def _collect(self, receive: Receive) -> bytes | Literal[_Past.OVERSIZED] | None:
        """The body; ``_OVERSIZED`` once it ended past ``max_body`` (the excess read and
        dropped, up to :data:`DISCARD_LIMIT`); ``None`` if it ended early within the limit."""
        message = await receive()
        if message["type"] != "http.request":
            return None
        body = message.get("body", b"")
        if not message.get("more_body", False):  # the common case: one message
            return body if len(body) <= self.max_body else _OVERSIZED
        chunks = [body]
        size = len(body)
        stop = self.max_body + DISCARD_LIMIT
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None if size <= self.max_body else _OVERSIZED
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.max_body:
                chunks.append(chunk)
            elif size > stop:
                return _OVERSIZED  # enough: the answer goes out and the connection closes
            if not message.get("more_body", False):
                return b"".join(chunks) if size <= self.max_body else _OVERSIZED


def _declared_length(scope: Scope) -> tuple[int | None, bool]:
    """The Content-Length (if one decimal value) and whether the client waits for ``100 Continue``."""
    declared = None
    expects_continue = False
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit():
            declared = int(value)
        elif name == b"expect" and value.lower() == b"100-continue":
            expects_continue = True
    return declared, expects_continue


async def _refuse(send: Send, status: int, exc: ProtocolError) -> None:
    """Answer a body failure and close; a client that is already gone is not an error."""
    try:
        await send_json(send, status, msgspec.json.encode(exc.to_wire()), _CLOSE)
    except Exception as err:  # noqa: BLE001 - the transport closed under us: nothing left to tell
        log.info("could not answer %d, client gone: %s", status, type(err).__name__)


class Buffered:
    """A ``receive`` that yields the already-read body once, then defers to the server (disconnects).

    The reader recognises it and hands the body over without a second pass.
    """

    __slots__ = ("body", "_receive", "_pending")

    def __init__(self, body: bytes, receive: Receive) -> None:
        self.body = body
        self._receive = receive
        self._pending = True

    async def __call__(self) -> ReceiveMessage:
        if self._pending:
            self._pending = False
            return {"type": "http.request", "body": self.body, "more_body": False}
        return await self._receive()
