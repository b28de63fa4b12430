"""Running the sync engine as the leader: one pass over the peers (``sync --once``), and the background loop.

The pass is :mod:`akrelay.federation.sync`; the threads and timers that repeat it are
:mod:`akrelay.federation.scheduler`; this module adds leadership around them.

Only the leader runs them (who leads, on one data directory or across a deployment, and
how a stalled leader is fenced: :mod:`akrelay.federation.leadership`).
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from akrelay.federation.peers import PeerFile, load_peers
from akrelay.federation.scheduler import SyncScheduler
from akrelay.federation.state import FederationState, StateStore
from akrelay.federation.sync import PassResult, PeerMisbehaved, SyncEngine, SyncOptions
from akrelay.federation.leadership import LEASE_TTL, LOCK_FILE, Leadership, federation_lock

if TYPE_CHECKING:
    from akrelay.settings import Settings
    from akrelay.relay.core import Relay
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from akrelay.federation.peers import Peer
    from akrelay.federation.reconcile import Filter, ReconcileResult
    from akrelay.federation.witness import WitnessState
    from akrelay.store.recon_copy import KeptCopy

log = logging.getLogger("akrelay.federation")

__all__ = ["LEASE_TTL", "LOCK_FILE", "BackgroundSync", "Leadership", "build_engine", "federation_lock", "sync_once"]


def sync_options(settings: Settings) -> SyncOptions:
    return SyncOptions(
        own_origin=settings.origin,
        follow_hints=bool(settings.federation.follow_hints),
        hint_hops=settings.federation.hint_hops,
        hint_count=settings.federation.hint_count,
        reconcile=not settings.federation.no_reconcile,
        reconcile_interval=float(settings.federation.reconcile_interval),
        offer=not settings.federation.no_offer,
        offer_max=int(settings.federation.offer_max),
    )


def build_engine(settings: Settings, relay: Relay, peer_file: PeerFile | None = None,
                 state: StateStore | None = None, *, shared: bool = False,
                 open_witness: Callable[[], WitnessState] | None = None) -> SyncEngine:
    """An engine over ``relay`` with the peers of ``settings.federation.peers`` and ``state`` (default: the data dir's).

    ``open_witness``: the backend's witness records, so that a cosignature made during sync is the same
    record as one made through the add-checkpoint API (none: sync cosigns into the peer state only)."""
    peer_file = peer_file if peer_file is not None else load_peers(settings.federation.peers)
    state = state if state is not None else FederationState.open_in(settings.data_dir)
    witness = witness_for(settings, relay, shared=shared)
    engine = SyncEngine(relay, state, peer_file.peers, sync_options(settings), witness=witness)
    if witness is not None and open_witness is not None:
        from akrelay.federation.witness import Witness, known_logs

        engine.witness_log = Witness(witness[0], witness[1], known_logs(peer_file.peers), open_witness())
    return engine


def witness_for(settings: Settings, relay: Relay, *, shared: bool = False) -> tuple[str, Ed25519PrivateKey] | None:
    """Our log name and key, to cosign verified peer checkpoints; ``None`` when this node has no log key yet.

    ``shared`` (nodes over one store): no key in one node's data directory, only ``--log-key``."""

    from akrelay.relay.transparency import KEY_NAME, load_or_create_key, log_name

    key_file = settings.log_key
    data_dir = relay.data_dir
    if not key_file and not shared and data_dir is not None:
        key_file = str(Path(data_dir) / KEY_NAME)
    if not key_file or not Path(key_file).exists():
        return None
    try:
        return log_name(relay.config.origin), load_or_create_key(Path(key_file), create=False)
    except (OSError, ValueError) as exc:
        log.warning("no witness cosignatures: the log key %s cannot be read: %s", key_file, exc)
        return None


def sync_once(settings: Settings, relay: Relay, leadership: Leadership, *, force: bool = True) -> list[PassResult]:
    """One pass over every enabled peer into ``relay``, as the leader (of the data directory or deployment).

    Raises ``RuntimeError`` when another process (a running ``serve``) leads. Closes ``leadership``.
    """
    with _as_leader(settings, relay, load_peers(settings.federation.peers), leadership) as engine:
        return engine.run_once(force=force)


@contextmanager
def _as_leader(settings: Settings, relay: Relay, peer_file: PeerFile, leadership: Leadership) -> Iterator[SyncEngine]:
    """An engine for one command (``sync --once``, ``sync --reconcile``) while we lead; all closed after."""
    try:
        if not leadership.acquire():
            raise RuntimeError(f"another process is already syncing {leadership.where} (see {leadership.holder()})")
        leadership.keep(lambda reason: log.warning("akrelay sync: lost the sync lease: %s", reason))
        engine = build_engine(settings, relay, peer_file, leadership.open_state(), shared=leadership.shared,
                              open_witness=leadership.open_witness)
        try:
            yield engine
        finally:
            engine.close()
            engine.state.close()
    finally:
        leadership.close()


def reconcile_now(engine: SyncEngine, peer: Peer, progress: Callable[[ReconcileResult], None] | None = None, *,
                  window: Filter | None = None) -> ReconcileResult:
    """One reconciliation with ``peer`` on demand (``akrelay sync --reconcile``), narrowed by ``window``
    (a :class:`akrelay.federation.reconcile.Filter`); the state is saved."""
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
                                     progress=progress, window=window)
    except (PeerFetchError, PeerMisbehaved, ProtocolError, StoreUnavailable) as exc:
        result = ReconcileResult(peer.origin, error=str(exc) if not isinstance(exc, ProtocolError) else exc.message)
    finally:
        engine.state.put(st)
    assert result is not None
    return result


