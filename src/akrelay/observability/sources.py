"""Where the explorer and ``/metrics`` read the other components' state (search, KIP, KnowQL).

The one place that knows how those components are reached from a relay (today
through their route modules' per-relay registries), so that a new way of
owning components changes this module only.
"""

from __future__ import annotations

from typing import Any


def kip_runtime(relay: Any) -> Any:
    """The relay's KIP runtime, opened (and caught up) if need be; raises if KIP cannot open."""
    from akrelay.http.knowql import _gateway

    return _gateway(relay).runtime()


def kip_head(relay: Any) -> int | None:
    """The KIP nexus head of this process, or ``None`` before its runtime opened (never opens it)."""
    from akrelay.http import kip

    for gateway in kip.GATEWAYS:
        runtime = gateway._runtime  # noqa: SLF001 - read without opening it
        if gateway.relay is relay and runtime is not None:
            return int(runtime.nexus.head)
    return None


def kip_default_policy(relay: Any) -> str | None:
    from akrelay.http import kip

    for gateway in kip.GATEWAYS:
        if gateway.relay is relay:
            return str(gateway.config.default_policy)
    return None


def search_position(relay: Any, settings: Any) -> int | None:
    """The search index position (the last indexed ``seq``), ``None`` without the search area."""
    if getattr(settings, "core_only", False):
        return None
    from akrelay.http.search import search_service

    return int(search_service(relay, settings).index_seq())


def knowql_service(relay: Any, settings: Any) -> Any:
    """The relay's KnowQL service (created with its routes)."""
    from akrelay.http.knowql import knowql_service as service

    return service(relay, settings)


def knowql_turn_counts(relay: Any) -> dict[str, int] | None:
    """Turns per status in the shared turn store, ``None`` while this process has no KnowQL service."""
    from akrelay.http.knowql import _SERVICES

    service = _SERVICES.get(relay)
    return service.store.status_counts() if service is not None else None
