"""Ranked search as a component of the relay node: the index, its indexer and its discovery members.

:class:`SearchComponent` is the search part of a :class:`akrelay.node.RelayNode`; its route,
``POST /v1/knowledge/search``, is :mod:`akrelay.http.search`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypedDict

from akrelay.http import search as search_http
from akrelay.http.lifecycle import NotRunning
from akrelay.search import Budget, SearchEngine
from akrelay.search.engine import discovery_members, reindex

if TYPE_CHECKING:  # annotations only
    from litestar.handlers import BaseRouteHandler
    from akrelay.relay.core import Relay
    from akrelay.settings import Settings


def data_dir_of(relay: Relay) -> Path | None:
    """The relay's data directory (derived state); ``None`` keeps the index in memory."""
    return relay.data_dir


class _Options(TypedDict):
    budget: Budget
    writer_threads: int


def _options(settings: Settings) -> _Options:
    """Service options from the serve settings."""
    return {"budget": Budget(candidates=settings.search.candidates, seconds=settings.search.timeout_ms / 1000),
            "writer_threads": settings.search.writer_threads}


class SearchComponent:
    """Ranked search: the Tantivy index, its indexer (one per data directory) and the route.

    ``start`` opens (or rebuilds) the index (on disk, or in memory for an in-memory
    relay) and starts following the log; ``stop`` stops the indexer and closes the
    index. A search outside the two is a 503 (:class:`~akrelay.http.lifecycle.NotRunning`).
    """

    name = "search"
    options: tuple[str, ...] = ("search_candidates", "search_timeout_ms", "search_writer_threads")

    def __init__(self, relay: Relay, settings: Settings, *, follow: bool = True) -> None:
        self.relay = relay
        self.settings = settings
        self.follow = follow
        self._engine: SearchEngine | None = None
        self._create = threading.Lock()
        self._unlisten: Callable[[], None] | None = None

    @property
    def engine(self) -> SearchEngine:
        """The search engine :meth:`start` opened; :class:`NotRunning` (503) before start or after stop."""
        service = self._engine
        if service is None:
            raise NotRunning("search index")
        return service

    def start(self) -> None:
        """Open the index and start the indexer (a request never does)."""
        with self._create:
            if self._engine is None:
                service = SearchEngine(self.relay, data_dir_of(self.relay), follow=self.follow,
                                        **_options(self.settings))
                if service.follow:  # a reader (another process indexes) has nothing to wake
                    self._unlisten = self.relay.on_commit(service.notify)
                self._engine = service

    def stop(self) -> None:
        with self._create:
            service, self._engine = self._engine, None
            if self._unlisten is not None:
                self._unlisten()
                self._unlisten = None
        if service is not None:
            service.close()

    def reindex(self) -> int:
        """Rebuild the index from the store (``akrelay reindex``); refused while a relay indexes."""
        data_dir = data_dir_of(self.relay)
        if data_dir is None:
            raise RuntimeError("only a relay with a data directory has a search index to rebuild")
        return reindex(self.relay, data_dir)

    def routes(self) -> list[BaseRouteHandler]:
        return search_http.routes(self.relay.config.search_path, lambda: self.engine)

    def discovery(self) -> dict[str, object]:
        """``features: ["ranked-search"]``, ``search_modes`` and ``endpoints.search`` (§9.2)."""
        members: dict[str, object] = dict(discovery_members(self.relay.config))
        return members
