"""Federation's hooks into the HTTP app (listed in ``akrelay.http.app.ROUTE_MODULES``).

No endpoints: discovery gains the configured peer origins as hints (§9.2),
and each worker offers to run the sync loop, of which exactly one per data
directory leads (:mod:`akrelay.federation.runner`).
"""

from __future__ import annotations

from typing import Any

from akrelay.federation.peers import distinct_origins, load_peers


def discovery(relay: Any, settings: Any) -> dict[str, Any]:
    """Up to 32 enabled peer origins, canonical, distinct and never our own."""
    if not getattr(settings, "peers", None):
        return {}
    origins = distinct_origins(load_peers(settings.peers).peers, relay.config.origin)
    return {"peers": origins}


def routes(relay: Any, settings: Any) -> list[Any]:
    if getattr(settings, "peers", None):
        from akrelay.federation.runner import start_background

        start_background(settings)
    return []
