"""Per-client-IP token buckets: local admission policy for writes and reads.

A refusal is ``rate_limited`` (429) with ``Retry-After``, which tells a client
the object was not judged invalid, only not admitted now (Knowledge §8.2).

With the embedded store the buckets live in each worker process; with
``--workers N`` a client can reach at most N times the configured rate, which
``docs/operations.md`` states. With ``--store redis://...`` every node and
worker of the deployment takes from one bucket per client kept in Redis
(:class:`RedisTokenBucket`, one atomic script per request), and falls back to
its local bucket while Redis is unreachable, so an outage never turns a request
into a 500 or a hang.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # annotations only
    import redis

log = logging.getLogger("akrelay.http")


class TokenBucket:
    """``rate`` tokens per second up to ``burst``, one bucket per key (client IP)."""

    __slots__ = ("rate", "burst", "_buckets", "_clock", "_max_keys")

    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 65536) -> None:
        self.rate = float(rate)
        self.burst = max(1, int(burst))
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._clock = clock
        self._max_keys = max_keys

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, key: str) -> float:
        """Consume one token for ``key``; return 0 if admitted, else seconds to wait."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        tokens, stamp = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - stamp) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            wait = 0.0
        else:
            self._buckets[key] = (tokens, now)
            wait = (1.0 - tokens) / self.rate
        if len(self._buckets) > self._max_keys:
            # Forget the least recently seen client: a full bucket is the state it would refill to.
            self._buckets.popitem(last=False)
        return wait


def retry_after_seconds(wait: float) -> int:
    """``Retry-After`` is whole seconds, never 0 for a refusal."""
    return max(1, math.ceil(wait))


#: Redis keys of the shared buckets: ``akrelay:rl:<bucket>:<client>`` (a hash: ``t`` tokens, ``s`` stamp).
KEY_PREFIX = "akrelay:rl:"

#: One round trip per request, atomic across nodes. The clock is Redis's own (``TIME``), so
#: nodes with skewed clocks still share one budget. A refusal writes nothing (the bucket it
#: would store is the one it read, refilled by the same formula), and a key expires when its
#: bucket would be full again, which is the state a missing key stands for.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local v = redis.call('HMGET', KEYS[1], 't', 's')
local tokens = tonumber(v[1])
local stamp = tonumber(v[2])
if tokens == nil or stamp == nil then
  tokens = burst
  stamp = now
end
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
if tokens < 1 then
  return string.format('%.17g', (1 - tokens) / rate)
end
tokens = tokens - 1
redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 's', string.format('%.17g', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1)
return '0'
"""

#: How long to wait for Redis on the request path: the limiter runs on the event loop.
REDIS_TIMEOUT = 0.25
#: After a failure, the local bucket decides for this long (doubling up to the max) before Redis is tried again.
RETRY_FIRST = 1.0
RETRY_MAX = 8.0


class RedisTokenBucket(TokenBucket):
    """:class:`TokenBucket` shared by every node and worker through Redis, same ``take``.

    While Redis is unreachable (or slower than :data:`REDIS_TIMEOUT`) the process's own
    bucket (the inherited one) decides: the deployment then admits at most the
    per-process rate times the number of processes, as without Redis, and no request
    fails or waits on the outage. Redis is tried again after :data:`RETRY_FIRST` seconds,
    backing off to :data:`RETRY_MAX` while it stays away; the change both ways is logged once.
    """

    __slots__ = ("name", "_key_prefix", "_script", "_outages", "_down_until", "_backoff")

    def __init__(self, client: "redis.Redis", name: str, rate: float, burst: int, *,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 65536) -> None:
        from akrelay.store.redis_client import OUTAGE_ERRORS

        super().__init__(rate, burst, clock=clock, max_keys=max_keys)
        self.name = name
        self._key_prefix = f"{KEY_PREFIX}{name}:"
        self._script = client.register_script(_TAKE)
        self._outages = OUTAGE_ERRORS
        self._down_until = 0.0
        self._backoff = 0.0

    @property
    def degraded(self) -> bool:
        """True while the local bucket decides (Redis failed recently)."""
        return self._backoff > 0

    def take(self, key: str) -> float:
        """Consume one token for ``key`` from the shared bucket; 0 if admitted, else seconds to wait."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        if now < self._down_until:
            return super().take(key)
        try:
            reply = self._script(keys=[self._key_prefix + key], args=[repr(self.rate), self.burst])
        except self._outages as exc:
            self._backoff = min(RETRY_MAX, self._backoff * 2) if self._backoff else RETRY_FIRST
            if self._backoff == RETRY_FIRST:
                log.warning("rate limit %r: Redis unreachable (%s); each worker limits on its own for now",
                            self.name, exc)
            self._down_until = now + self._backoff
            return super().take(key)
        if self._backoff:
            log.warning("rate limit %r: Redis is back; the limit is deployment-wide again", self.name)
            self._backoff = 0.0
        return float(reply)


class RateLimits(dict[str, TokenBucket]):
    """The ``write`` and ``read`` buckets of one worker, and the Redis client they share (if any)."""

    def __init__(self, buckets: dict[str, TokenBucket], client: "redis.Redis | None" = None) -> None:
        super().__init__(buckets)
        self._client = client

    def close(self) -> None:
        """Close the Redis connections (the app's shutdown); idempotent."""
        client, self._client = self._client, None
        if client is not None:
            client.close()


def limiter_client(url: str) -> "redis.Redis":
    """A Redis client for the limiter: waits of at most :data:`REDIS_TIMEOUT` (it runs on the event loop)."""
    from akrelay.store.redis_client import connect

    return connect(url, reply_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT, health_check_interval=0)


def open_rate_limits(settings: Any) -> RateLimits:
    """The buckets for ``settings``: per process, or shared through ``settings.store`` (a Redis URL).

    No connection is made here: the Redis client connects on the first request.
    """
    limits = {"write": (settings.write_rate, settings.write_burst),
              "read": (settings.read_rate, settings.read_burst)}
    url = getattr(settings, "store", "")
    if not url:
        return RateLimits({kind: TokenBucket(rate, burst) for kind, (rate, burst) in limits.items()})
    client = limiter_client(url)
    return RateLimits({kind: RedisTokenBucket(client, kind, rate, burst) for kind, (rate, burst) in limits.items()},
                      client)
