"""The owner of a running relay: :class:`RelayNode`.

One object builds everything a relay process runs: the backend chosen once from
the settings (:mod:`akrelay.backend`), the relay it opens (or a relay it is given),
the store component, then each component of the :data:`REGISTRY` (log, search, KIP,
sync, KnowQL, web), each given what it needs by the node (no globals). It starts
them in that order and stops them in reverse, then closes the store and the backend
it opened. Nothing starts when a module is imported, when the node is opened or
when routes are mounted: the HTTP app mounts :meth:`RelayNode.routes`, and its
lifespan calls :meth:`RelayNode.start` and :meth:`RelayNode.stop`. The CLI
opens the same object with only the components a command needs.

Worker processes (Granian) each own one node over the same data directory;
the one-per-directory jobs (search indexer, KIP importer, sync loop) elect
their process with a lock file (:mod:`akrelay.leader`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Callable, Collection, Iterable, Mapping, Protocol, Sequence, TypeVar, overload,
                    runtime_checkable)

from akrelay.backend import Backend, backend_class, backend_for, relay_config
from akrelay.relay.core import Relay
from akrelay.settings import Settings, defaults
from akrelay.store.base import BackgroundStore
from akrelay.store.follow import set_max_defer

if TYPE_CHECKING:  # the component modules are imported when a node builds one (issue 25: start-up time)
    from litestar.handlers import BaseRouteHandler
    from akrelay.components.kip import KipComponent
    from akrelay.components.knowql import KnowqlComponent
    from akrelay.components.sync import SyncComponent
    from akrelay.http.ratelimit import RateLimits
    from akrelay.components.search import SearchComponent

__all__ = ["COMPONENTS", "REGISTRY", "Component", "ComponentRegistry", "ComponentSpec", "Assembly", "RelayNode",
           "StoreComponent", "build_components", "check_components", "merge_discovery", "open_relay_for",
           "relay_config"]

log = logging.getLogger("akrelay.node")
C = TypeVar("C")


@runtime_checkable
class Component(Protocol):
    """One optional part of a relay: its options, its routes, its discovery member, start and stop."""

    #: short name (``akrelay.node.COMPONENTS``)
    name: str
    #: the settings (``akrelay.settings.OPTIONS`` names) it reads
    options: tuple[str, ...]

    def routes(self) -> list[BaseRouteHandler]:
        """Litestar route handlers to mount (none for a background-only component)."""
        ...

    def discovery(self) -> dict[str, object]:
        """Members merged into the §9.2 document (see :func:`merge_discovery`)."""
        ...

    def start(self) -> None:
        """Start background work (threads, files); called once, in component order."""
        ...

    def stop(self) -> None:
        """Stop what :meth:`start` started and close its files; idempotent."""
        ...


class StoreComponent:
    """The log store's own background work (trigram indexer, WAL checkpointer), first in start order.

    Always part of a node (it is not one of :data:`COMPONENTS`): opening a store starts
    nothing, so schema creation and the CLI run no thread. ``background=False``: the
    store's work runs in other processes (:mod:`akrelay.process.followers` leaves it to the workers).
    """

    name = "store"
    options: tuple[str, ...] = ()

    def __init__(self, relay: Relay, *, background: bool = True) -> None:
        self.relay = relay
        self.background = background

    def routes(self) -> list[BaseRouteHandler]:
        return []

    def discovery(self) -> dict[str, object]:
        return {}

    def start(self) -> None:
        self.relay.start()  # hear commits of the other nodes (a shared store), before the followers start
        store = self.relay.store
        if self.background and isinstance(store, BackgroundStore):
            store.start()

    def stop(self) -> None:
        store = self.relay.store
        if isinstance(store, BackgroundStore):
            store.stop()
        self.relay.stop()  # what start() started, even over a relay the caller keeps open


@dataclass
class Assembly:
    """What a component's builder is given: the relay, settings, backend and the components built before it."""

    relay: Relay
    settings: Settings
    backend: Backend
    follow: bool = True
    built: dict[str, Component] = field(default_factory=dict)

    def get(self, name: str, kind: type[C]) -> C | None:
        """The component ``name`` if it was built (before this one), else ``None``."""
        found = self.built.get(name)
        return found if isinstance(found, kind) else None

    def require(self, name: str, kind: type[C], by: str) -> C:
        found = self.get(name, kind)
        if found is None:
            raise ValueError(f"the {by} component reads through the {name} component; list it too")
        return found


