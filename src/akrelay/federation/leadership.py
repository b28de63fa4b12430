"""Who runs the sync loop: leadership (light: no HTTP client, so the backend can build it at start).

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
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from akrelay.federation.state import StateStore
from akrelay.leader import LeaderLock, LeaseKeeper, RedisLease

if TYPE_CHECKING:
    from akrelay.federation.witness import WitnessState

log = logging.getLogger("akrelay.federation")

LOCK_FILE = "federation.lock"
#: Seconds a sync lease lasts without renewal: how long a killed leader's node blocks a takeover.
LEASE_TTL = 15.0


def federation_lock(data_dir: str | os.PathLike[str]) -> LeaderLock:
    """The sync loop's leadership lock for ``data_dir``."""
    return LeaderLock(Path(data_dir) / LOCK_FILE)


class Leadership:
    """The right to run the sync loop: an ``flock`` per data directory, or a Redis lease per deployment.

    Built by the node's backend (:meth:`akrelay.backend.Backend.leadership`), which also
    says where the federation state of a term is kept (``open_state(on_fenced, token)``).
    """

    def __init__(self, lock: LeaderLock | RedisLease, where: str, *,
                 open_state: Callable[[Callable[[], None] | None, int | None], StateStore], shared: bool = False,
                 open_witness: Callable[[], WitnessState] | None = None) -> None:
        self.lock = lock
        #: the records of the checkpoints this relay cosigned as a witness (the backend's)
        self.open_witness = open_witness
        self.where = where
        #: the leader is elected across a deployment of nodes over one store (not in one data directory)
        self.shared = shared
        self._open_state = open_state
        self._keeper: LeaseKeeper | None = None
        self._down = False

    @property
    def token(self) -> int | None:
        """The fencing token of this term (Redis only)."""
        return getattr(self.lock, "token", None)

    def acquire(self) -> bool:
        """Whether we lead now; a Redis outage is "not now" (logged once), never an exception."""
        if isinstance(self.lock, LeaderLock):
            return self.lock.acquire()
        from akrelay.store.redis.client import is_outage, outage_reason

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
        return self._open_state(on_fenced, self.token)

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
        """Release the lease (the client is the backend's, closed with it)."""
        self.release()
