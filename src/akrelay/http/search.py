"""``POST /v1/knowledge/search`` (Agent Knowledge §9.5) and its discovery members.

Thin: the body goes to :class:`akrelay.search.SearchService`, which parses it
strictly and returns a page; errors leave through the common error mapping.
One service per relay (per worker process), created with the routes.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

import anyio.to_thread
from litestar import Request, post
from litestar.response.base import ASGIResponse

from akrelay.http.errors import JSON
from akrelay.search import Budget, SearchService
from akrelay.search.service import discovery_members

_SERVICES: "weakref.WeakKeyDictionary[Any, SearchService]" = weakref.WeakKeyDictionary()
_SETTINGS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_CREATE = threading.Lock()


def data_dir_of(relay: Any) -> Path | None:
    """The data directory of a relay on an on-disk store; ``None`` keeps the index in memory."""
    path = getattr(relay.store, "path", None)
    return Path(path).parent if path is not None else None


def _options(settings: Any) -> dict[str, Any]:
    """Service options from the serve settings (defaults where a setting is absent)."""
    get = (lambda name, default: getattr(settings, name, default)) if settings is not None else (lambda n, d: d)
    try:
        return {"budget": Budget(candidates=get("search_candidates", 1000),
                                 seconds=get("search_timeout_ms", 500) / 1000),
                "writer_threads": get("search_writer_threads", 1)}
    except AttributeError:
        return {}


def search_service(relay: Any, settings: Any = None) -> SearchService:
    """The search service of ``relay``, created (and its index opened) on first use."""
    service = _SERVICES.get(relay)
    if service is None:
        with _CREATE:  # two first requests must not build two indexes
            service = _SERVICES.get(relay)
            if service is None:
                options = _options(settings if settings is not None else _SETTINGS.get(relay))
                service = SearchService(relay, data_dir_of(relay), **options)
                _SERVICES[relay] = service
    return service


def routes(relay: Any, settings: Any) -> list[Any]:
    _SETTINGS[relay] = settings
    # An on-disk relay opens (or rebuilds) its index at start; an in-memory one
    # waits for its first search, so apps that never search start no thread.
    if data_dir_of(relay) is not None:
        search_service(relay, settings)
    path = relay.config.search_path

    @post(path, status_code=200)
    async def search(request: Request) -> ASGIResponse:
        from akrelay.http.app import _require_json

        _require_json(request)
        body = await request.body()
        page = await anyio.to_thread.run_sync(search_service(relay, settings).search, body)
        return ASGIResponse(body=page.to_json(), status_code=200, media_type=JSON)

    return [search]


def shutdown(relay: Any) -> None:
    """Stop the indexer thread before the relay closes its store (its next step would fail on it)."""
    service = _SERVICES.pop(relay, None)
    if service is not None:
        service.close()


def discovery(relay: Any, settings: Any) -> dict[str, Any]:
    """``features: ["ranked-search"]``, ``search_modes`` and ``endpoints.search`` (§9.2)."""
    return discovery_members(relay.config)
