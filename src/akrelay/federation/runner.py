"""Running the sync engine: leadership, one pass, the loop.

Several processes may serve one deployment (Granian workers, ``akrelay sync
--once``, and with ``--store redis://...`` several relay nodes), but only one may
replicate at a time, or two passes would race on the same peer checkpoint.

* Embedded store: the leader is the process holding an exclusive ``flock`` on
  ``federation.lock`` in the data directory; the kernel releases it when the
  holder dies, so a killed leader is replaced by the next process that asks.
* Redis: the leader holds a lease in Redis (:class:`akrelay.leader.RedisLease`,
  ``akrelay:sync:leader``) renewed every ``ttl / 3`` seconds, with a fencing token
  drawn on each acquisition. The federation state lives in Redis too, and its writes
  carry the token: a leader that stalled past its lease and was replaced has its
  next write refused, and stops. Stopping releases the lease, so another node takes
  over within its retry interval rather than after the lease's expiry.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

from akrelay.federation.peers import PeerFile, load_peers
from akrelay.federation.state import FederationState, StateStore
from akrelay.federation.sync import PassResult, PeerMisbehaved, SyncEngine, SyncOptions
from akrelay.leader import LeaderLock, LeaseKeeper, RedisLease

log = logging.getLogger("akrelay.federation")

LOCK_FILE = "federation.lock"
#: Seconds a sync lease lasts without renewal: how long a killed leader's node blocks a takeover.
LEASE_TTL = 15.0


def federation_lock(data_dir: str | os.PathLike[str]) -> LeaderLock:
    """The sync loop's leadership lock for ``data_dir``."""
    return LeaderLock(Path(data_dir) / LOCK_FILE)


