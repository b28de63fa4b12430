"""Where the explorer and ``/metrics`` read the other components' state (search, KIP, KnowQL, peers).

The node builds one :class:`Sources` from its components and its backend and hands it
to :class:`akrelay.web.WebComponent`, which passes it to the pages: no process-wide
registry, so two nodes in one process never read each other's components. Anything
not given reads as absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from akrelay.components.kip import KipComponent
    from akrelay.components.knowql import KnowqlComponent
    from akrelay.components.search import SearchComponent
    from akrelay.federation.state import StateStore
    from akrelay.kip.runtime import KipRuntime
    from akrelay.knowql.engine import KnowqlEngine


@dataclass(frozen=True, slots=True)
class Sources:
    search: SearchComponent | None = None
    kip: KipComponent | None = None
    knowql: KnowqlComponent | None = None
    #: the backend's federation state for reading (``None`` from it: no state kept yet)
    federation_state: Callable[[], StateStore | None] | None = None

    def kip_runtime(self) -> KipRuntime:
        """The node's running KIP runtime (caught up); raises without KIP or while it is not running."""
        if self.kip is None:
            raise LookupError("this relay runs no KIP component")
        return self.kip.gateway.runtime()

    def kip_head(self) -> int | None:
        """The KIP nexus head of this process, or ``None`` before its runtime opened (never opens it)."""
        runtime = self.kip.gateway._runtime if self.kip is not None else None  # noqa: SLF001 - read without opening
        return int(runtime.nexus.head) if runtime is not None else None

    def kip_default_policy(self) -> str | None:
        return str(self.kip.gateway.config.default_policy) if self.kip is not None else None

    def search_position(self) -> int | None:
        """The search index position (the last indexed ``seq``), ``None`` without the search component."""
        return int(self.search.engine.index_seq()) if self.search is not None else None

    def knowql_engine(self) -> KnowqlEngine:
        if self.knowql is None:
            raise LookupError("this relay runs no KnowQL component")
        return self.knowql.engine

    def knowql_turn_counts(self) -> dict[str, int] | None:
        """Turns per status in the shared turn store, ``None`` without KnowQL."""
        return self.knowql.engine.store.status_counts() if self.knowql is not None else None

    def open_federation_state(self) -> StateStore | None:
        """The federation state for reading, or ``None`` (none kept, or no backend given)."""
        return self.federation_state() if self.federation_state is not None else None
