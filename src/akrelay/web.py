"""The node component for people and operators: the explorer, ``/metrics``, ``/openapi.json`` and ``/docs``.

Reads the node's search, KIP and KnowQL components through
:mod:`akrelay.observability.sources`; starts nothing (the pages read on demand).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from akrelay.observability import sources

if TYPE_CHECKING:  # annotations only
    from akrelay.http.kip import KipComponent
    from akrelay.http.knowql import KnowqlComponent
    from akrelay.http.search import SearchComponent
    from akrelay.service.relay import Relay
    from akrelay.settings import Settings


class WebComponent:
    name = "web"
    options: tuple[str, ...] = ("no_explorer", "log_json")

    def __init__(self, relay: Relay, settings: Settings, *, search: SearchComponent | None = None,
                 kip: KipComponent | None = None, knowql: KnowqlComponent | None = None, log: bool = False) -> None:
        self.relay = relay
        self.settings = settings
        self.present = {"search": search is not None, "kip": kip is not None, "knowql": knowql is not None,
                        "log": log}
        sources.bind(relay, search=search, kip=kip, knowql=knowql)

    def routes(self) -> list[Any]:
        from akrelay import openapi
        from akrelay.explorer import routes as explorer
        from akrelay.observability import routes as metrics

        return (explorer.routes(self.relay, self.settings) + metrics.routes(self.relay, self.settings)
                + openapi.routes(self.relay, self.settings, self.present))

    def error_page(self, path: str, status: int, allow: str | None) -> Any:
        """The explorer's HTML page for a 404 or 405 under ``/explorer`` (see ``akrelay.http.errors``)."""
        if getattr(self.settings, "no_explorer", False):
            return None
        from akrelay.explorer.routes import error_page

        return error_page(path, status, allow)

    def discovery(self) -> dict[str, Any]:
        return {}

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
