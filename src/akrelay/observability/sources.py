"""Where the explorer and ``/metrics`` read the other components' state (search, KIP, KnowQL).

:class:`akrelay.web.WebComponent` binds the node's components
to their relay here when it is built; this is the one module that knows how to
reach them, and anything not bound reads as absent.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Bound:
    search: Any = None
    kip: Any = None
    knowql: Any = None


_BOUND: "weakref.WeakKeyDictionary[Any, Bound]" = weakref.WeakKeyDictionary()


def bind(relay: Any, *, search: Any = None, kip: Any = None, knowql: Any = None) -> None:
    _BOUND[relay] = Bound(search, kip, knowql)


def _bound(relay: Any) -> Bound:
    return _BOUND.get(relay) or Bound()


def kip_runtime(relay: Any) -> Any:
    """The relay's KIP runtime, opened (and caught up) if need be; raises without KIP."""
    kip = _bound(relay).kip
    if kip is None:
        raise LookupError("this relay runs no KIP component")
    return kip.gateway.runtime()


def kip_head(relay: Any) -> int | None:
    """The KIP nexus head of this process, or ``None`` before its runtime opened (never opens it)."""
    kip = _bound(relay).kip
    runtime = kip.gateway._runtime if kip is not None else None  # noqa: SLF001 - read without opening it
    return int(runtime.nexus.head) if runtime is not None else None


def kip_default_policy(relay: Any) -> str | None:
    kip = _bound(relay).kip
    return str(kip.gateway.config.default_policy) if kip is not None else None


def search_position(relay: Any, settings: Any) -> int | None:
    """The search index position (the last indexed ``seq``), ``None`` without the search component."""
    search = _bound(relay).search
    return int(search.service.index_seq()) if search is not None else None


def knowql_service(relay: Any, settings: Any) -> Any:
    knowql = _bound(relay).knowql
    if knowql is None:
        raise LookupError("this relay runs no KnowQL component")
    return knowql.service


def knowql_turn_counts(relay: Any) -> dict[str, int] | None:
    """Turns per status in the shared turn store, ``None`` without KnowQL."""
    knowql = _bound(relay).knowql
    return knowql.service.store.status_counts() if knowql is not None else None
