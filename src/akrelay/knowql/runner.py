"""One turn from ``in_progress`` to its terminal state: retrieve, compose, finish.

The runner writes every progress event to the shared store as it goes (a
stream on this worker and an event replay on any other read the same rows)
and ends the turn with one compare-and-set. Between steps it stops as soon as
the turn is no longer in progress (cancelled, or timed out by a reader) or
its deadline has passed. A failure inside a step fails the turn with a clear
error; it never escapes as a 5xx.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from akrelay.knowql.compose import COMPOSE_DEFAULT, RETRIEVAL_DEFAULT, envelope
from akrelay.knowql.contexts import Context
from akrelay.knowql.documents import Event, OutputMessage, QueryDoc, QueryExtension, QueryFields, Step, Usage
from akrelay.knowql.models import ComposerError, HistoryEntry, ModelEntry, TurnInput
from akrelay.knowql.request import QueryDocument
from akrelay.knowql.retrieval import Retrieval, retrieve
from akrelay.knowql.recovery import Deferred
from akrelay.knowql.shape import ShapeFailure, require_conforming
from akrelay.store.base import StoreUnavailable

if TYPE_CHECKING:  # annotations only (no early import of the KIP runtime or search)
    from akrelay.kip.runtime import KipRuntime
    from akrelay.knowql.store import TurnStore
    from akrelay.search.engine import SearchEngine
    from akrelay.store.base import Store

log = logging.getLogger("akrelay.knowql")

#: Progress events older than this are written even mid-step (streamed deltas).
FLUSH_SECONDS = 0.02


class TurnEnded(Exception):
    """The turn left ``in_progress`` elsewhere (cancel, timeout); stop quietly."""


@dataclass
class Turn:
    query_id: str
    session_id: str
    doc: QueryDocument
    scope: list[Context]
    policy: str
    model: ModelEntry | None          # None: a retrieval-only turn
    history: tuple[HistoryEntry, ...]
    system_prompt: str | None
    guardrails: str | None
    deadline: float
    timeout: int
    #: who asked (the client IP): the admission slot the turn holds until it ends
    client: str = ""
    #: progress events not yet written, and when the runner last wrote them
    pending: list[Event] = field(default_factory=list)
    flushed_at: float = 0.0


class TurnRunner:
    def __init__(self, store: TurnStore, *, search: Callable[[], SearchEngine], runtime: Callable[[], KipRuntime],
                 records: Store,
                 origin: str, clock: Callable[[], float] = time.time, deferred: Deferred | None = None) -> None:
        self.store = store
        #: terminal writes the store refused during an outage, written once it is back
        self.deferred = deferred if deferred is not None else Deferred()
        self.search = search
        self.runtime = runtime
        self.records = records  # the relay's store (acceptance records)
        self.origin = origin
        self.clock = clock

    def run(self, turn: Turn) -> None:
        try:
            self._run(turn)
        except TurnEnded:
            return
        except (ShapeFailure, ComposerError) as exc:
            late = self.clock() >= turn.deadline
            self._fail(turn, f"timed out after {turn.timeout} s" if late else str(exc))
        except StoreUnavailable as exc:  # Redis went away mid-turn: fail it once it is back (no traceback)
            late = self.clock() >= turn.deadline
            self._fail(turn, f"timed out after {turn.timeout} s" if late else
                       "the turn store was unreachable while the turn ran", exc)
        except Exception:  # a bug: the turn fails, the worker goes on answering
            log.exception("KnowQL turn %s failed", turn.query_id)
            self._fail(turn, "internal error while running the turn")

    # ---- steps ---------------------------------------------------------------------------

    def _emit(self, turn: Turn, event: Event, *, flush: bool = False) -> None:
        """Queue a progress event; write the queue when asked, or when it is older than :data:`FLUSH_SECONDS`.

        Batching keeps a turn to a few store transactions (an extractive answer's
        deltas are written together) while a slow composer's deltas still reach
        streams within a few tens of milliseconds.
        """
        turn.pending.append(event)
        if flush or self.clock() - turn.flushed_at >= FLUSH_SECONDS:
            self._flush(turn)

    def _flush(self, turn: Turn) -> None:
        pending, turn.pending = turn.pending, []
        turn.flushed_at = self.clock()
        if turn.flushed_at > turn.deadline:
            message = f"timed out after {turn.timeout} s"
            self.store.finish(turn.query_id, "failed", {"error": message},
                              {"type": "response.failed", "error": message}, pending=pending)
            raise TurnEnded()
        if self.store.append_events(turn.query_id, pending) is None:
            raise TurnEnded()

    def _step(self, turn: Turn, steps: list[Step], step_id: str, fns: list[str],
              commentary: str, status: str = "completed", *, flush: bool = False) -> None:
        step: Step = {"step_id": step_id, "status": status, "commentary": commentary, "fns": fns}
        if status != "running":
            steps.append(step)
        self._emit(turn, {"type": "response.step", "step_id": step_id, "status": status, "commentary": commentary,
                          "fns": fns}, flush=flush)

    def _run(self, turn: Turn) -> None:
        started = self.clock()
        doc = turn.doc
        steps: list[Step] = []
        self._emit(turn, {"type": "response.created", "session_id": turn.session_id})
        self._step(turn, steps, "retrieve", ["search.question", "kip.nexus"], "ranking capsules for the ask",
                   "running", flush=True)
        mode = doc.retrieval_mode()
        if mode is None:
            limit = min(doc.max_retrieved or COMPOSE_DEFAULT, COMPOSE_DEFAULT)
        else:
            cap = doc.max_retrieved or RETRIEVAL_DEFAULT
            # With both kinds, each capsule's artifact and its best passage tie in the one
            # ranking the cap applies to: half the cap (plus one) in capsules fills it.
            limit = cap // 2 + 1 if mode[1] == "both" else cap
        history_asks = [entry.ask for entry in turn.history]
        retrieval: Retrieval = retrieve(
            ask=doc.ask, history=history_asks, scope=turn.scope, search=self.search(), runtime=self.runtime(),
            store=self.records, policy=turn.policy, limit=max(limit, 1), origin=self.origin,
            previous=turn.history[-1].sources if turn.history else ())
        self._step(turn, steps, "retrieve", ["search.question", "kip.nexus", "belief"],
                   f"{len(retrieval.artifacts)} capsule(s), {len(retrieval.chunks)} passage(s) at snapshot seq "
                   f"{retrieval.snapshot_seq} under {turn.policy}", flush=True)
        warnings = list(doc.warnings)
        extension: QueryExtension = {"snapshot_seq": retrieval.snapshot_seq, "index_seq": retrieval.index_seq,
                                        "policy": turn.policy, "scope": [c.slug for c in turn.scope],
                                        "warnings": warnings}
        if mode is not None:
            name, kind = mode
            if doc.shape is not None:
                warnings.append("shape is ignored on a retrieval-only turn (seed 000 §7.3)")
            output_json: object = envelope(retrieval, name, kind, max_items=doc.max_retrieved,
                                           max_chars=doc.max_retrieved_chars, pointers=doc.pointers_only)
            fields: QueryFields = {"model": None, "output": [_text("")], "output_json": output_json, "citations": [],
                                   "usage": _usage(None)}
        else:
            assert turn.model is not None
            self._step(turn, steps, "compose", [turn.model.id], "composing the answer", "running")
            composer_input = TurnInput(doc.ask, turn.history, turn.system_prompt, turn.guardrails, doc.shape,
                                       turn.deadline)
            composition = turn.model.composer.compose(
                composer_input, retrieval,
                lambda delta: self._emit(turn, {"type": "response.output_text.delta", "delta": delta}))
            allowed = {a["source"] for a in retrieval.artifacts} | {c["source"] for c in retrieval.chunks}
            citations = [c for c in composition.citations if c.get("source") in allowed]
            output_json = composition.output_json
            if doc.shape is not None:
                if not isinstance(output_json, dict):
                    raise ShapeFailure("the composer produced no JSON object for the shape")
                require_conforming(output_json, doc.shape, deadline=turn.deadline)
            else:
                output_json = None
            self._step(turn, steps, "compose", [turn.model.id],
                       f"{len(citations)} citation(s) from the retrieved set")
            if doc.shape is not None and composition.provenance:
                extension["provenance"] = composition.provenance
            fields = {"model": composition.model, "output": [_text(composition.text)], "output_json": output_json,
                      "citations": citations, "usage": _usage(composition.usage)}
        duration = int(round((self.clock() - started) * 1000))
        self._emit(turn, {"type": "response.turn_rollup", "n_steps": len(steps), "n_tool_calls": 0,
                          "by_category": {}, "total_hits": len(retrieval.chunks), "duration_ms": duration})
        fields["steps"], fields["akrelay"], fields["error"] = steps, extension, None
        pending, turn.pending = turn.pending, []
        self._finish(turn, "completed", fields, None, pending)

    def _fail(self, turn: Turn, message: str, outage: StoreUnavailable | None = None) -> None:
        pending, turn.pending = turn.pending, []
        event: Event = {"type": "response.failed", "error": message}
        if outage is not None:
            self.deferred.add(turn.query_id, lambda: self.store.finish(turn.query_id, "failed", {"error": message},
                                                                       event, pending=pending), outage)
            return
        self._finish(turn, "failed", {"error": message}, event, pending)

    def _finish(self, turn: Turn, status: str, fields: QueryFields, event: Event | None,
                pending: list[Event]) -> None:
        """The terminal compare-and-set; kept for later when the store is away (never a traceback)."""
        def write() -> bool:
            return self.store.finish(turn.query_id, status, fields, event, pending=pending)

        try:
            write()
        except StoreUnavailable as exc:
            self.deferred.add(turn.query_id, write, exc)


def _text(text: str) -> OutputMessage:
    return {"role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _usage(usage: Mapping[str, int] | None) -> Usage:
    usage = usage or {}
    inp, out = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return {"input_tokens": inp, "output_tokens": out, "total_tokens": int(usage.get("total_tokens", inp + out)),
            "cost_usd": 0}


#: The bounded summary of a session's history a turn reads: its last completed turns, clipped.
HISTORY_TURNS = 8
HISTORY_ANSWER_CHARS = 2000
HISTORY_SOURCES = 16


def history_of(queries: Sequence[QueryDoc]) -> tuple[HistoryEntry, ...]:
    """The last :data:`HISTORY_TURNS` completed turns of ``queries`` (oldest first), each clipped.

    Bounded so that turn 200 of a session costs what turn 9 does: the store hands over
    only the most recent turns (``recent_queries``) and each answer is cut to
    :data:`HISTORY_ANSWER_CHARS` characters and :data:`HISTORY_SOURCES` cited sources.
    """
    out = []
    for q in queries:
        if q.get("status") != "completed":
            continue
        ask = q["input"][0]["content"] if q.get("input") else ""
        answer = "".join(part.get("text", "") for item in q.get("output", []) for part in item.get("content", []))
        sources = tuple(dict.fromkeys(source for c in q.get("citations") or []
                                      if isinstance(c, dict) and isinstance(source := c.get("source"), str)))
        out.append(HistoryEntry(ask, answer[:HISTORY_ANSWER_CHARS], sources[:HISTORY_SOURCES]))
    return tuple(out[-HISTORY_TURNS:])
