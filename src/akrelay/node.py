"""The owner of a running relay: :class:`RelayNode`.

One object builds, in plain code, everything a relay process runs: the store
and the relay service (or a relay it is given), then each component (search,
KIP, sync, KnowQL). It starts them in that order and stops them in reverse,
then closes the store it opened. Nothing starts when a module is imported or
when routes are mounted: the HTTP app mounts :meth:`RelayNode.routes`, and its
lifespan calls :meth:`RelayNode.start` and :meth:`RelayNode.stop`. The CLI
opens the same object with only the components a command needs.

Worker processes (Granian) each own one node over the same data directory;
the one-per-directory jobs (search indexer, KIP importer, sync loop) elect
their process with a lock file (:mod:`akrelay.leader`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING, Any, Collection, Iterable, Protocol, Sequence, runtime_checkable

from akrelay.protocol.options import ValidationOptions
from akrelay.service.config import ServiceConfig
from akrelay.service.relay import Relay, open_relay, open_shared_relay
from akrelay.settings import Settings, defaults, licence_allow_list
from akrelay.store.follow import set_max_defer

if TYPE_CHECKING:  # the component modules are imported when a node builds them (issue 25: start-up time)
    from akrelay.http.kip import KipComponent
    from akrelay.http.knowql import KnowqlComponent
    from akrelay.http.peers import SyncComponent
    from akrelay.http.search import SearchComponent

log = logging.getLogger("akrelay.node")


@runtime_checkable
class Component(Protocol):
    """One optional part of a relay: its options, its routes, its discovery member, start and stop."""

    #: short name (``akrelay.node.COMPONENTS``)
    name: str
    #: the settings (``akrelay.settings.OPTIONS`` names) it reads
    options: tuple[str, ...]

    def routes(self) -> list[Any]:
        """Litestar route handlers to mount (none for a background-only component)."""
        ...

    def discovery(self) -> dict[str, Any]:
        """Members merged into the §9.2 document (see :func:`merge_discovery`)."""
        ...

    def start(self) -> None:
        """Start background work (threads, files); called once, in component order."""
        ...

    def stop(self) -> None:
        """Stop what :meth:`start` (or first use) started and close its files; idempotent."""
        ...


#: Every component, in start order (stop runs in reverse). KnowQL reads through search and KIP.
COMPONENTS: tuple[str, ...] = ("log", "search", "kip", "sync", "knowql", "web")


def service_config(settings: Settings) -> ServiceConfig:
    """Translate operator settings into the service's ``ServiceConfig``.

    Operator options of other areas (search, peers, KIP) stay in ``Settings``;
    they reach discovery through the components, not through here.
    """
    candidates: dict[str, Any] = dict(
        origin=settings.origin,
        max_envelope_bytes=settings.max_envelope_bytes,
        options=ValidationOptions(allow_legacy_retract=not settings.refuse_legacy_retract),
        licence_allowlist=licence_allow_list(settings),
    )
    fields = {f.name for f in dataclasses.fields(ServiceConfig)}
    return ServiceConfig(**{k: v for k, v in candidates.items() if k in fields})


def open_relay_for(settings: Settings, *, store_background: bool = True) -> Relay:
    """Open the relay: the log in ``settings.store`` (Redis) or in ``settings.data`` (SQLite).

    With a Redis store the data directory (created if needed) holds only this
    node's derived state: search index, KIP nexus, TLS files.
    ``store_background=False``: the SQLite store runs no trigram indexer and no WAL
    checkpointer here (the workers do; :mod:`akrelay.followers` opens it so).
    """
    data = settings.data_dir
    data.mkdir(parents=True, exist_ok=True)
    if settings.store:
        return open_shared_relay(settings.store, service_config(settings), namespace=settings.store_namespace,
                                 accept_weak_durability=settings.accept_weak_durability, data_dir=data)
    return open_relay(data, service_config(settings), text_indexer=store_background,
                      merkle_log=not settings.no_merkle_log)


#: The component classes that check their own files (read by the settings as paths only), by
#: ``module:class``: imported only for a check that has a file to read (issue 25: the launcher).
_CHECKS: dict[str, tuple[str, str]] = {"sync": ("akrelay.http.peers:SyncComponent", "peers"),
                                       "knowql": ("akrelay.http.knowql:KnowqlComponent", "knowql_contexts")}


def _component_class(ref: str) -> Any:
    import importlib

    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def check_components(settings: Settings, names: Collection[str] | None = None) -> None:
    """Have each named component check the files its options name (peer file, contexts file).

    A :class:`~akrelay.settings.SettingsError` naming the option and the entry;
    run once before anything starts (``akrelay serve``, ``akrelay sync``), not in every worker.
    """
    if names is None:
        names = () if settings.core_only else COMPONENTS
    for name in COMPONENTS:
        if name in names and name in _CHECKS:
            ref, option = _CHECKS[name]
            if getattr(settings, option, None):  # each check reads only this file (nothing to check without)
                _component_class(ref).check(settings)


def build_components(relay: Relay, settings: Settings, names: Collection[str], *,
                     follow: bool = True) -> list[Component]:
    """The components called ``names``, built in :data:`COMPONENTS` order; an unknown name is an error.

    ``follow=False``: the search index and the KIP nexus are kept current by another
    process (:mod:`akrelay.followers`); these components only read them.
    """
    unknown = set(names) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown relay components: {', '.join(sorted(unknown))} (known: {', '.join(COMPONENTS)})")

    set_max_defer(settings.follow_max_defer)  # before any follower is built (the followers' process, --followers thread)
    built: list[Component] = []
    search = kip = knowql = None
    tlog = None
    if "log" in names:  # the signed Merkle log of acceptances (issue 23)
        from akrelay.http.transparency import LogComponent

        tlog = LogComponent(relay, settings)
        built.append(tlog)
    if "search" in names:  # each component's module loads only when it is built (issue 25)
        from akrelay.http.search import SearchComponent

        search = SearchComponent(relay, settings, follow=follow)
        built.append(search)
    if "kip" in names:
        from akrelay.http.kip import KipComponent

        kip = KipComponent(relay, settings, follow=follow)
        built.append(kip)
    if "sync" in names:
        from akrelay.http.peers import SyncComponent

        built.append(SyncComponent(relay, settings))
    if "knowql" in names:
        from akrelay.http.knowql import KnowqlComponent

        if search is None or kip is None:
            raise ValueError("the knowql component reads through the search and kip components; list them too")
        knowql = KnowqlComponent(relay, settings, search=search, kip=kip)
        built.append(knowql)
    if "web" in names:  # the explorer, /metrics, /openapi.json: reads whichever of the above are built
        from akrelay.web import WebComponent

        built.append(WebComponent(relay, settings, search=search, kip=kip, knowql=knowql,
                                  log=tlog is not None and tlog.tlog is not None))
    return built


def merge_discovery(doc: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Merge a component's members: lists and maps extend the relay's, other members are set."""
    for key, value in extra.items():
        if key == "endpoints":
            doc["endpoints"] = {**doc.get("endpoints", {}), **value}
        elif key in ("features", "search_modes"):
            merged = list(doc.get(key, []))
            merged.extend(v for v in value if v not in merged)
            doc[key] = merged
        elif key == "limits":
            doc["limits"] = {**doc.get("limits", {}), **value}
        else:
            doc[key] = value
    return doc