@dataclass(frozen=True)
class ComponentSpec:
    """One entry of the :class:`ComponentRegistry`: how to build a component, and how to check its files."""

    name: str
    build: Callable[[Assembly], Component]
    #: checks the files its options name before anything opens (a ``SettingsError``)
    check: Callable[[Settings], None] | None = None


class ComponentRegistry:
    """The components a node may run, in start order (stop runs in reverse).

    A new component is one :class:`ComponentSpec` (here in :data:`REGISTRY`, or in a copy
    made with :meth:`with_component`); nothing else names it.
    """

    def __init__(self, specs: Sequence[ComponentSpec]) -> None:
        self.specs: tuple[ComponentSpec, ...] = tuple(specs)
        self.names: tuple[str, ...] = tuple(spec.name for spec in self.specs)
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"component names repeat: {self.names}")

    def with_component(self, spec: ComponentSpec, *, after: str | None = None) -> "ComponentRegistry":
        """A copy with ``spec`` added after the component ``after`` (default: last)."""
        specs = list(self.specs)
        specs.insert(specs.index(self.spec(after)) + 1 if after is not None else len(specs), spec)
        return ComponentRegistry(specs)

    def spec(self, name: str) -> ComponentSpec:
        for spec in self.specs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def check(self, settings: Settings, names: Collection[str]) -> None:
        for spec in self.specs:
            if spec.name in names and spec.check is not None:
                spec.check(settings)

    def build(self, assembly: Assembly, names: Collection[str]) -> list[Component]:
        """The components called ``names``, built in registry order; an unknown name is a ``ValueError``."""
        unknown = set(names) - set(self.names)
        if unknown:
            raise ValueError(f"unknown relay components: {', '.join(sorted(unknown))} (known: {', '.join(self.names)})")
        built: list[Component] = []
        for spec in self.specs:
            if spec.name in names:
                component = spec.build(assembly)
                assembly.built[spec.name] = component
                built.append(component)
        return built


def _log(a: Assembly) -> Component:
    """The signed Merkle log of acceptances (issue 23)."""
    from akrelay.components.log import LogComponent

    return LogComponent.open(a.relay, a.settings, shared=a.backend.shared, federation_state=a.backend.federation_state,
                             witness_state=a.backend.witness_state)


def _search(a: Assembly) -> Component:
    from akrelay.components.search import SearchComponent

    return SearchComponent(a.relay, a.settings, follow=a.follow)


def _kip(a: Assembly) -> Component:
    from akrelay.components.kip import KipComponent

    return KipComponent(a.relay, a.settings, follow=a.follow)


def _sync(a: Assembly) -> Component:
    from akrelay.components.sync import SyncComponent

    return SyncComponent(a.relay, a.settings, leadership=a.backend.leadership)


def _check_sync(settings: Settings) -> None:
    if settings.federation.peers:  # the check reads only this file: nothing to import without it
        from akrelay.components.sync import SyncComponent

        SyncComponent.check(settings)


def _knowql(a: Assembly) -> Component:
    from akrelay.components.kip import KipComponent
    from akrelay.components.knowql import KnowqlComponent
    from akrelay.components.search import SearchComponent

    return KnowqlComponent(a.relay, a.settings, search=a.require("search", SearchComponent, "knowql"),
                           kip=a.require("kip", KipComponent, "knowql"), turn_store=a.backend.turn_store)


def _check_knowql(settings: Settings) -> None:
    if settings.knowql.contexts:
        from akrelay.components.knowql import KnowqlComponent

        KnowqlComponent.check(settings)


def _web(a: Assembly) -> Component:
    """The explorer, /metrics, /openapi.json: reads whichever of the other components are built."""
    from akrelay.components.kip import KipComponent
    from akrelay.components.knowql import KnowqlComponent
    from akrelay.components.search import SearchComponent
    from akrelay.components.log import LogComponent
    from akrelay.observability.sources import Sources
    from akrelay.web import WebComponent

    tlog = a.get("log", LogComponent)
    sources = Sources(search=a.get("search", SearchComponent), kip=a.get("kip", KipComponent),
                      knowql=a.get("knowql", KnowqlComponent), federation_state=a.backend.federation_state)
    return WebComponent(a.relay, a.settings, sources=sources, log=tlog is not None and tlog.tlog is not None)


