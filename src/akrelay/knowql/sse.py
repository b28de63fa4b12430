"""Server-sent event framing for KnowQL turns (seed 003).

Progress frames carry ``id:`` (the event's sequence number, from 1), an
``event:`` name equal to the event ``type`` and the event as one-line JSON;
the stream ends with an ``event: query`` frame, without ``id:``, carrying
the whole Query document. :func:`tail` reads a turn's events from the shared
store, so a streaming ``POST /query`` and ``GET /queries/{id}/events`` (on
any worker, resumable with ``Last-Event-ID``) are the same loop.
"""

from __future__ import annotations

import json
import logging
import time
from typing import AsyncIterator, Callable

import anyio
import anyio.to_thread

from akrelay.knowql.documents import Event, QueryDoc
from akrelay.knowql.store import TERMINAL, TurnStore, public
from akrelay.store.base import StoreUnavailable
from akrelay.store.capabilities import Waking

log = logging.getLogger("akrelay.knowql")

#: A tail waits for a wake-up (:mod:`akrelay.knowql.wakeup`) and looks at the store at least this
#: often anyway (writes by another worker process of a SQLite store wake nobody here).
FALLBACK_SECONDS = 0.25
#: How often a tail looks for new events when its store offers no wake-ups.
POLL_SECONDS = 0.015
KEEPALIVE_SECONDS = 15.0
#: A tail ends after this long even if the turn never ends (bounded loops).
MAX_TAIL_SECONDS = 1000.0
_TERMINAL_EVENTS = {"response.completed", "response.failed", "response.cancelled"}


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def event_frame(seq: int, event: Event) -> bytes:
    return f"id: {seq}\nevent: {event['type']}\ndata: {_json(event)}\n\n".encode("utf-8")


def query_frame(doc: QueryDoc) -> bytes:
    return f"event: query\ndata: {_json(public(doc))}\n\n".encode("utf-8")


async def tail(store: TurnStore, query_id: str, from_seq: int = 1, *,
               clock: Callable[[], float] = time.monotonic) -> AsyncIterator[bytes]:
    """Frames of ``query_id`` from ``from_seq`` (inclusive) until its ``query`` frame."""
    next_seq = max(1, from_seq)
    started = last_sent = clock()
    wakeups = store.wakeups if isinstance(store, Waking) else None
    if wakeups is not None:
        wakeups.watch(query_id)
    try:
        while True:
            mark = wakeups.mark(query_id) if wakeups is not None else 0
            events = await anyio.to_thread.run_sync(store.events, query_id, next_seq)
            ended = False
            for seq, kind, event in events:
                yield event_frame(seq, event)
                next_seq = seq + 1
                ended = ended or kind in _TERMINAL_EVENTS
                last_sent = clock()
            # get_query also fails a turn whose deadline has passed (its terminal event follows).
            doc = await anyio.to_thread.run_sync(store.get_query, query_id)
            if doc is None:
                return
            if ended or (doc["status"] in TERMINAL and not events):
                if not ended:
                    # The terminal event landed between the two reads: send it first.
                    for seq, _kind, event in await anyio.to_thread.run_sync(store.events, query_id, next_seq):
                        yield event_frame(seq, event)
                yield query_frame(doc)
                return
            now = clock()
            if now - started > MAX_TAIL_SECONDS:
                return
            if now - last_sent >= KEEPALIVE_SECONDS:
                yield b": ping\n\n"
                last_sent = now
            if wakeups is None:
                await anyio.sleep(POLL_SECONDS)
            else:
                await wakeups.wait(query_id, mark, min(FALLBACK_SECONDS, KEEPALIVE_SECONDS - (now - last_sent)))
    except StoreUnavailable as exc:
        # The shared store went away mid-stream: end the stream (no traceback); the client
        # resumes with Last-Event-ID once it answers again.
        log.warning("KnowQL stream of %s ended early: %s", query_id, exc)
    finally:
        if wakeups is not None:
            wakeups.unwatch(query_id)
