"""The life of a KnowQL turn, whatever store keeps it: written once so the backends cannot drift.

A turn is ``in_progress`` until exactly one terminal status wins a compare-and-set
(:data:`TERMINAL`). A turn read after its deadline is failed as timed out by the
reader (a dead worker cannot leave it running). The terminal event is the stream's
last, named ``response.<status>``, and carries the turn's error when it did not
complete. Pure functions only: no store, no clock (the caller passes ``now``), so
:mod:`akrelay.knowql.store` (SQLite) and :mod:`akrelay.knowql.redis_store` (Redis)
apply the very same rules inside their own transactions.
"""

from __future__ import annotations

import json
import time
from typing import Iterable, cast

from akrelay.knowql.documents import Event, PublicQuery, QueryDoc, QueryFields

TERMINAL = ("completed", "failed", "cancelled")
EVENT_OF = {"completed": "response.completed", "failed": "response.failed", "cancelled": "response.cancelled"}


def public(doc: QueryDoc) -> PublicQuery:
    """A stored document without its private members (``_started``, ``_timeout``, …)."""
    return cast(PublicQuery, {k: v for k, v in doc.items() if not k.startswith("_")})


def rfc3339(seconds: float) -> str:
    """Session timestamps as both stores write them (whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def dump(value: object) -> str:
    """The stored JSON text of a document or an event (compact, UTF-8 kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def expired(status: str | None, deadline: float, now: float) -> bool:
    """Whether a read at ``now`` must fail the turn: still in progress past its deadline."""
    return status == "in_progress" and now > deadline


def timeout(doc: QueryDoc) -> tuple[QueryFields, Event]:
    """The fields and terminal event that fail an expired turn (``doc`` is its stored document)."""
    limit = doc.get("_timeout")
    message = f"timed out after {limit} s" if limit else "timed out"
    return {"error": message}, {"type": "response.failed", "error": message}


def finished(doc: QueryDoc, status: str, fields: QueryFields, now: float) -> QueryDoc:
    """``doc`` moved to terminal ``status``: ``fields`` merged in, its run time measured from ``_started``."""
    assert status in TERMINAL
    # ``fields`` is a part of a query (mypy types TypedDict.update with the same TypedDict only)
    out = cast(QueryDoc, {**doc, **fields})
    out["status"] = status
    out["runtime_ms"] = max(0, int(round((now - out.get("_started", now)) * 1000)))
    return out


def terminal_event(query_id: str, status: str, event: Event | None, doc: QueryDoc) -> Event:
    """The stream's last event: ``event`` (``response.<status>`` by default) with the failure's error."""
    terminal: Event = event.copy() if event else {"type": EVENT_OF[status]}
    terminal.setdefault("type", EVENT_OF[status])
    terminal["query_id"] = query_id
    error = doc.get("error")
    if status != "completed" and "error" not in terminal and error:
        terminal["error"] = error
    return terminal


def progress_events(query_id: str, events: Iterable[Event]) -> list[Event]:
    """Progress events as stored: each names its query."""
    return [{**event, "query_id": query_id} for event in events]
