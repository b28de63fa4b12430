"""Where a relay keeps its state: one :class:`Backend`, chosen once from ``--store``.

The embedded backend (:class:`SqliteBackend`) keeps everything in the data directory;
the shared one (:class:`RedisBackend`) keeps the acceptance log and every
deployment-wide state in one Redis (the data directory holds only derived state).
:meth:`akrelay.node.RelayNode.open` builds the backend from the settings and every
component asks it, through the node, for what it keeps: the log store, the KnowQL
turn store, the federation state and sync leadership, the rate buckets. Nothing else
looks at ``settings.store``: a third backend is one class here and one entry in
:data:`BACKENDS` (keyed by the URL scheme of ``--store``).

Building a backend does no I/O: a Redis client connects on its first command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from akrelay.federation.leadership import LEASE_TTL, Leadership, federation_lock
from akrelay.federation.state import STATE_FILE, FederationState, StateStore
from akrelay.http.ratelimit import RateLimits, RedisTokenBucket, TokenBucket, limiter_client, rate_limit_budgets
from akrelay.knowql.store import SqliteTurnStore, TurnStore
from akrelay.protocol.options import ValidationOptions
from akrelay.relay.config import RelayConfig
from akrelay.settings import Settings, SettingsError, licence_allow_list

if TYPE_CHECKING:  # annotations only
    import redis

    from akrelay.federation.witness import WitnessState
    from akrelay.relay.core import Relay


def relay_config(settings: Settings) -> RelayConfig:
    """Translate operator settings into the service's ``RelayConfig``.

    Operator options of other areas (search, peers, KIP) stay in ``Settings``;
    they reach discovery through the components, not through here.
    """
    return RelayConfig(
        origin=settings.origin,
        max_envelope_bytes=settings.max_envelope_bytes,
        options=ValidationOptions(allow_legacy_retract=not settings.refuse_legacy_retract),
        licence_allowlist=licence_allow_list(settings),
    )


class Backend:
    """What one kind of store opens for a node; subclasses fill in each piece.

    ``shared``: the state is deployment-wide (several nodes over one store), so nothing
    that must be the same on every node may be created in one node's data directory.
    """

    #: the ``--store`` URL schemes served by this class (``""``: no ``--store``)
    schemes: ClassVar[tuple[str, ...]] = ()
    shared: ClassVar[bool] = False
    #: what it is, for messages (``"SQLite"``, ``"Redis"``)
    label: ClassVar[str] = ""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: ``--data``: where this node's leader lock lives
        self.data_dir: Path = settings.data_dir
        #: the relay's own directory (its derived state; ``None``: an in-memory relay), see :meth:`bind`
        self.relay_dir: Path | None = settings.data_dir

    def bind(self, relay: Relay) -> None:
        """Keep the node's per-relay files (turn store, federation state) next to ``relay``'s (in memory for none)."""
        self.relay_dir = relay.data_dir

    def open_relay(self) -> Relay:
        """The relay over this backend's log store; its background work starts with the store component."""
        raise NotImplementedError

    def turn_store(self) -> TurnStore:
        """KnowQL's sessions and turns (opened by the KnowQL component on start)."""
        raise NotImplementedError

    def leadership(self, ttl: float = LEASE_TTL) -> Leadership:
        """The right to run the sync loop (one leader per data directory or deployment)."""
        raise NotImplementedError

    def federation_state(self) -> StateStore | None:
        """The federation state for reading (status, ``/metrics``, witnessed checkpoints); ``None``: none kept yet."""
        raise NotImplementedError

    def witness_state(self) -> WitnessState:
        """Where this node keeps the checkpoints it cosigned as a witness (the log component's)."""
        raise NotImplementedError

    def rate_limits(self) -> RateLimits:
        """One worker's token buckets (``write``, ``read``, ``knowql``); closed by the app's shutdown."""
        raise NotImplementedError

    def close(self) -> None:
        """Close what the backend itself holds (the shared client); after every component stopped."""


class SqliteBackend(Backend):
    """The embedded store: ``relay.sqlite3`` and its neighbours in the data directory."""

    schemes = ("", "sqlite")
    label = "SQLite"

    def open_relay(self) -> Relay:
        from akrelay.relay.core import open_relay

        self.data_dir.mkdir(parents=True, exist_ok=True)
        return open_relay(self.data_dir, relay_config(self.settings), merkle_log=not self.settings.no_merkle_log)

    def turn_store(self) -> TurnStore:
        return SqliteTurnStore.in_data_dir(self.relay_dir)

    def leadership(self, ttl: float = LEASE_TTL) -> Leadership:
        return Leadership(federation_lock(self.data_dir), str(self.data_dir),
                          open_state=lambda on_fenced, token: FederationState.open_in(self.data_dir),
                          open_witness=self.witness_state)

    def federation_state(self) -> StateStore | None:
        if self.relay_dir is None or not (self.relay_dir / STATE_FILE).exists():
            return None  # reading must not create the file
        return FederationState.open_in(self.relay_dir)

    def witness_state(self) -> WitnessState:
        from akrelay.federation.witness import SqliteWitnessState

        return SqliteWitnessState.open_in(self.data_dir)

    def rate_limits(self) -> RateLimits:
        return RateLimits({kind: TokenBucket(rate, burst) for kind, (rate, burst) in
                           rate_limit_budgets(self.settings).items()})