class RelayNode:
    """A relay and its components, started and stopped together.

    ``relay`` given: the node runs components over it and leaves closing it to
    the caller (tests, embedding code). Else :meth:`open` opens the store in
    ``settings.data`` and :meth:`stop` closes it last. ``components`` names
    which of :data:`COMPONENTS` to build (``settings.core_only``: none);
    ``extra`` adds components built by the caller, started after them.
    ``follow=False``: the log followers (search indexer, KIP importer) run in
    another process; this node only reads what they keep (``akrelay serve``'s workers).
    """

    def __init__(self, relay: Relay, settings: Settings | None = None, *,
                 components: Collection[str] | None = None, extra: Sequence[Component] = (),
                 owns_relay: bool = False, follow: bool = True) -> None:
        self.relay = relay
        self.settings = settings if settings is not None else defaults()
        if components is None:
            components = () if self.settings.core_only else COMPONENTS
        self.components: list[Component] = build_components(relay, self.settings, components,
                                                                    follow=follow) + list(extra)
        self.owns_relay = owns_relay
        self._state = "built"
        self._lock = threading.Lock()

    @classmethod
    def open(cls, settings: Settings, *, components: Collection[str] | None = None,
             extra: Sequence[Component] = (), follow: bool = True, store_background: bool = True) -> "RelayNode":
        """A node over the relay in ``settings.data`` (opened here, closed by :meth:`stop`).

        The components' files are checked first (:func:`check_components`): a bad one opens nothing.
        ``store_background``: see :func:`open_relay_for`.
        """
        check_components(settings, components)
        relay = open_relay_for(settings, store_background=store_background)
        try:
            return cls(relay, settings, components=components, extra=extra, owns_relay=True, follow=follow)
        except BaseException:
            relay.close()
            raise

    # -- components -------------------------------------------------------------------
    def component(self, name: str) -> Any:
        """The component called ``name``; ``KeyError`` when this node was built without it."""
        for component in self.components:
            if component.name == name:
                return component
        raise KeyError(f"this relay node runs no {name!r} component")

    @property
    def search(self) -> SearchComponent:
        return self.component("search")  # type: ignore[no-any-return]

    @property
    def kip(self) -> KipComponent:
        return self.component("kip")  # type: ignore[no-any-return]

    @property
    def sync(self) -> SyncComponent:
        return self.component("sync")  # type: ignore[no-any-return]

    @property
    def knowql(self) -> KnowqlComponent:
        return self.component("knowql")  # type: ignore[no-any-return]

    def routes(self) -> list[Any]:
        """Every component's routes (the core §9.1 routes are the HTTP app's own)."""
        return [route for component in self.components for route in component.routes()]

    def discovery(self) -> dict[str, Any]:
        """The relay's §9.2 document plus every component's members."""
        doc = dict(self.relay.discovery())
        for component in self.components:
            merge_discovery(doc, component.discovery() or {})
        return doc

    # -- lifecycle --------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Between a completed :meth:`start` and :meth:`stop` (``/readyz``)."""
        return self._state == "started"

    def start(self) -> None:
        """Start every component in order; if one fails, stop those already started and re-raise."""
        with self._lock:
            if self._state != "built":
                return
            started: list[Component] = []
            try:
                self.relay.start()  # hear commits of the other nodes (a shared store), before the followers start
                for component in self.components:
                    component.start()
                    started.append(component)
            except BaseException:
                _stop_all(reversed(started))
                raise
            self._state = "started"

    def stop(self) -> None:
        """Stop every component in reverse order, then close the store if this node opened it.

        Components that were never started are stopped too (a request may have
        opened a service on first use). Idempotent.
        """
        with self._lock:
            if self._state == "stopped":
                return
            self._state = "stopped"
            _stop_all(reversed(self.components))
            self.relay.stop()  # what start() started, even over a relay the caller keeps open
            if self.owns_relay:
                self.relay.close()

    close = stop

    def __enter__(self) -> "RelayNode":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _stop_all(components: Iterable[Component]) -> None:
    """Stop each; a failing stop is logged and the others still stop."""
    for component in components:
        try:
            component.stop()
        except Exception:  # noqa: BLE001 - the remaining components must stop anyway
            log.exception("stopping the %s component failed", component.name)
