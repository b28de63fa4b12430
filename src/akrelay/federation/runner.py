"""Running the sync engine for a data directory: leadership, one pass, the loop.

Several processes may open one data directory (Granian workers, ``akrelay sync
--once``), but only one may replicate into it at a time, or two passes would
race on the same peer checkpoint. Leadership is an exclusive ``flock`` on
``federation.lock`` in the data directory: the kernel releases it when the
holder dies, so a killed leader is replaced by the next process that asks.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from akrelay.federation.peers import PeerFile, load_peers
from akrelay.leader import LeaderLock
from akrelay.federation.state import FederationState
from akrelay.federation.sync import PassResult, SyncEngine, SyncOptions

log = logging.getLogger("akrelay.federation")

LOCK_FILE = "federation.lock"


def federation_lock(data_dir: str | os.PathLike[str]) -> LeaderLock:
    """The sync loop's leadership lock for ``data_dir``."""
    return LeaderLock(Path(data_dir) / LOCK_FILE)


def sync_options(settings: Any) -> SyncOptions:
    return SyncOptions(
        own_origin=settings.origin,
        follow_hints=bool(settings.follow_hints),
        hint_hops=settings.hint_hops,
        hint_count=settings.hint_count,
    )


def build_engine(settings: Any, relay: Any, peer_file: PeerFile | None = None) -> SyncEngine:
    """An engine over ``relay`` with the peers of ``settings.peers`` and state in the data dir."""
    peer_file = peer_file if peer_file is not None else load_peers(settings.peers)
    state = FederationState.open_in(settings.data_dir)
    return SyncEngine(relay, state, peer_file.peers, sync_options(settings))


def sync_once(settings: Any, relay: Any, *, force: bool = True) -> list[PassResult]:
    """One pass over every enabled peer into ``relay``, as the data directory's leader.

    Raises ``RuntimeError`` when another process (a running ``serve``) leads.
    """
    peer_file = load_peers(settings.peers)
    lock = federation_lock(settings.data_dir)
    if not lock.acquire():
        raise RuntimeError(f"another process is already syncing {settings.data_dir} (see {lock.path})")
    try:
        engine = build_engine(settings, relay, peer_file)
        try:
            return engine.run_once(force=force)
        finally:
            engine.close()
            engine.state.close()
    finally:
        lock.release()


class BackgroundSync(threading.Thread):
    """The sync loop of ``akrelay serve``: waits for leadership, then runs until stopped.

    It replicates into the relay of its owner (:class:`akrelay.node.RelayNode`),
    so accepted events go through the same relay, and its commit listeners, as HTTP.
    """

    def __init__(self, settings: Any, relay: Any, *, retry: float = 2.0) -> None:
        super().__init__(name="akrelay-sync", daemon=True)
        self.settings = settings
        self.relay = relay
        self.retry = retry
        self.stop_event = threading.Event()
        self.lock = federation_lock(settings.data_dir)

    def run(self) -> None:
        while not self.stop_event.is_set():
            if self.lock.acquire():
                break
            self.stop_event.wait(self.retry)
        else:
            return
        try:
            peer_file = load_peers(self.settings.peers)
            engine = build_engine(self.settings, self.relay, peer_file)
            log.info("akrelay sync: leading %s with %d peer(s)", self.settings.data_dir, len(engine.peers))
            try:
                engine.run_forever(self.stop_event)
            finally:
                engine.close()
                engine.state.close()
        except Exception:
            log.exception("akrelay sync loop stopped")
        finally:
            self.lock.release()

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout)
