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
from typing import Any, Iterable
# Untyped here: turn, session and event documents are JSON objects read by fixed keys (a TypedDict each is the next step).

TERMINAL = ("completed", "failed", "cancelled")
EVENT_OF = {"completed": "response.completed", "failed": "response.failed", "cancelled": "response.cancelled"}


def public(doc: dict[str, Any]) -> dict[str, Any]:
    """A stored document without its private members (``_started``, ``_timeout``, …)."""
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def rfc3339(seconds: float) -> str:
    """Session timestamps as both stores write them (whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def dump(value: object) -> str:
    """The stored JSON text of a document or an event (compact, UTF-8 kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def expired(status: str | None, deadline: float, now: float) -> bool:
    """Whether a read at ``now`` must fail the turn: still in progress past its deadline."""
    return status == "in_progress" and now > deadline


def timeout(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields and terminal event that fail an expired turn (``doc`` is its stored document)."""
    limit = doc.get("_timeout")
    message = f"timed out after {limit} s" if limit else "timed out"
    return {"error": message}, {"type": "response.failed", "error": message}


def finished(doc: dict[str, Any], status: str, fields: dict[str, Any], now: float) -> dict[str, Any]:
    """``doc`` moved to terminal ``status``: ``fields`` merged in, its run time measured from ``_started``."""
    assert status in TERMINAL
    out = dict(doc)
    out.update(fields)
    out["status"] = status
    out["runtime_ms"] = max(0, int(round((now - out.get("_started", now)) * 1000)))
    return out


def terminal_event(query_id: str, status: str, event: dict[str, Any] | None, doc: dict[str, Any]) -> dict[str, Any]:
    """The stream's last event: ``event`` (``response.<status>`` by default) with the failure's error."""
    terminal = dict(event or {"type": EVENT_OF[status]})
    terminal.setdefault("type", EVENT_OF[status])
    terminal["query_id"] = query_id
    if status != "completed" and "error" not in terminal and doc.get("error"):
        terminal["error"] = doc["error"]
    return terminal


def progress_events(query_id: str, events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Progress events as stored: each names its query."""
    return [dict(event, query_id=query_id) for event in events]