class RedisBackend(Backend):
    """The shared store: the log and the deployment's state under ``--store-namespace`` in one Redis.

    One client (:attr:`client`) serves the log, the turn store, the federation state and
    the sync lease. The rate limiter has its own, with shorter waits, because it is asked
    on the event loop (:func:`akrelay.http.ratelimit.limiter_client`).
    """

    schemes = ("redis", "rediss", "unix")
    shared = True
    label = "Redis"

    def __init__(self, settings: Settings) -> None:
        from akrelay.store.redis.client import connect

        super().__init__(settings)
        self.url: str = settings.store
        self.namespace: str = settings.store_namespace
        self.client: redis.Redis = connect(self.url)  # no connection until the first command

    def prefix(self, area: str) -> str:
        from akrelay.store.redis.client import shared_prefix

        return shared_prefix(self.namespace, area)

    def open_relay(self) -> Relay:
        from akrelay.relay.core import open_shared_relay

        self.data_dir.mkdir(parents=True, exist_ok=True)
        relay = open_shared_relay(self.url, relay_config(self.settings), namespace=self.namespace,
                                  accept_weak_durability=self.settings.accept_weak_durability,
                                  data_dir=self.data_dir, client=self.client)
        self.bind(relay)
        return relay

    def bind(self, relay: Relay) -> None:
        """Also count the log's round trips and outages into ``/metrics`` (the store cannot import them)."""
        from akrelay.observability.metrics import StoreObserver
        from akrelay.store.redis.store import RedisStore

        super().bind(relay)
        if isinstance(relay.store, RedisStore) and not isinstance(relay.store.observer, StoreObserver):
            relay.store.observer = StoreObserver()

    def turn_store(self) -> TurnStore:
        from akrelay.knowql.redis_store import RedisTurnStore

        return RedisTurnStore(self.client, prefix=self.prefix("knowql"), owns_client=False)

    def leadership(self, ttl: float = LEASE_TTL) -> Leadership:
        from akrelay.federation.redis_state import RedisFederationState
        from akrelay.leader import RedisLease
        from akrelay.store.redis.client import describe

        prefix = self.prefix("sync")
        return Leadership(RedisLease(self.client, prefix, ttl=ttl), f"the deployment on {describe(self.url)}",
                          open_state=lambda on_fenced, token: RedisFederationState(
                              self.client, token=token, on_fenced=on_fenced, prefix=prefix), shared=True,
                          open_witness=self.witness_state)

    def federation_state(self) -> StateStore | None:
        from akrelay.federation.redis_state import RedisFederationState

        return RedisFederationState(self.client, prefix=self.prefix("sync"))

    def witness_state(self) -> WitnessState:
        from akrelay.federation.witness import RedisWitnessState

        return RedisWitnessState(self.client, self.prefix("witness"), owns_client=False)

    def rate_limits(self) -> RateLimits:
        client = limiter_client(self.url)
        prefix = self.prefix("rl")
        return RateLimits({kind: RedisTokenBucket(client, kind, rate, burst, prefix=prefix)
                           for kind, (rate, burst) in rate_limit_budgets(self.settings).items()}, client)

    def close(self) -> None:
        self.client.close()


#: ``--store`` URL scheme -> the backend serving it. A third backend is one more class and its schemes here.
BACKENDS: dict[str, type[Backend]] = {scheme: cls for cls in (SqliteBackend, RedisBackend) for scheme in cls.schemes}


def scheme_of(store: str) -> str:
    """The scheme of a ``--store`` value: ``redis`` for ``redis://h:p/0``, ``sqlite`` or ``""`` as given."""
    return store.split("://", 1)[0] if "://" in store else store


def known_stores() -> str:
    """The ``--store`` forms the registry serves, for an error message: ``empty, sqlite, redis://...``."""
    return ", ".join(["empty"] + [f"{scheme}://..." if scheme not in ("", "sqlite") else scheme
                                  for scheme in BACKENDS if scheme])


def backend_class(settings: Settings) -> type[Backend]:
    """The class of the backend ``settings.store`` names (its ``shared``, ``label``), building nothing.

    The settings keep ``--store`` as given; this is where it is parsed: an unknown scheme (or a
    scheme's name without ``://``) is a :class:`~akrelay.settings.SettingsError` naming the value and
    the forms that are served."""
    store = (settings.store or "").strip()
    scheme = scheme_of(store)
    cls = BACKENDS.get(scheme)
    if cls is None or (scheme not in ("", "sqlite") and "://" not in store):
        raise SettingsError(f"--store {store!r}: no backend serves it (use {known_stores()})")
    return cls


def backend_for(settings: Settings) -> Backend:
    """The backend ``settings.store`` names (built, nothing opened)."""
    return backend_class(settings)(settings)
