"""``POST /v1/knowledge/events``: the ingest route, its commit batcher and its fast path.

The ingest hot path skips Litestar's request/response machinery (see
:class:`SubmitEndpoint` and :class:`IngestFastPath`) with the same semantics
as the routed handlers of :mod:`akrelay.http.app`, which mounts it.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import msgspec
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Message, Receive, Scope, Send

from akrelay.http.body import BodyReader
from akrelay.http.errors import JSON, error_body, internal_error_body, log_outage, send_json, unavailable_body
from akrelay.http.ratelimit import TokenBucket, retry_after_seconds
from akrelay.observability.metrics import metrics
from akrelay.protocol.errors import ProtocolError
from akrelay.relay.core import PendingCheck
from akrelay.store.base import StoreUnavailable
from akrelay.store.capabilities import blocking_io

if TYPE_CHECKING:  # annotations only
    from akrelay.protocol.envelope import Envelope
    from akrelay.relay.core import Relay
    from akrelay.store.base import Record

log = logging.getLogger("akrelay.http")

#: Threads per worker process for submissions: enough for concurrent requests to
#: meet at the store's group commit; a plain executor costs less per hop than anyio's.
SUBMIT_THREADS = 8


#: The §9.1 submission path (the routed handler and the fast path share it).
EVENTS_PATH = "/v1/knowledge/events"

#: Event-loop passes a commit group waits for before it is written (see ``SubmitEndpoint._drain``).
GATHER_PASSES = 3
#: Commit groups one worker may have in flight at once on a network store (each waits for a reply).
MAX_INFLIGHT = 4


def check_content_type(content_type: str | None) -> None:
    """The POST content-type rule (JSON, UTF-8) on the header value; every JSON POST endpoint applies it."""
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


def client_ip(scope: Scope) -> str:
    """The rate-limit key: the peer address of the connection."""
    client = scope.get("client")
    return client[0] if client else "unknown"


_ALLOW = "OPTIONS, POST"


class SubmitEndpoint:
    """``POST /v1/knowledge/events`` as a lean ASGI route inside the Litestar app.

    It is the ingest hot path, so it skips the generic request/response
    machinery but keeps the same semantics: the shared body reader (in
    :class:`~akrelay.http.app.RelayApp`) and the write bucket (:class:`IngestFastPath`, or the
    middleware for ``opt={"rate": "write"}``) run first, then the method, the
    content type, the body as :class:`~akrelay.http.body.BodyReader` hands it over, and
    every ``ProtocolError`` mapped exactly as :mod:`akrelay.http.errors` does;
    any other exception propagates to Litestar's handlers (a logged 500).

    §8.1 steps 1–6 run on the event loop (CPU-bound, a thread would not run
    them in parallel anyway), except the store lookups a submission really
    needs (:meth:`~akrelay.relay.core.Relay.check_local`: step 5's targets, or step 2
    after a refusal), which a network store answers on a thread so that an
    unreachable Redis stalls no other request; admitted envelopes queue for step 7, and one
    thread hop commits everything that queued meanwhile in one transaction
    (group commit without a hop per request). The answer is sent only after
    that transaction committed, so every 200 is durable.
    """

    def __init__(self, relay: Relay, read_body: BodyReader) -> None:
        self.relay = relay
        self.read_body = read_body
        self._queue: list[tuple[Envelope, int, asyncio.Future[tuple[Record, bool]]]] = []
        self._draining = False
        #: a store on the network (Redis) commits on threads always, several groups at once (:meth:`_dispatch`):
        #: the loop keeps verifying meanwhile
        self._offload = blocking_io(relay.store)
        self._inflight = 0
        #: threads start on first use (a busy commit point) and end with the app (:meth:`close`)
        self._pool = ThreadPoolExecutor(SUBMIT_THREADS, thread_name_prefix="akrelay-submit")

    def close(self) -> None:
        """Stop the commit threads (the app's shutdown, after the last request)."""
        self._pool.shutdown(wait=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method")  # an HTTP scope (the app routes no websocket here)
        if method != "POST":
            if method == "OPTIONS":
                await send(HTTPResponseStartEvent(type="http.response.start", status=204,
                                                  headers=[(b"allow", _ALLOW.encode())]))
                await send(HTTPResponseBodyEvent(type="http.response.body", body=b"", more_body=False))
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
            # steps 1-6 as far as they need no store: CPU, on the loop
            outcome: tuple[Record | None, Envelope, int] | PendingCheck = self.relay.check_local(raw)
            if isinstance(outcome, PendingCheck):  # targets to resolve, or a refusal that step 2 may overrule
                if self._offload:  # off the loop, so that an unreachable Redis stalls no one else
                    outcome = await asyncio.get_running_loop().run_in_executor(
                        self._pool, self.relay.finish_check, outcome)
                else:
                    outcome = self.relay.finish_check(outcome)
            existing, envelope, accepted_at = outcome
            if existing is None:
                try:
                    existing, created = await self._commit(envelope, accepted_at)
                except StoreUnavailable:
                    raise
                except Exception:
                    # Step 2 was deferred to the commit: if the envelope is already
                    # retained, a failed write must not turn its resubmission into a 500.
                    existing = self.relay.retained(envelope.id)
                    if existing is None:
                        raise
                    log.warning("commit of %s failed, but the record is retained; answering it", envelope.id,
                                exc_info=True)
        except ProtocolError as exc:
            metrics().refuse(exc.code)
            await send_json(send, exc.http_status, msgspec.json.encode(exc.to_wire()))
            return
        except StoreUnavailable as exc:
            # outside Litestar's exception handlers: the same 503 as handle_store_unavailable, one line in the log
            log_outage(f"POST {EVENTS_PATH}", exc)
            body, headers = unavailable_body(exc)
            await send_json(send, 503, body, [(k.lower().encode(), v.encode()) for k, v in headers.items()])
            return
        if created:
            metrics().accept(envelope.event["type"])
        else:
            metrics().duplicates.inc()
        # akrelay extension (issue 23): the new record's leaf index in the Merkle log, for its inclusion proof
        extra = [(b"akrelay-log-index", b"%d" % existing.log_index)] if created and existing.log_index is not None else None
        await send_json(send, 200, existing.to_json(), extra)

    def _commit(self, envelope: Envelope, accepted_at: int) -> asyncio.Future[tuple[Record, bool]]:
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
                if self._offload:
                    if self._inflight >= MAX_INFLIGHT:
                        return  # the group keeps growing; a finishing commit drains it
                    group, self._queue = self._queue, []
                    self._dispatch(loop, group)
                    continue
                group, self._queue = self._queue, []
                items = [(envelope, accepted_at) for envelope, accepted_at, _ in group]
                try:
                    # On the loop thread when no one else is writing (no thread hop);
                    # in a worker thread when the commit point is busy.
                    results = None if self._offload else self.relay.try_commit_admitted(items)
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

    def _dispatch(self, loop: asyncio.AbstractEventLoop,
                  group: list[tuple[Envelope, int, asyncio.Future[tuple[Record, bool]]]]) -> None:
        """Commit ``group`` on a thread without waiting for it (a network store: several groups in flight).

        A store on the network spends a commit waiting for the reply (and its fsync);
        with one group in flight per worker that wait, not the CPU, would bound ingest.
        The store orders concurrent groups at its own commit point (one script each).
        """
        self._inflight += 1
        items = [(envelope, accepted_at) for envelope, accepted_at, _ in group]
        done = loop.run_in_executor(self._pool, self.relay.commit_admitted, items)

        def finished(future: asyncio.Future[list[tuple[Record, bool]]]) -> None:
            self._inflight -= 1
            error = future.exception() if not future.cancelled() else asyncio.CancelledError()
            for index, (_, _, waiter) in enumerate(group):
                if waiter.done():
                    continue
                if error is not None:
                    waiter.set_exception(error)
                else:
                    waiter.set_result(future.result()[index])
            if self._queue and not self._draining:
                self._draining = True
                loop.create_task(self._drain(loop))

        done.add_done_callback(finished)


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
        wait = await self.bucket.acquire(client_ip(scope))
        if wait > 0:
            await refuse_rate_limited(send, retry_after_seconds(wait), "write")
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.submitter(scope, receive, tracked)
        except Exception:
            log.exception("unhandled error on POST %s", scope.get("path"))
            if not started:
                await send_json(send, 500, internal_error_body())


async def refuse_rate_limited(send: Send, retry_after: int, kind: str) -> None:
    """A 429 ``rate_limited`` with ``Retry-After`` (the middleware and the fast path)."""
    metrics().rate_limited.labels(kind).inc()
    body = error_body("rate_limited", f"Too many {kind} requests from this client; retry after {retry_after} s.")
    await send_json(send, 429, body, [(b"retry-after", str(retry_after).encode())])
