"""The sync scheduler: runs an engine's passes again and again, one thread per peer.

A pass (:meth:`akrelay.federation.sync.SyncEngine.sync_peer`) is one call that returns;
this module owns the threads and the timers around it: each enabled (and hinted) peer
gets a loop that runs a pass, then waits for the peer's interval or its back-off
(``retry_at``), and is woken early by the peer's push stream when it has one
(:class:`akrelay.federation.push.PushHub`). The leader's loop
(:class:`akrelay.federation.runner.BackgroundSync`) runs one scheduler per term.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from akrelay.leader import LeadershipLost
from akrelay.store.base import StoreUnavailable

if TYPE_CHECKING:  # annotations only
    from akrelay.federation.peers import Peer
    from akrelay.federation.sync import SyncEngine

log = logging.getLogger("akrelay.federation")


class SyncScheduler:
    """Runs ``engine``'s passes per peer until a stop event is set (:meth:`run`)."""

    def __init__(self, engine: SyncEngine, *, tick: float = 0.5) -> None:
        self.engine = engine
        #: how often the set of peers (hinted ones join while running) is looked at again
        self.tick = tick

    def run(self, stop: threading.Event) -> None:
        """One thread per peer so that a slow peer delays nobody else; returns when ``stop`` is set."""
        engine = self.engine
        threads: dict[str, threading.Thread] = {}
        while not stop.is_set():
            wanted = [(p, 0) for p in engine.peers if p.enabled] + list(engine.hinted.values())
            for peer, hop in wanted:
                if peer.origin not in threads:
                    t = threading.Thread(target=self._loop, args=(peer, hop, stop), name=f"akrelay-sync {peer.origin}",
                                         daemon=True)
                    threads[peer.origin] = t
                    t.start()
            stop.wait(self.tick)
        engine.push.close()
        for t in threads.values():
            t.join(timeout=5.0)

    def _loop(self, peer: Peer, hop: int, stop: threading.Event) -> None:
        engine = self.engine
        while not stop.is_set():
            wait = peer.interval
            try:
                result = engine.sync_peer(peer, hop=hop)
                st = engine.state.get(peer.origin)
                wait_ms = max(st.retry_at - engine.now_ms(), 0) if st.retry_at else 0
                wait = max(peer.interval, wait_ms / 1000.0)
                # a push-capable peer is subscribed to: its announcements end the wait below
                engine.push.after_pass(peer, engine.streams.get(peer.origin), max(st.checkpoint, st.resume_seq),
                                       st.peer_checkpoint, result.ok)
            except LeadershipLost:
                return  # another node leads now: its owner stops this loop (see federation.runner)
            except StoreUnavailable as exc:  # an outage, not a bug: no traceback, try again later
                log.warning("sync %s: %s (next try in %.1fs)", peer.origin, exc, wait)
            except Exception:  # never let one peer's bug end its loop silently
                log.exception("sync pass for %s crashed", peer.origin)
            # an announcement pulls at once, unless the peer is backing off (then it waits its turn)
            engine.push.wait(peer.origin, stop, wait, wakeable=wait <= peer.interval)