class Leadership:
    """The right to run the sync loop: an ``flock`` per data directory, or a Redis lease per deployment.

    Opens its Redis connection when built (it connects on first use) and closes it in :meth:`close`.
    """

    def __init__(self, settings: Any, *, ttl: float = LEASE_TTL) -> None:
        self.settings = settings
        self.url: str = getattr(settings, "store", "") or ""
        self._keeper: LeaseKeeper | None = None
        self._down = False
        if self.url:
            from akrelay.store.redis_client import connect, describe, shared_prefix

            self._client: Any = connect(self.url)
            self._prefix = shared_prefix(getattr(settings, "store_namespace", None), "sync")
            self.lock: LeaderLock | RedisLease = RedisLease(self._client, self._prefix, ttl=ttl)
            self.where = f"the deployment on {describe(self.url)}"
        else:
            self._client = None
            self.lock = federation_lock(settings.data_dir)
            self.where = str(settings.data_dir)

    @property
    def token(self) -> int | None:
        """The fencing token of this term (Redis only)."""
        return getattr(self.lock, "token", None)

    def acquire(self) -> bool:
        """Whether we lead now; a Redis outage is "not now" (logged once), never an exception."""
        if not self.url:
            return self.lock.acquire()
        from akrelay.store.redis_client import is_outage, outage_reason

        try:
            held = self.lock.acquire()
        except Exception as exc:
            if not is_outage(exc):
                raise
            if not self._down:
                log.warning("akrelay sync: cannot use Redis to elect the sync leader (%s); retrying", outage_reason(exc))
            self._down = True
            return False
        self._down = False
        return held

    def holder(self) -> str:
        """Who leads, for a refusal message."""
        if isinstance(self.lock, RedisLease):
            try:
                current = self.lock.current()
            except Exception:  # noqa: BLE001 - only for a message
                current = None
            return f"lease {self.lock.key}" + (f", held by {current[1]} with token {current[0]}" if current else "")
        return str(self.lock.path)

    def keep(self, on_lost: Callable[[str], None]) -> None:
        """Renew the lease until :meth:`release` (Redis only); ``on_lost`` when it is gone."""
        if isinstance(self.lock, RedisLease) and self._keeper is None:
            self._keeper = LeaseKeeper(self.lock, on_lost)
            self._keeper.start()

    def open_state(self, on_fenced: Callable[[], None] | None = None) -> StateStore:
        """The federation state, written under this term's token (Redis) or in the data directory."""
        if self._client is not None:
            from akrelay.federation.redis_state import RedisFederationState

            return RedisFederationState(self._client, token=self.token, on_fenced=on_fenced, prefix=self._prefix)
        return FederationState.open_in(self.settings.data_dir)

    def release(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()
        try:
            self.lock.release()
        except Exception as exc:  # noqa: BLE001 - Redis away: the lease expires by itself
            log.warning("akrelay sync: could not release the sync lease (%s); it expires in %.0f s",
                        exc, getattr(self.lock, "ttl", 0))

    def close(self) -> None:
        self.release()
        if self._client is not None:
            self._client.close()


def open_state(settings: Any) -> StateStore:
    """The federation state of ``settings`` for reading (status, metrics): the deployment's in
    Redis when ``settings.store`` is a Redis URL, else ``federation.sqlite3`` in the data directory."""
    url = getattr(settings, "store", "") or ""
    if url:
        from akrelay.federation.redis_state import RedisFederationState
        from akrelay.store.redis_client import shared_prefix

        return RedisFederationState.connect(url, prefix=shared_prefix(getattr(settings, "store_namespace", None), "sync"))
    return FederationState.open_in(settings.data_dir)


def sync_options(settings: Any) -> SyncOptions:
    return SyncOptions(
        own_origin=settings.origin,
        follow_hints=bool(settings.follow_hints),
        hint_hops=settings.hint_hops,
        hint_count=settings.hint_count,
        reconcile=not getattr(settings, "no_reconcile", False),
        reconcile_interval=float(getattr(settings, "reconcile_interval", 3600.0)),
    )


def build_engine(settings: Any, relay: Any, peer_file: PeerFile | None = None,
                 state: StateStore | None = None) -> SyncEngine:
    """An engine over ``relay`` with the peers of ``settings.peers`` and ``state`` (default: the data dir's)."""
    peer_file = peer_file if peer_file is not None else load_peers(settings.peers)
    state = state if state is not None else FederationState.open_in(settings.data_dir)
    return SyncEngine(relay, state, peer_file.peers, sync_options(settings), witness=witness_for(settings, relay))


def witness_for(settings: Any, relay: Any) -> tuple[str, Any] | None:
    """Our log name and key, to cosign verified peer checkpoints; ``None`` when this node has no log key yet."""
    from pathlib import Path

    from akrelay.service.transparency import KEY_NAME, load_or_create_key, log_name

    key_file = getattr(settings, "log_key", None)
    if not key_file and not getattr(settings, "store", "") and getattr(relay, "data_dir", None) is not None:
        key_file = str(Path(relay.data_dir) / KEY_NAME)
    if not key_file or not Path(key_file).exists():
        return None
    try:
        return log_name(relay.config.origin), load_or_create_key(Path(key_file), create=False)
    except (OSError, ValueError) as exc:
        log.warning("no witness cosignatures: the log key %s cannot be read: %s", key_file, exc)
        return None


def sync_once(settings: Any, relay: Any, *, force: bool = True) -> list[PassResult]:
    """One pass over every enabled peer into ``relay``, as the leader (of the data directory or deployment).

    Raises ``RuntimeError`` when another process (a running ``serve``) leads.
    """
    peer_file = load_peers(settings.peers)
    leadership = Leadership(settings)
    try:
        if not leadership.acquire():
            raise RuntimeError(f"another process is already syncing {leadership.where} (see {leadership.holder()})")
        leadership.keep(lambda reason: log.warning("akrelay sync: lost the sync lease: %s", reason))
        engine = build_engine(settings, relay, peer_file, leadership.open_state())
        try:
            return engine.run_once(force=force)
        finally:
            engine.close()
            engine.state.close()
    finally:
        leadership.close()


def reconcile_now(engine: SyncEngine, peer: Any, progress: Callable[[Any], None] | None = None) -> Any:
    """One reconciliation with ``peer`` on demand (``akrelay sync --reconcile``); the state is saved."""
    from akrelay.federation.reconcile import ReconcileResult, maybe_reconcile
    from akrelay.federation.transport import PeerFetchError
    from akrelay.protocol.errors import ProtocolError
    from akrelay.store.base import StoreUnavailable

    st = engine.state.get(peer.origin)
    pass_result = PassResult(peer.origin)
    try:
        with engine.open_transport(peer) as transport:
            endpoints = engine.discover(peer, transport)
            result = maybe_reconcile(engine, peer, transport, endpoints, st, pass_result, force=True,
                                     progress=progress)
    except (PeerFetchError, PeerMisbehaved, ProtocolError, StoreUnavailable) as exc:
        result = ReconcileResult(peer.origin, error=str(exc) if not isinstance(exc, ProtocolError) else exc.message)
    finally:
        engine.state.put(st)
    assert result is not None
    return result


def reconcile_once(settings: Any, relay: Any, *, only: str | None = None,
                   progress: Callable[[Any], None] | None = None) -> list[Any]:
    """Reconcile with every enabled peer (or the one ``only`` names) as the leader; their results.

    ``akrelay sync --reconcile``: what each peer has that we lack is fetched and verified
    as sync does (:func:`akrelay.federation.reconcile.reconcile_now`). Raises
    ``RuntimeError`` when another process leads, ``ValueError`` for an unknown ``only``.
    """
    from akrelay.federation.peers import canonical_https_origin

    peer_file = load_peers(settings.peers)
    peers = [p for p in peer_file.peers if p.enabled]
    if only is not None:
        origin = canonical_https_origin(only)
        peers = [p for p in peer_file.peers if p.origin == origin]
        if not peers:
            raise ValueError(f"--peer {only}: not a peer of {settings.peers}")
    leadership = Leadership(settings)
    try:
        if not leadership.acquire():
            raise RuntimeError(f"another process is already syncing {leadership.where} (see {leadership.holder()})")
        leadership.keep(lambda reason: log.warning("akrelay sync: lost the sync lease: %s", reason))
        engine = build_engine(settings, relay, peer_file, leadership.open_state())
        try:
            return [reconcile_now(engine, p, progress) for p in peers if p.origin != engine.own_origin]
        finally:
            engine.close()
            engine.state.close()
    finally:
        leadership.close()


class BackgroundSync(threading.Thread):
    """The sync loop of ``akrelay serve``: waits for leadership, then runs until stopped.

    It replicates into the relay of its owner (:class:`akrelay.node.RelayNode`),
    so accepted events go through the same relay, and its commit listeners, as HTTP.
    On Redis, a leader that loses its lease (or has a write refused as stale) stops
    syncing and goes back to waiting for the lease.
    """

    def __init__(self, settings: Any, relay: Any, *, retry: float = 2.0, lease_ttl: float = LEASE_TTL) -> None:
        super().__init__(name="akrelay-sync", daemon=True)
        self.settings = settings
        self.relay = relay
        self.retry = retry
        self.stop_event = threading.Event()
        self.leadership = Leadership(settings, ttl=lease_ttl)
        self.lock = self.leadership.lock
        self._term: threading.Event | None = None
        #: Terms led so far (a new one after each lost lease), for tests and logs.
        self.terms = 0

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                if not self.leadership.acquire():
                    self.stop_event.wait(self.retry)
                    continue
                if not self._lead():
                    return
                self.stop_event.wait(self.retry)
        except Exception:  # e.g. Redis refusing our credentials: a bug to fix, said once
            log.exception("akrelay sync: the leader election failed; the sync loop stopped")
        finally:
            self.leadership.close()

    def _lead(self) -> bool:
        """One term as leader, until stopped or deposed; ``False`` when the loop broke (logged)."""
        term = self._term = threading.Event()
        if self.stop_event.is_set():
            term.set()
        self.terms += 1
        token = self.leadership.token

        def lost(reason: str) -> None:
            if not term.is_set():
                log.warning("akrelay sync: no longer leading %s (token %s): %s; waiting for the lease again",
                            self.leadership.where, token, reason)
                term.set()

        self.leadership.keep(lost)
        try:
            peer_file = load_peers(self.settings.peers)
            state = self.leadership.open_state(
                on_fenced=lambda: lost("a federation state write was refused: a newer leader holds the lease"))
            engine = build_engine(self.settings, self.relay, peer_file, state)
            log.info("akrelay sync: leading %s with %d peer(s)%s", self.leadership.where, len(engine.peers),
                     f" (fencing token {token})" if token is not None else "")
            try:
                engine.run_forever(term)
            finally:
                engine.close()
                engine.state.close()
        except Exception:
            log.exception("akrelay sync loop stopped")
            return False
        finally:
            self.leadership.release()
        return True

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        term = self._term
        if term is not None:
            term.set()
        if self.is_alive():
            self.join(timeout)
