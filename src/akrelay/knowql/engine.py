"""The KnowQL operations the HTTP routes call, one service per relay and worker.

:meth:`KnowqlEngine.accept` resolves and records a turn (404 and 409 come
from here, in the seed's order, after :mod:`.request` has done the 400s) and
:meth:`KnowqlEngine.run` executes it; the routes decide whether to wait for
it (synchronous), stream its events, or answer 202 at once (background).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

from akrelay.jsontypes import JSON
from akrelay.knowql.admission import Admission
from akrelay.knowql.compose import EXTRACTIVE_MODEL, ExtractiveComposer
from akrelay.knowql.contexts import ContextRegistry
from akrelay.knowql.documents import NewSession, Pinned, PublicQuery, QueryDoc, SessionPage
from akrelay.knowql.errors import KnowqlError, bad_request, not_found
from akrelay.knowql.models import EXTRA_COMPOSERS, TIERS, Catalog, Composer, ModelEntry
from akrelay.knowql.pool import FairPool
from akrelay.knowql.recovery import Deferred, fail_orphans, owner
from akrelay.knowql.request import QueryDocument
from akrelay.knowql.runner import HISTORY_TURNS, Turn, TurnRunner, history_of
from akrelay.knowql.store import TurnStore, public
from akrelay.store.base import StoreUnavailable

if TYPE_CHECKING:  # annotations only (no early import of the relay, the KIP runtime or search)
    from akrelay.kip.runtime import KipRuntime
    from akrelay.relay.core import Relay
    from akrelay.search.engine import SearchEngine
    from akrelay.settings import Settings

log = logging.getLogger("akrelay.knowql")

#: Turns running at once in one worker; more wait in the pool's queues (fair between clients).
#: Many turns wait on I/O (an LLM upstream), all are bounded by their deadline and CPU steps.
TURN_THREADS = 16
PROJECT_ID = "akrelay"
CREATED_BY = "anonymous"
TITLE_CHARS = 80
#: Queries in one page of ``GET /sessions/{id}`` (``?limit=`` up to SESSION_PAGE_MAX).
SESSION_PAGE = 20
SESSION_PAGE_MAX = 100


def new_id(prefix: str) -> str:
    """Unguessable (122 random bits): session and query reads are unauthenticated."""
    return prefix + uuid.uuid4().hex


def title_of(ask: str) -> str:
    text = " ".join(ask.split())
    if len(text) <= TITLE_CHARS:
        return text
    cut = text[:TITLE_CHARS].rsplit(" ", 1)[0] or text[:TITLE_CHARS]
    return cut + "…"


def build_catalog(settings: Settings, extractive: Composer) -> Catalog:
    """The extractive composer, the configured LLM (if any) and any registered extra composers."""
    entries = [ModelEntry(EXTRACTIVE_MODEL, "Extractive (deterministic, no model)", "akrelay", extractive)]
    tiers = {tier: EXTRACTIVE_MODEL for tier in TIERS}
    llm = None
    if settings.knowql.llm_base_url and settings.knowql.llm_model:
        # only a configured model loads the HTTP client (a worker's start-up time, issue 25)
        from akrelay.knowql.llm import llm_entry

        llm = llm_entry(settings)
    if llm is not None:
        entries.append(llm)
        tiers["standard"] = tiers["pro"] = llm.id
    for factory in EXTRA_COMPOSERS.values():
        entry = factory(settings)
        if entry is not None:
            entries.append(entry)
    return Catalog(entries, tiers)


class KnowqlEngine:
    def __init__(self, relay: Relay, settings: Settings, *, store: TurnStore, contexts: ContextRegistry,
                 search: Callable[[], SearchEngine], runtime: Callable[[], KipRuntime], clock: Callable[[], float] = time.time,
                 default_policy: str = "akrelay:corroborated") -> None:
        # Only what a turn needs: holding the relay itself would keep it alive (the
        # routes keep one service per relay in a weak mapping).
        self.origin = relay.config.origin
        self.settings = settings
        self.store = store
        self.contexts = contexts
        self.clock = clock
        self.default_policy = default_policy
        self.catalog: Catalog = build_catalog(settings, ExtractiveComposer())
        self.deferred = Deferred()
        self.runner = TurnRunner(store, search=search, runtime=runtime, records=relay.store, origin=self.origin,
                                 clock=clock, deferred=self.deferred)
        self._pool = FairPool(TURN_THREADS)
        self.admission = Admission(per_client=int(settings.knowql.inflight), threads=TURN_THREADS,
                                   queue=int(settings.knowql.queue),
                                   tails=int(settings.knowql.tails))
        #: turns this process accepted and has not finished running: failed at close, so a
        #: restart does not leave their sessions busy (409) until their deadlines
        self._open: set[str] = set()
        self._open_lock = threading.Lock()

    @classmethod
    def open(cls, relay: Relay, settings: Settings, store: TurnStore, *, search: Callable[[], SearchEngine],
             runtime: Callable[[], KipRuntime]) -> "KnowqlEngine":
        """The engine over ``store`` (the node backend's turn store, closed with the engine)."""
        contexts = ContextRegistry.load(relay.config.origin, settings.knowql.contexts or None)
        service = cls(relay, settings, store=store, contexts=contexts,
                      search=search, runtime=runtime)
        service.recover()
        return service

    def recover(self) -> None:
        """Fail the turns a dead process of this host left in progress (later, if the store is away now)."""
        try:
            fail_orphans(self.store)
        except StoreUnavailable as exc:
            self.deferred.add("orphans", lambda: fail_orphans(self.store), exc)

    def close(self, timeout: float = 10.0) -> None:
        """Cancel queued turns, give running ones ``timeout`` seconds to end, then close the store."""
        self._pool.shutdown(cancel_futures=True)
        deadline = time.monotonic() + timeout
        for thread in list(self._pool.threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._open_lock:
            unfinished, self._open = sorted(self._open), set()
        message = "the relay shut down before the turn ended"
        try:
            for query_id in unfinished:  # a compare-and-set: a turn that did end is left as it is
                self.fail(query_id, message)
        except StoreUnavailable as exc:  # Redis away at shutdown: the next start (or their deadlines) fails them
            log.warning("KnowQL: could not fail %d unfinished turn(s) at shutdown: %s", len(unfinished), exc)
        finally:
            self.deferred.close()
            self.store.close()

    # ---- a turn ---------------------------------------------------------------------------

    def accept(self, doc: QueryDocument, api_version: str, client: str = "") -> tuple[PublicQuery, Turn]:
        """Resolve ``doc`` and record its turn ``in_progress``; the public query document and the turn.

        The turn takes one of ``client``'s slots (:class:`Admission`: 429/503 when none is
        free), given back when :meth:`run` ends or when the turn is refused here.
        """
        self.admission.enter_turn(client)
        try:
            return self._accept(doc, api_version, client)
        except BaseException:
            self.admission.leave_turn(client)
            raise

    def _accept(self, doc: QueryDocument, api_version: str, client: str) -> tuple[PublicQuery, Turn]:
        now = self.clock()
        if doc.continues:
            session_id = self._continued_session(doc)
            session = self.store.get_session(session_id)
            if session is None:
                raise not_found("session_not_found", f"no session {session_id!r}")
            pinned: Pinned = session
            new_session: NewSession | None = None
            scope = self.contexts.scope(session["scope"])
        else:
            pinned = doc.pinned()
            self.catalog.resolve(pinned["models"])  # 400 before any 404 (seed order)
            scope = self.contexts.resolve_scope(doc.scope or ())
            pinned["scope"] = [c.slug for c in scope]
            session_id = new_id("ses_")
            created: NewSession = {"id": session_id, "object": "session", "project_id": PROJECT_ID,
                                   "created_by": CREATED_BY, "title": title_of(doc.ask), **pinned}
            new_session = created
        mode = doc.retrieval_mode()
        model = None if mode is not None else self._model_for(pinned.get("models") or [])
        chosen = (pinned.get("vars") or {}).get("policy")  # a policy name when given (request.py checks it)
        policy = chosen if isinstance(chosen, str) and chosen else self.default_policy
        query_id = new_id("qry_")
        query: QueryDoc = {
            "id": query_id, "object": "query", "session_id": session_id,
            "model": model.id if model is not None else None, "created": int(now), "status": "in_progress",
            "error": None, "previous_query_id": None, "input": [{"role": "user", "content": doc.ask}],
            "output": [], "output_json": None, "citations": [], "steps": [],
            "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cost_usd": 0}, "runtime_ms": 0,
            "akrelay": {"api_version": api_version, "policy": policy, "scope": [c.slug for c in scope],
                        "warnings": list(doc.warnings)},
            "_started": now, "_timeout": doc.timeout_seconds, "_owner": owner(),
        }
        deadline = now + doc.timeout_seconds
        # Only the last turns (with margin for failed ones): the cost of a turn does not grow with the session.
        history = (history_of(self.store.recent_queries(session_id, 2 * HISTORY_TURNS))
                   if new_session is None else ())
        _session, stored = self.store.create_turn(new_session, session_id, query, deadline)
        with self._open_lock:
            self._open.add(query_id)
        turn = Turn(query_id, session_id, doc, scope, policy, model, history, pinned.get("system_prompt"),
                    pinned.get("guardrails"), deadline, doc.timeout_seconds, client=client)
        return public(stored), turn

    def _continued_session(self, doc: QueryDocument) -> str:
        if doc.previous_query_id is None:
            assert doc.session_id is not None
            return doc.session_id
        owner = self.store.session_of_query(doc.previous_query_id)
        if owner is None:
            raise not_found("query_not_found", f"no query {doc.previous_query_id!r}")
        if doc.session_id is not None and doc.session_id != owner:
            raise bad_request("session_id and previous_query_id name different sessions")
        return owner

    def _model_for(self, preference: list[str]) -> ModelEntry:
        """The pinned preference's first available model; the default if it is no longer served."""
        try:
            return self.catalog.resolve(preference)
        except KnowqlError:
            return self.catalog.resolve([])

    def fail(self, query_id: str, message: str) -> bool:
        """Fail an in-progress turn with ``message`` (a compare-and-set: ``False`` if it had ended)."""
        return self.store.finish(query_id, "failed", {"error": message}, {"type": "response.failed", "error": message})

    def run(self, turn: Turn) -> None:
        try:
            self.runner.run(turn)
        finally:
            with self._open_lock:
                self._open.discard(turn.query_id)
            self.admission.leave_turn(turn.client)

    def start(self, turn: Turn) -> Future[None]:
        """Queue ``turn`` behind its client's earlier ones (:class:`FairPool`)."""
        return self._pool.submit(turn.client, self.run, turn)

    # ---- resources ------------------------------------------------------------------------

    def query(self, query_id: str) -> PublicQuery:
        doc = self.store.get_query(query_id)
        if doc is None:
            raise not_found("query_not_found", f"no query {query_id!r}")
        return public(doc)

    def cancel(self, query_id: str) -> PublicQuery:
        """Idempotent: an in-progress turn becomes ``cancelled``; a terminal one is returned unchanged."""
        self.query(query_id)  # 404 first; also fails a turn whose deadline passed
        self.store.finish(query_id, "cancelled", {"error": "cancelled by client"},
                          {"type": "response.cancelled", "error": "cancelled by client"})
        return self.query(query_id)

    def session(self, session_id: str, offset: int = 0, limit: int = SESSION_PAGE) -> SessionPage:
        """The session with one page of its queries (oldest first): ``limit`` from position ``offset``.

        ``akrelay.queries`` says where the page lies (``total``, ``offset``, ``limit``, ``next_offset``),
        so a long session is read in pages instead of one unbounded document.
        """
        session = self.store.get_session(session_id)
        if session is None:
            raise not_found("session_not_found", f"no session {session_id!r}")
        total, page = self.store.session_page(session_id, offset, limit)
        following = offset + len(page)
        return {**session, "queries": [public(q) for q in page],
                "akrelay": {"queries": {"total": total, "offset": offset, "limit": limit,
                                        "next_offset": following if following < total else None}}}

    def delete_session(self, session_id: str) -> dict[str, bool]:
        return {"deleted": self.store.delete_session(session_id)}

    def models(self) -> dict[str, JSON]:
        return self.catalog.to_wire()

    def context_list(self) -> list[dict[str, JSON]]:
        return self.contexts.to_wire()
