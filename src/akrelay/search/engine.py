"""The ranked-search service role (Agent Knowledge §9.5, §12) for one relay.

Wires the pieces together per process: elects the indexer (or reads), keeps
the index following the store, parses requests strictly and answers one
page whose ``checkpoint`` and ``as_of`` come from the relay, like every other
read. Handlers call :meth:`SearchEngine.search` and serialize the page.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Protocol

from akrelay.jsontypes import JSON

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.reads import SearchRequest, parse_read_json, parse_search_request
from akrelay.relay.core import Relay
from akrelay.search.analysis import RANKING_ID
from akrelay.search.index import SEARCH_DIR, IndexUnavailable, SearchIndex, index_dir, read_position
from akrelay.search.indexer import LOCK_NAME, Follower, IndexerLock, IndexerThread
from akrelay.search.lexical import Budget, lexical_search
from akrelay.search.question import QuestionHit, question_search
from akrelay.search.results import SearchPage

log = logging.getLogger("akrelay.search")

#: The modes this service implements and advertises.
MODES = ("lexical",)
FEATURE = "ranked-search"


class SearchEngine:
    """Ranked search over a relay's store, backed by a Tantivy index.

    ``data_dir`` ``None`` keeps the index in memory (tests, memory stores);
    then this process is always the indexer. ``follow=False`` (with a data
    directory): another process indexes (:mod:`akrelay.process.followers`); this one
    only reads and never takes the indexer lock.
    """

    def __init__(
        self,
        relay: Relay,
        data_dir: str | Path | None,
        *,
        poll_interval: float = 0.05,
        reload_interval: float = 0.05,
        elect_interval: float = 1.0,
        budget: Budget = Budget(),
        writer_threads: int = 1,
        writer_heap: int = 64_000_000,
        start: bool = True,
        follow: bool = True,
    ) -> None:
        # Weak, so that a relay dropped by its owner takes this service (and
        # its indexer thread) with it.
        self._relay = weakref.ref(relay)
        self.store = relay.store
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.path = index_dir(self.data_dir) if self.data_dir is not None else None
        self.poll_interval = poll_interval
        self.reload_interval = reload_interval
        self.elect_interval = elect_interval
        self.follow = follow or data_dir is None
        self.budget = budget
        self._writer_options = {"threads": writer_threads, "heap_bytes": writer_heap}
        self._lock = (IndexerLock(self.data_dir / SEARCH_DIR / LOCK_NAME)
                      if self.data_dir is not None else None)
        self._index: SearchIndex | None = None
        self._indexer: IndexerThread | None = None
        self._elector: threading.Thread | None = None
        self._closed = threading.Event()
        self._mutex = threading.Lock()
        self._last_reload = 0.0
        if start:
            self.start()

    @property
    def relay(self) -> Relay:
        relay = self._relay()
        if relay is None:
            raise RuntimeError("the relay of this search service is gone")
        return relay

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Become the indexer if possible (rebuilding a missing or corrupt index), else a reader."""
        with self._mutex:
            if self._index is not None and (self._index.writer is not None or self._elector is not None
                                            or not self.follow):
                return
            if not self.follow:
                self._open_reader()
            elif not self._try_become_indexer():
                self._open_reader()
                self._elector = threading.Thread(target=_elect_loop, args=(weakref.ref(self),),
                                                 name="akrelay-search-elector", daemon=True)
                self._elector.start()

    @property
    def is_indexer(self) -> bool:
        return self._indexer is not None

    def _try_become_indexer(self) -> bool:
        if self._lock is not None and not self._lock.acquire():
            return False
        if self.path is None:
            index = SearchIndex.in_memory(**self._writer_options)
        else:
            index = SearchIndex.open_writer(self.path, **self._writer_options)
        follower = Follower(index, self.store)
        old = self._index
        self._index = index
        if self.path is None:
            follower.step()  # in memory: searchable before the first request
        self._indexer = IndexerThread(follower, interval=self.poll_interval)
        self._indexer.start()
        if old is not None and old is not index:
            old.close()
        log.info("search: this process (%s) is the indexer", threading.get_native_id())
        return True

    def _open_reader(self) -> None:
        if self.path is None:
            return
        try:
            self._index = SearchIndex.open_reader(self.path)
        except IndexUnavailable as exc:
            log.info("search index not readable yet: %s", exc)
            self._index = None

    def close(self) -> None:
        self._closed.set()
        with self._mutex:
            if self._indexer is not None:
                self._indexer.stop()
                self._indexer = None
            elector, self._elector = self._elector, None
            if self._index is not None:
                self._index.close()
                self._index = None
            if self._lock is not None:
                self._lock.release()
        if elector is not None and elector is not threading.current_thread():
            elector.join(10.0)

    def notify(self) -> None:
        """Hint that the log grew (the indexer polls anyway)."""
        if self._indexer is not None:
            self._indexer.notify()

    # -- the index -----------------------------------------------------------------
    def _current_index(self) -> SearchIndex | None:
        index = self._index
        if index is None and not self._closed.is_set() and self._indexer is None:
            with self._mutex:
                if self._index is None and self._indexer is None:
                    self._open_reader()
                index = self._index
        if index is not None and index.writer is None:
            now = time.monotonic()
            if now - self._last_reload >= self.reload_interval:
                try:
                    index.reload()
                except Exception:  # noqa: BLE001 - the indexer may be rebuilding; reopen next time
                    with self._mutex:
                        if self._index is index:
                            self._index = None
                    return None
                self._last_reload = now
        return index

    def index_seq(self) -> int:
        index = self._current_index()
        return index.position() if index is not None else 0

    def wait_indexed(self, seq: int | None = None, timeout: float = 10.0) -> bool:
        """Block until the index covers ``seq`` (default: the current checkpoint)."""
        target = self.store.checkpoint() if seq is None else seq
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.notify()
            if self.index_seq() >= target:
                return True
            time.sleep(0.01)
        return self.index_seq() >= target

    # -- requests ------------------------------------------------------------------
    def parse(self, value: object) -> SearchRequest:
        return parse_search_request(value, MODES)

    def search(self, raw_body: bytes) -> SearchPage:
        """A strict JSON body (§9.1) -> one page; every defect is a ``ProtocolError``."""
        return self.run(self.parse(parse_read_json(raw_body)))

    def run(self, request: SearchRequest) -> SearchPage:
        if request.mode not in MODES:  # parse_search_request already refuses this
            raise ProtocolError("unsupported_search_mode", f"search mode {request.mode!r} is not advertised here")
        relay = self.relay
        checkpoint = relay.checkpoint()
        as_of = relay.clock()
        index = self._current_index()
        if index is None:
            # No readable index yet (another process is building it): answer
            # honestly with nothing rather than fail.
            return SearchPage([], relay.config.origin, checkpoint, as_of, request.mode, RANKING_ID,
                              ("index_lag",), 0)
        searcher = index.searcher()
        index_seq = read_position(searcher)
        result = lexical_search(request, searcher, self.store, checkpoint, index_seq, budget=self.budget)
        reasons: list[str] = []
        if not result.complete and not result.timed_out:
            reasons.append("candidate_limit")
        if index_seq < checkpoint:
            reasons.append("index_lag")
        if result.timed_out:
            reasons.append("timeout")
        hits = result.hits
        return SearchPage(hits, relay.config.origin, checkpoint, as_of, request.mode, RANKING_ID,
                          tuple(reasons), index_seq)

    def question(self, terms: tuple[str, ...], snapshot: int, limit: int, *,
                 types: tuple[str, ...] = ()) -> tuple[list[QuestionHit], int]:
        """Ranked question hits at ``snapshot`` (see :mod:`akrelay.search.question`) and the index position.

        The caller compares the position with its snapshot: an index behind it
        cannot see the newest records.
        """
        index = self._current_index()
        if index is None:
            return [], 0
        searcher = index.searcher()
        return question_search(terms, searcher, self.store, snapshot, limit, types=types), read_position(searcher)

    def discovery(self) -> dict[str, JSON]:
        return discovery_members(self.relay.config)

    @property
    def closed_event(self) -> threading.Event:
        """Set by :meth:`close` (the elector waits on it between tries)."""
        return self._closed

    def election_step(self) -> float | None:
        """One try to become the indexer: ``None`` when election is over, else seconds until the next try."""
        if self._closed.is_set():
            return None
        try:
            with self._mutex:
                if self._closed.is_set():
                    return None
                if self._try_become_indexer():
                    self._elector = None
                    return None
        except Exception:  # noqa: BLE001 - a failed try is logged and retried, never ends the elector thread
            log.exception("search: indexer election failed")
        return float(self.elect_interval)