#: Every component, in start order (stop runs in reverse). KnowQL reads through search and KIP.
#: Each builder imports its component's module, so a process loads only the components it runs.
REGISTRY = ComponentRegistry([
    ComponentSpec("log", _log),
    ComponentSpec("search", _search),
    ComponentSpec("kip", _kip),
    ComponentSpec("sync", _sync, check=_check_sync),
    ComponentSpec("knowql", _knowql, check=_check_knowql),
    ComponentSpec("web", _web),
])
COMPONENTS: tuple[str, ...] = REGISTRY.names


def open_relay_for(settings: Settings) -> Relay:
    """Open the relay of ``settings`` through its backend (:func:`akrelay.backend.backend_for`).

    With a Redis store the data directory (created if needed) holds only this
    node's derived state: search index, KIP nexus, TLS files. Nothing starts.
    """
    return backend_for(settings).open_relay()


def check_components(settings: Settings, names: Collection[str] | None = None, *,
                     registry: ComponentRegistry = REGISTRY) -> None:
    """Have each named component check the files its options name (peer file, contexts file).

    A :class:`~akrelay.settings.SettingsError` naming the option and the entry;
    run once before anything starts (``akrelay serve``, ``akrelay sync``), not in every worker.
    """
    backend_class(settings)  # a --store that no backend serves: the same SettingsError, before anything opens
    if names is None:
        names = () if settings.core_only else registry.names
    registry.check(settings, names)


def build_components(relay: Relay, settings: Settings, names: Collection[str], *, follow: bool = True,
                     backend: Backend | None = None, registry: ComponentRegistry = REGISTRY) -> list[Component]:
    """The components called ``names``, built in registry order; an unknown name is an error.

    ``follow=False``: the search index and the KIP nexus are kept current by another
    process (:mod:`akrelay.process.followers`); these components only read them.
    """
    set_max_defer(settings.follow_max_defer)  # before any follower is built (the followers' process, --followers thread)
    assembly = Assembly(relay, settings, backend if backend is not None else backend_for(settings), follow)
    return registry.build(assembly, names)


