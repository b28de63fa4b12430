"""KnowQL as a component of the relay node: the turn store and the engine (seed 003).

:class:`KnowqlComponent` opens :class:`akrelay.knowql.engine.KnowqlEngine` in ``start``; its
routes, ``POST /query`` and its companions, are :mod:`akrelay.http.knowql`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

import anyio

from akrelay.components.kip import KipComponent
from akrelay.components.search import SearchComponent
from akrelay.http import knowql as knowql_http
from akrelay.http.knowql import SHAPE_CHECKS, discovery
from akrelay.http.lifecycle import NotRunning
from akrelay.knowql.contexts import ContextRegistry
from akrelay.knowql.engine import KnowqlEngine
from akrelay.settings import Settings, SettingsError

if TYPE_CHECKING:  # annotations only
    from litestar.handlers import BaseRouteHandler
    from akrelay.knowql.store import TurnStore
    from akrelay.relay.core import Relay
    from akrelay.search.engine import SearchEngine


class KnowqlComponent:
    """``POST /query`` and its companions, over one :class:`KnowqlEngine`.

    A turn reads through the node's search and KIP components (passed in, not
    looked up). ``start`` opens the turn store; ``stop`` cancels running turns
    and closes it, before the components it reads from stop.
    """

    name = "knowql"
    options: tuple[str, ...] = ("knowql_contexts", "knowql_llm_base_url", "knowql_llm_model", "knowql_llm_timeout",
                                 "knowql_rate", "knowql_burst", "knowql_inflight", "knowql_queue", "knowql_tails",
                                 "knowql_llm_max_tokens", "knowql_llm_max_chars")

    @staticmethod
    def check(settings: Settings) -> None:
        """Refuse an unreadable or invalid contexts file before anything starts (:func:`akrelay.node.check_components`)."""
        path = settings.knowql.contexts
        if path:
            try:
                ContextRegistry.load("https://localhost", path)
            except ValueError as exc:  # ContextFileError: its message names the file and the entry
                raise SettingsError(f"--knowql-contexts {path!r}: {exc}") from None

    def __init__(self, relay: Relay, settings: Settings, *, search: SearchComponent, kip: KipComponent,
                 turn_store: Callable[[], TurnStore]) -> None:
        """``turn_store``: opens the node backend's turn store (SQLite file, or the deployment's Redis)."""
        self.relay = relay
        self.settings = settings
        self.search = search
        self.kip = kip
        self.turn_store = turn_store
        self._engine: KnowqlEngine | None = None
        self._create = threading.Lock()
        self._checks: anyio.CapacityLimiter | None = None

    @property
    def checks(self) -> anyio.CapacityLimiter:
        """The threads Query Document checks (``shape``) may use at once in this worker."""
        if self._checks is None:
            self._checks = anyio.CapacityLimiter(SHAPE_CHECKS)
        return self._checks

    def _search(self) -> SearchEngine:
        found = self.search.engine
        # No waiting for the index: the turn's snapshot is the lower of the index
        # position and the nexus head, reported as akrelay.snapshot_seq.
        found.notify()
        return found

    @property
    def engine(self) -> KnowqlEngine:
        """The KnowQL engine :meth:`start` opened; :class:`NotRunning` (503) before start or after stop."""
        service = self._engine
        if service is None:
            raise NotRunning("KnowQL service")
        return service

    def start(self) -> None:
        """Open the turn store and the engine (a request never does)."""
        with self._create:
            if self._engine is None:
                self._engine = KnowqlEngine.open(self.relay, self.settings, self.turn_store(),
                                                   search=self._search, runtime=self.kip.gateway.runtime)

    def stop(self) -> None:
        with self._create:
            service, self._engine = self._engine, None
        if service is not None:
            service.close()

    def discovery(self) -> dict[str, object]:
        return discovery(self.relay, self.settings)

    def routes(self) -> list[BaseRouteHandler]:
        return knowql_http.routes(self)
