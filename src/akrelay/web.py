"""The node component for people and operators: the explorer, ``/metrics``, ``/openapi.json`` and ``/docs``.

Reads the node's search, KIP and KnowQL components and its federation state through the
:class:`akrelay.observability.sources.Sources` the node gives it; starts nothing (the pages read on demand).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from akrelay.observability.sources import Sources

if TYPE_CHECKING:  # annotations only
    from litestar import Response
    from litestar.handlers import BaseRouteHandler
    from akrelay.relay.core import Relay
    from akrelay.settings import Settings


class WebComponent:
    name = "web"
    options: tuple[str, ...] = ("no_explorer", "log_json")

    def __init__(self, relay: Relay, settings: Settings, *, sources: Sources | None = None, log: bool = False) -> None:
        self.relay = relay
        self.settings = settings
        self.sources = sources if sources is not None else Sources()
        self.present = {"search": self.sources.search is not None, "kip": self.sources.kip is not None,
                        "knowql": self.sources.knowql is not None, "log": log}

    def routes(self) -> list[BaseRouteHandler]:
        from akrelay import openapi
        from akrelay.explorer import routes as explorer
        from akrelay.observability import routes as metrics

        handlers: list[BaseRouteHandler] = []
        handlers += explorer.routes(self.relay, self.settings, self.sources)
        handlers += metrics.routes(self.relay, self.settings, self.sources)
        handlers += openapi.routes(self.relay, self.settings, self.present)
        return handlers

    def error_page(self, path: str, status: int, allow: str | None) -> Response[bytes] | None:
        """The explorer's HTML page for a 404 or 405 under ``/explorer`` (see ``akrelay.http.errors``)."""
        if self.settings.explorer.disabled:
            return None
        from akrelay.explorer.routes import error_page

        return error_page(path, status, allow)

    def discovery(self) -> dict[str, object]:
        return {}

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
