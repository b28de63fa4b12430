"""One leader per data directory (or, on Redis, per deployment) for work that must not run twice.

Granian runs several worker processes on one data directory, and some jobs
must have exactly one runner: the Tantivy writer (one writer per index), the
sync loop (one writer per peer checkpoint), the KIP snapshot writer, the Redis
store's node-local text index (:mod:`akrelay.store.redis.text`). The
process that holds an exclusive, non-blocking ``flock`` on the job's lock file
is its leader; the kernel drops the lock when the holder dies, so a killed
leader is replaced by the next process that asks and no stale lock survives.
That lock, :class:`LeaderLock`, is written once in :mod:`akrelay.store.leader_lock`
(the store elects its own text-index writer with it, and this module imports the store).

Several relay nodes sharing one Redis (``--store redis://...``) elect the sync
loop's leader across the deployment instead, with a lease and a fencing token
(:class:`RedisLease`, kept alive by :class:`LeaseKeeper`).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable

from akrelay.store.leader_lock import LeaderLock

if TYPE_CHECKING:
    import redis

__all__ = ["LEASE_KEY", "TOKEN_KEY", "LeaderLock", "LeadershipLost", "LeaseKeeper", "RedisLease"]


class LeadershipLost(Exception):
    """This process led, and no longer does: a fenced write was refused, or the lease was lost."""


#: Redis keys of a lease under ``prefix``: the lease itself and its fencing-token counter.
LEASE_KEY, TOKEN_KEY = "leader", "token"

#: Take the lease if nobody holds it: ``SET NX PX``, then a new fencing token (``INCR``) written into it.
_ACQUIRE = """
if not redis.call('SET', KEYS[1], 'acquiring', 'NX', 'PX', ARGV[2]) then
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return token
"""
#: Extend our lease; if it lapsed and nobody took it since (our token is still the last), take it back.
_RENEW = """
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not value and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisLease:
    """One leader per deployment: a lease in Redis with a fencing token (the sync loop's election).

    :meth:`acquire` sets the lease with ``SET NX PX`` and draws a new token from a counter
    (``INCR``), so every acquisition has a larger token than the one before; writes made on
    behalf of the leader carry it, and whatever they write to refuses a token that is no
    longer the counter's value (:class:`akrelay.federation.redis_state.RedisFederationState`).
    The holder renews well before expiry (:class:`LeaseKeeper`); a holder that stops
    renewing (killed, stalled) loses the lease after ``ttl`` seconds, and :meth:`release`
    hands it over at once. The same ``acquire`` / ``held`` / ``release`` as :class:`LeaderLock`.
    """

    def __init__(self, client: redis.Redis, prefix: str, *, ttl: float = 15.0, holder: str | None = None) -> None:
        self.client = client
        self.key, self.token_key = prefix + LEASE_KEY, prefix + TOKEN_KEY
        self.ttl = ttl
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.token: int | None = None
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl * 1000))

    @property
    def _value(self) -> str:
        return f"{self.token} {self.holder}"

    @property
    def held(self) -> bool:
        return self.token is not None

    def acquire(self) -> bool:
        """Take the lease if it is free; ``True`` when we hold it (``token`` is then set)."""
        if self.token is not None:
            return self.renew()
        token = int(self._acquire(keys=[self.key, self.token_key], args=[self.holder, self._ttl_ms]))
        if token:
            self.token = token
        return bool(token)

    def renew(self) -> bool:
        """Extend the lease by ``ttl``; ``False`` (and no longer held) when another holder has it."""
        if self.token is None:
            return False
        if self._renew(keys=[self.key, self.token_key], args=[self._value, self._ttl_ms, self.token]):
            return True
        self.token = None
        return False

    def release(self) -> None:
        """Give the lease up now (if still ours), so another node takes over without waiting for expiry."""
        if self.token is not None:
            value, self.token = self._value, None
            self._release(keys=[self.key], args=[value])

    def current(self) -> tuple[int, str] | None:
        """The lease's holder and token as Redis has them (for status and logs), or ``None``."""
        value = self.client.get(self.key)
        if not isinstance(value, bytes) or b" " not in value:  # the client does not decode replies
            return None
        token, holder = value.decode().split(" ", 1)
        return int(token), holder


class LeaseKeeper(threading.Thread):
    """Renews a :class:`RedisLease` every ``ttl / 3`` seconds; calls ``on_lost`` once it is gone.

    The lease counts as lost when a renewal is refused (another holder), or when Redis
    has not confirmed a renewal for ``ttl`` seconds (it may have expired and been taken).
    """

    def __init__(self, lease: RedisLease, on_lost: Callable[[str], None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name="akrelay-lease", daemon=True)
        self.lease = lease
        self.on_lost = on_lost
        self.clock = clock
        self._halt = threading.Event()

    def run(self) -> None:
        from akrelay.store.redis.client import is_outage

        confirmed = self.clock()
        while not self._halt.wait(self.lease.ttl / 3):
            try:
                if not self.lease.renew():
                    self.on_lost("another node holds the lease now")
                    return
                confirmed = self.clock()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                if self.clock() - confirmed >= self.lease.ttl:
                    self.lease.token = None
                    self.on_lost(f"the lease could not be renewed for {self.lease.ttl:.0f} s ({exc})")
                    return

    def stop(self, timeout: float = 5.0) -> None:
        self._halt.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout)