def reconcile_once(settings: Settings, relay: Relay, leadership: Leadership, *, only: str | None = None,
                   progress: Callable[[ReconcileResult], None] | None = None,
                   window: Filter | None = None) -> list[ReconcileResult]:
    """Reconcile with every enabled peer (or the one ``only`` names) as the leader; their results.

    ``akrelay sync --reconcile``: what each peer has that we lack is fetched and verified
    as sync does (:func:`akrelay.federation.reconcile.reconcile_now`). Raises
    ``RuntimeError`` when another process leads, ``ValueError`` for an unknown ``only``.
    """
    from akrelay.federation.peers import canonical_https_origin

    peer_file = load_peers(settings.federation.peers)
    peers = [p for p in peer_file.peers if p.enabled]
    if only is not None:
        origin = canonical_https_origin(only)
        peers = [p for p in peer_file.peers if p.origin == origin]
        if not peers:
            raise ValueError(f"--peer {only}: not a peer of {settings.federation.peers}")
    with _as_leader(settings, relay, peer_file, leadership) as engine:
        return [reconcile_now(engine, p, progress, window=window) for p in peers if p.origin != engine.own_origin]


class BackgroundSync(threading.Thread):
    """The sync loop of ``akrelay serve``: waits for leadership, then runs until stopped.

    It replicates into the relay of its owner (:class:`akrelay.node.RelayNode`),
    so accepted events go through the same relay, and its commit listeners, as HTTP.
    On Redis, a leader that loses its lease (or has a write refused as stale) stops
    syncing and goes back to waiting for the lease.
    """

    def __init__(self, settings: Settings, relay: Relay, leadership: Leadership, *, retry: float = 2.0,
                 kept: KeptCopy | None = None) -> None:
        """``kept``: the node's kept copy of the reconciliation set, which the engine's reconciliations read."""
        super().__init__(name="akrelay-sync", daemon=True)
        self.settings = settings
        self.relay = relay
        self.kept = kept
        self.retry = retry
        self.stop_event = threading.Event()
        self.leadership = leadership
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
            peer_file = load_peers(self.settings.federation.peers)
            state = self.leadership.open_state(
                on_fenced=lambda: lost("a federation state write was refused: a newer leader holds the lease"))
            engine = build_engine(self.settings, self.relay, peer_file, state, shared=self.leadership.shared,
                                  open_witness=self.leadership.open_witness)
            engine.kept_copy = self.kept
            log.info("akrelay sync: leading %s with %d peer(s)%s", self.leadership.where, len(engine.peers),
                     f" (fencing token {token})" if token is not None else "")
            try:
                SyncScheduler(engine).run(term)
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