def _members(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _elements(value: object) -> list[object]:
    return list(value) if isinstance(value, (list, tuple)) else []


def merge_discovery(doc: dict[str, object], extra: Mapping[str, object]) -> dict[str, object]:
    """Merge a component's members: lists and maps extend the relay's, other members are set."""
    for key, value in extra.items():
        if key in ("endpoints", "limits"):
            doc[key] = {**_members(doc.get(key)), **_members(value)}
        elif key in ("features", "search_modes"):
            merged = _elements(doc.get(key))
            merged.extend(v for v in _elements(value) if v not in merged)
            doc[key] = merged
        else:
            doc[key] = value
    return doc


class RelayNode:
    """A relay and its components, started and stopped together.

    ``relay`` given: the node runs components over it and leaves closing it to
    the caller (tests, embedding code). Else :meth:`open` opens the store through
    the settings' backend and :meth:`stop` closes it last. ``components`` names
    which of the registry's components to build (``settings.core_only``: none);
    ``extra`` adds components built by the caller, started after them.
    ``follow=False``: the log followers (search indexer, KIP importer) run in
    another process; this node only reads what they keep (``akrelay serve``'s workers).
    ``store_background=False``: the store's own background work runs elsewhere.
    """

    def __init__(self, relay: Relay, settings: Settings | None = None, *,
                 components: Collection[str] | None = None, extra: Sequence[Component] = (),
                 owns_relay: bool = False, follow: bool = True, backend: Backend | None = None,
                 registry: ComponentRegistry = REGISTRY, store_background: bool = True) -> None:
        self.relay = relay
        self.settings = settings if settings is not None else defaults()
        #: where the state is kept (one for the node; opened by :meth:`open`, else only asked)
        self.backend = backend if backend is not None else backend_for(self.settings)
        self._owns_backend = backend is None or owns_relay
        self.backend.bind(relay)
        if components is None:
            components = () if self.settings.core_only else registry.names
        self.store = StoreComponent(relay, background=store_background)
        self.components: list[Component] = build_components(relay, self.settings, components, follow=follow,
                                                            backend=self.backend, registry=registry) + list(extra)
        self.owns_relay = owns_relay
        self._state = "built"
        self._lock = threading.Lock()

    @classmethod
    def open(cls, settings: Settings, *, components: Collection[str] | None = None,
             extra: Sequence[Component] = (), follow: bool = True, store_background: bool = True,
             registry: ComponentRegistry = REGISTRY) -> "RelayNode":
        """A node over the relay of ``settings``' backend (opened here, closed by :meth:`stop`).

        The components' files are checked first (:func:`check_components`): a bad one opens nothing.
        Nothing starts before :meth:`start`.
        """
        check_components(settings, components, registry=registry)
        backend = backend_for(settings)
        relay = backend.open_relay()
        try:
            return cls(relay, settings, components=components, extra=extra, owns_relay=True, follow=follow,
                       backend=backend, registry=registry, store_background=store_background)
        except BaseException:
            relay.close()
            backend.close()
            raise

    # -- components -------------------------------------------------------------------
    @overload
    def component(self, name: str) -> Component: ...
    @overload
    def component(self, name: str, kind: type[C]) -> C: ...

    def component(self, name: str, kind: type[object] = object) -> object:
        """The component called ``name``, checked to be a ``kind``.

        ``KeyError`` when this node was built without it, ``TypeError`` when it is of another type.
        """
        for component in self.components:
            if component.name == name:
                if not isinstance(component, kind):
                    raise TypeError(f"the {name!r} component is a {type(component).__name__}, not a {kind.__name__}")
                return component
        raise KeyError(f"this relay node runs no {name!r} component")

    @property
    def search(self) -> SearchComponent:
        from akrelay.components.search import SearchComponent

        return self.component("search", SearchComponent)

    @property
    def kip(self) -> KipComponent:
        from akrelay.components.kip import KipComponent

        return self.component("kip", KipComponent)

    @property
    def sync(self) -> SyncComponent:
        from akrelay.components.sync import SyncComponent

        return self.component("sync", SyncComponent)

    @property
    def knowql(self) -> KnowqlComponent:
        from akrelay.components.knowql import KnowqlComponent

        return self.component("knowql", KnowqlComponent)

    def routes(self) -> list[BaseRouteHandler]:
        """Every component's routes (the core §9.1 routes are the HTTP app's own)."""
        return [route for component in self.components for route in component.routes()]

    def discovery(self) -> dict[str, object]:
        """The relay's §9.2 document plus every component's members."""
        doc = dict(self.relay.discovery())
        for component in self.components:
            merge_discovery(doc, component.discovery() or {})
        return doc

    def rate_limits(self) -> RateLimits:
        """One worker's token buckets, from the backend (the app's shutdown closes them)."""
        return self.backend.rate_limits()

    # -- lifecycle --------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Between a completed :meth:`start` and :meth:`stop` (``/readyz``)."""
        return self._state == "started"

    def start(self) -> None:
        """Start the store component, then every component in order; if one fails, stop those started and re-raise."""
        with self._lock:
            if self._state != "built":
                return
            started: list[Component] = []
            try:
                for component in [self.store, *self.components]:
                    component.start()
                    started.append(component)
            except BaseException:
                _stop_all(reversed(started))
                raise
            self._state = "started"

    def stop(self) -> None:
        """Stop every component in reverse order, then the store component, then close what this node opened.

        Components that were never started are stopped too (stop is idempotent). Idempotent.
        """
        with self._lock:
            if self._state == "stopped":
                return
            self._state = "stopped"
            _stop_all(reversed([self.store, *self.components]))
            if self.owns_relay:
                self.relay.close()
            if self._owns_backend:
                self.backend.close()

    close = stop

    def __enter__(self) -> "RelayNode":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_all(components: Iterable[Component]) -> None:
    """Stop each; a failing stop is logged and the others still stop."""
    for component in components:
        try:
            component.stop()
        except Exception:  # noqa: BLE001 - the remaining components must stop anyway
            log.exception("stopping the %s component failed", component.name)