class SearchEndpoint(Protocol):
    """The settings that name the ranked-search endpoint."""

    @property
    def origin(self) -> str: ...

    @property
    def search_path(self) -> str: ...


def discovery_members(config: SearchEndpoint) -> dict[str, JSON]:
    """What a ranked-search service adds to its §9.2 document."""
    return {"features": [FEATURE], "search_modes": list(MODES),
            "endpoints": {"search": config.origin + config.search_path}}


def _elect_loop(ref: "weakref.ReferenceType[SearchEngine]") -> None:
    """Non-indexer processes retry the lock so that a dead indexer is replaced."""
    while True:
        service = ref()
        if service is None:
            return
        interval = service.election_step()
        if interval is None:
            return
        closed = service.closed_event
        del service  # hold no reference while waiting, so the service can be collected
        closed.wait(interval)  # close() ends the wait at once


def reindex(relay: Relay, data_dir: str | Path, *, threads: int = 2) -> int:
    """Rebuild the index from the store (``akrelay reindex``); returns records indexed.

    Refuses while another process (a running relay) is the indexer, since
    Tantivy allows one writer.
    """
    data_dir = Path(data_dir)
    lock = IndexerLock(data_dir / SEARCH_DIR / LOCK_NAME)
    if not lock.acquire():
        raise RuntimeError("a running relay is indexing this data directory; stop it before reindexing")
    try:
        index = SearchIndex.open_writer(index_dir(data_dir), threads=threads, heap_bytes=200_000_000)
        try:
            index.clear()
            follower = Follower(index, relay.store, batch=5000)
            return follower.catch_up()
        finally:
            index.close()
    finally:
        lock.release()

