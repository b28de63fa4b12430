"""The push stream: ``GET /v1/knowledge/stream``, server-sent announcements of new acceptances.

A subscribed peer learns within milliseconds that something was accepted, and
pulls it through the usual, verified ``after_seq`` read: the stream carries
``seq``, ``hash`` and ``accepted_at`` only, never an envelope, so it adds no
second path by which content could arrive.

* Frames: ``id: SEQ`` / ``event: record`` / ``data: {"seq","hash","accepted_at"}``,
  one per visible record. Withheld records are never announced (a client cannot
  read them); their ``seq`` is simply passed over. When more than
  :data:`MAX_ANNOUNCE` records are new at once (a burst, a reader resuming from far
  behind, a slow reader), one ``event: checkpoint`` frame with ``id: N`` and
  ``{"checkpoint": N}`` stands for all of them: "pull after your position up to N".
* Resumption: ``after_seq=N`` or the ``Last-Event-ID`` header (which wins, as an
  ``EventSource`` reconnecting sends it); both are a ``seq``.
* Heartbeats: a ``: heartbeat`` comment after ``--push-heartbeat`` seconds of silence.
* Back-pressure: nothing is queued per stream. A stream remembers only its
  position and reads the log when woken, so a reader that is slow to take what it
  was sent finds, when it asks again, one coalesced frame, never a backlog.
* Caps: ``--push-streams-per-client`` streams per client IP (429 ``rate_limited``)
  and ``--push-streams`` per worker (503 ``service_unavailable``), both with
  ``Retry-After``. A stream ends after :data:`MAX_STREAM_SECONDS`; the client resumes.
* Waking: no stream polls the store. A commit in this process wakes the streams
  through the relay's commit listeners (:meth:`akrelay.relay.core.Relay.on_commit`),
  which over Redis also carry every node's commits (pub/sub). With SQLite and
  several workers, one thread per worker reads the checkpoint every ``--push-poll``
  seconds while a stream is open, and wakes its streams when it moved; without
  open streams it does not run. The tails share :class:`akrelay.knowql.wakeup.Wakeups`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, AsyncIterator, Callable, TypeVar, TypeVarTuple

import anyio
import anyio.to_thread
import msgspec
from litestar import Request, get
from litestar.datastructures import State
from litestar.response.base import ASGIResponse
from litestar.response.streaming import ASGIStreamingResponse

from akrelay.http.errors import JSON
from akrelay.http.ingest import client_ip
from akrelay.knowql.wakeup import Wakeups
from akrelay.protocol.discovery import PUSH, STREAM_PATH
from akrelay.protocol.errors import ProtocolError
from akrelay.store.base import StoreUnavailable
from akrelay.store.capabilities import Watchable, blocking_io

if TYPE_CHECKING:  # annotations only
    from litestar.handlers import BaseRouteHandler
    from akrelay.relay.core import Relay
    from akrelay.settings import Settings

_Result = TypeVar("_Result")
_Args = TypeVarTuple("_Args")

log = logging.getLogger("akrelay.push")

SSE = "text/event-stream"
#: Records announced one by one per wake-up; more than this become one ``checkpoint`` frame.
MAX_ANNOUNCE = 256
#: A stream ends after this long (bounded loops); the client resumes with Last-Event-ID.
MAX_STREAM_SECONDS = 900.0
#: Reconnection delay suggested to EventSource clients (``retry:``, milliseconds).
RETRY_MS = 1000
#: Seconds a refused client is asked to wait (Retry-After).
RETRY_AFTER = 5
#: The largest seq a client may name (JSON safe integers).
MAX_SEQ = 2**53 - 1
#: How often the checkpoint is read while streams are open when commits are announced anyway
#: (one worker, or Redis pub/sub): only a safety net for commits no listener sees.
SAFETY_POLL = 1.0
_KEY = "log"


def parse_position(value: str | None, what: str) -> int | None:
    """A ``seq`` given by a client: ASCII digits, at most 2^53-1; ``None`` when absent."""
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 16 or int(text) > MAX_SEQ:
        raise ProtocolError("invalid_request", f"{what} must be a non-negative integer seq (at most 2^53-1)")
    return int(text)


def record_frame(seq: int, event_id: str, accepted_at: int) -> bytes:
    data = msgspec.json.encode({"seq": seq, "hash": event_id, "accepted_at": accepted_at})
    return b"id: %d\nevent: record\ndata: %b\n\n" % (seq, data)


def checkpoint_frame(checkpoint: int) -> bytes:
    return b'id: %d\nevent: checkpoint\ndata: {"checkpoint":%d}\n\n' % (checkpoint, checkpoint)


class StreamHub:
    """One worker's push streams: admission, the shared wake-up, and the frames of each stream."""

    def __init__(self, relay: Relay, *, heartbeat: float = 15.0, per_client: int = 4, total: int = 256,
                 poll: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.relay = relay
        self.heartbeat = heartbeat
        self.per_client = per_client
        self.total = total
        #: seconds between checkpoint reads while a stream is open (the cross-process fallback)
        self.poll = poll if poll is not None else SAFETY_POLL
        self.clock = clock
        self.wakeups = Wakeups()
        self._offload = blocking_io(relay.store)
        self._lock = threading.Lock()
        self._clients: Counter[str] = Counter()
        self._open = 0
        self._unlisten: Callable[[], None] | None = None
        self._poller: threading.Thread | None = None
        self._halt = threading.Event()

    # -- admission ------------------------------------------------------------------
    def enter(self, client: str) -> None:
        """Take a slot for ``client`` or refuse (429 past its own cap, 503 past the worker's)."""
        with self._lock:
            if self._open >= self.total:
                raise ProtocolError("service_unavailable", f"this worker already serves {self.total} push "
                                    f"streams; retry after {RETRY_AFTER} s", {"retry_after": RETRY_AFTER})
            if self._clients[client] >= self.per_client:
                raise ProtocolError("rate_limited", f"this client already has {self.per_client} push stream(s) "
                                    f"open on this worker; retry after {RETRY_AFTER} s", {"retry_after": RETRY_AFTER})
            self._clients[client] += 1
            self._open += 1
            first = self._open == 1
        if first:
            self._listen()

    def leave(self, client: str) -> None:
        with self._lock:
            if self._clients.get(client, 0) <= 0:  # the hub was closed meanwhile
                return
            self._clients[client] -= 1
            if self._clients[client] <= 0:
                del self._clients[client]
            self._open -= 1
            last = self._open == 0
        if last:
            self._quiet()

    @property
    def open_streams(self) -> int:
        return self._open

    # -- waking -----------------------------------------------------------------------
    def _committed(self) -> None:
        self.wakeups.notify(_KEY)

    def _listen(self) -> None:
        """Hear commits while a stream is open: the relay's listeners, and the checkpoint poller."""
        with self._lock:
            if self._unlisten is None:
                self._unlisten = self.relay.on_commit(self._committed)
            if self._poller is None:
                self._halt = threading.Event()  # each poller its own: one that is ending never sees it cleared
                self._poller = threading.Thread(target=self._poll, args=(self._halt,), name="akrelay-push-poll",
                                                daemon=True)
                self._poller.start()

    def _quiet(self) -> None:
        with self._lock:
            if self._open:  # a stream opened meanwhile
                return
            unlisten, self._unlisten = self._unlisten, None
            self._poller = None
            self._halt.set()
        if unlisten is not None:
            unlisten()

    def _poll(self, halt: threading.Event) -> None:
        """Wake the streams when the checkpoint moved without a listener being told (another worker).

        The first read wakes them too: a stream may have read the checkpoint before
        this thread first ran, and another worker's commits in between would
        otherwise wait for a later commit or the heartbeat.
        """
        seen: int | None = None
        while not halt.wait(self.poll):
            try:
                now = self.relay.store.checkpoint()
            except Exception:  # noqa: BLE001 - an outage: the streams meet it themselves
                continue
            if now != seen:
                self._committed()
            seen = now

    def close(self) -> None:
        with self._lock:
            self._open = 0
            self._clients.clear()
        self._quiet()

    # -- frames -----------------------------------------------------------------------
    async def call(self, fn: Callable[[*_Args], _Result], *args: *_Args) -> _Result:
        if self._offload:
            return await anyio.to_thread.run_sync(fn, *args)
        return fn(*args)

    def _announce(self, position: int, checkpoint: int) -> bytes:
        """The frames for ``position < seq <= checkpoint``: one per visible record, or one checkpoint frame."""
        if checkpoint - position > MAX_ANNOUNCE:
            return checkpoint_frame(checkpoint)
        records = self.relay.store.iter_records(position, checkpoint - position)
        return b"".join(record_frame(r.seq, r.id, r.accepted_at) for r in records
                        if not r.withheld and r.seq <= checkpoint)

    async def frames(self, after_seq: int) -> AsyncIterator[bytes]:
        """The stream from ``after_seq`` on, until :data:`MAX_STREAM_SECONDS` or the client leaves."""
        position = after_seq
        wakeups = self.wakeups
        wakeups.watch(_KEY)
        try:
            started = last_sent = self.clock()
            yield b"retry: %d\n: akrelay push stream\n\n" % RETRY_MS
            while True:
                mark = wakeups.mark(_KEY)
                checkpoint = await self.call(self.relay.store.checkpoint)
                if checkpoint > position:
                    chunk = await self.call(self._announce, position, checkpoint)
                    position = checkpoint
                    if chunk:
                        yield chunk
                        last_sent = self.clock()
                now = self.clock()
                if now - started >= MAX_STREAM_SECONDS:
                    return
                if now - last_sent >= self.heartbeat:
                    yield b": heartbeat\n\n"
                    last_sent = now = self.clock()
                await wakeups.wait(_KEY, mark, max(0.0, min(self.heartbeat - (now - last_sent),
                                                            MAX_STREAM_SECONDS - (now - started))))
        except StoreUnavailable as exc:  # the store went away: end the stream; the client resumes later
            log.warning("push stream ended early: %s", exc)
        finally:
            wakeups.unwatch(_KEY)


class _Slot:
    """A client's stream slot, given back once however the stream ends (or if it never starts)."""

    def __init__(self, hub: StreamHub, client: str) -> None:
        self.hub, self.client, self.held = hub, client, True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.hub.leave(self.client)

    def __del__(self) -> None:
        self.release()


async def _held(slot: _Slot, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for frame in frames:
            yield frame
    finally:
        slot.release()


def _refusal(exc: ProtocolError) -> ASGIResponse:
    """The refusal in the usual error body; a cap's refusal says when to come back (Retry-After)."""
    retry = exc.data.get("retry_after") if isinstance(exc.data, dict) else None
    return ASGIResponse(body=msgspec.json.encode(exc.to_wire()), status_code=exc.http_status, media_type=JSON,
                        headers={"Retry-After": str(retry)} if retry else None)


class PushStream:
    """The stream's route and discovery members, for the sync component to mount."""

    def __init__(self, relay: Relay, settings: Settings) -> None:
        self.relay = relay
        self.enabled = not settings.federation.no_push_stream
        fallback = not isinstance(relay.store, Watchable) and settings.workers > 1
        self.hub = StreamHub(relay, heartbeat=settings.federation.push_heartbeat,
                             per_client=settings.federation.push_streams_per_client,
                             total=settings.federation.push_streams,
                             poll=settings.federation.push_poll if fallback else SAFETY_POLL)

    def discovery(self) -> dict[str, object]:
        if not self.enabled:
            return {}
        return {"features": [PUSH], "endpoints": {"stream": self.relay.config.origin + STREAM_PATH}}

    def routes(self) -> list[BaseRouteHandler]:
        if not self.enabled:
            return []
        hub, relay = self.hub, self.relay

        @get(STREAM_PATH, media_type=JSON)
        async def stream(request: Request[object, object, State]) -> ASGIResponse:
            try:
                pairs = request.query_params
                unknown = sorted(set(pairs) - {"after_seq"})
                if unknown:
                    raise ProtocolError("invalid_request", f"unknown parameter {unknown[0]!r} (only after_seq)")
                if len(pairs.getall("after_seq", [])) > 1:
                    raise ProtocolError("invalid_request", "after_seq must be given once")
                after = parse_position(pairs.get("after_seq"), "after_seq")
                last = parse_position(request.headers.get("last-event-id"), "Last-Event-ID")
                position = last if last is not None else (after or 0)
                checkpoint = await hub.call(relay.store.checkpoint)
                if position > checkpoint:
                    raise ProtocolError("invalid_request", f"after_seq {position} is greater than the current "
                                        f"checkpoint {checkpoint}", {"checkpoint": checkpoint})
                client = client_ip(request.scope)
                hub.enter(client)
            except ProtocolError as exc:
                return _refusal(exc)
            return ASGIStreamingResponse(iterator=_held(_Slot(hub, client), hub.frames(position)), media_type=SSE,
                                         headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

        return [stream]

    def stop(self) -> None:
        self.hub.close()
