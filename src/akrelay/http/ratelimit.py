"""Per-client-IP token buckets: local admission policy for writes and reads.

A refusal is ``rate_limited`` (429) with ``Retry-After``, which tells a client
the object was not judged invalid, only not admitted now (Knowledge §8.2).

With the embedded store the buckets live in each worker process; with
``--workers N`` a client can reach at most N times the configured rate, which
``docs/operations.md`` states. With ``--store redis://...`` every node and
worker of the deployment takes from one bucket per client kept in Redis
(:class:`RedisTokenBucket`), and falls back to its local bucket while Redis is
unreachable, so an outage never turns a request into a 500 or a hang.

Requests take their token with ``await bucket.acquire(ip)``. On Redis that call
never blocks the event loop: the tokens asked for meanwhile on one worker go to
Redis together, in arrival order, in one atomic script call made on a thread of
the bucket's own; each token is still taken in Redis, so the limit stays exact
and deployment-wide (measured by ``bench/bench_cluster.py``: a synchronous
round trip per request on the loop halved a node's ingest).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable

from akrelay.observability.metrics import metrics

if TYPE_CHECKING:  # annotations only
    from akrelay.settings import Settings
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

    async def acquire(self, key: str) -> float:
        """:meth:`take` for the request path (a shared bucket overrides it so as not to block the loop)."""
        return self.take(key)

    def close(self) -> None:
        """Release what the bucket holds (nothing here)."""


def retry_after_seconds(wait: float) -> int:
    """``Retry-After`` is whole seconds, never 0 for a refusal."""
    return max(1, math.ceil(wait))


#: Redis keys of the shared buckets: ``akrelay:rl:<bucket>:<client>`` (a hash: ``t`` tokens, ``s`` stamp).
KEY_PREFIX = "akrelay:rl:"

#: One token per key in ``KEYS`` (a key may repeat), in order, atomically across nodes; the
#: reply is each one's wait ('0' when admitted). The clock is Redis's own (``TIME``), so
#: nodes with skewed clocks still share one budget. A refusal writes nothing (the bucket it
#: would store is the one it read, refilled by the same formula), and a key expires when its
#: bucket would be full again, which is the state a missing key stands for. The writes are not
#: propagated (``REPL_NONE``): a bucket is soft state, and with ``appendfsync always`` a token
#: written to the AOF would cost every request an fsync (measured: 4 ms a call on this machine,
#: half a node's ingest). After a Redis restart or a failover every bucket starts full.
_TAKE = """
redis.set_repl(redis.REPL_NONE)
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local out = {}
for k = 1, #KEYS do
  local v = redis.call('HMGET', KEYS[k], 't', 's')
  local tokens = tonumber(v[1])
  local stamp = tonumber(v[2])
  if tokens == nil or stamp == nil then
    tokens = burst
    stamp = now
  end
  tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
  if tokens < 1 then
    out[k] = string.format('%.17g', (1 - tokens) / rate)
  else
    tokens = tokens - 1
    redis.call('HSET', KEYS[k], 't', string.format('%.17g', tokens), 's', string.format('%.17g', now))
    redis.call('PEXPIRE', KEYS[k], math.ceil((burst - tokens) / rate * 1000) + 1)
    out[k] = '0'
  end
end
return out
"""

#: How long to wait for Redis on the request path: the limiter runs on the event loop.
REDIS_TIMEOUT = 0.25
#: After a failure, the local bucket decides for this long (doubling up to the max) before Redis is tried again.
RETRY_FIRST = 1.0
RETRY_MAX = 8.0
#: Most tokens one script call takes (bounds how long one call holds Redis).
TAKE_CHUNK = 256


class RedisTokenBucket(TokenBucket):
    """:class:`TokenBucket` shared by every node and worker through Redis, same ``take``.

    :meth:`acquire` (the request path) queues the key and awaits its answer: one
    thread of the bucket's own sends every key queued meanwhile on that event loop
    in one script call (:meth:`take_many`), one call at a time, so the loop never
    waits for Redis and a busy worker pays one round trip for many requests.

    While Redis is unreachable (or slower than :data:`REDIS_TIMEOUT`), or refuses the
    bucket's write (out of memory, cannot persist, a read-only replica), the process's own
    bucket (the inherited one) decides: the deployment then admits at most the
    per-process rate times the number of processes, as without Redis, and no request
    fails or waits on the outage. Redis is tried again after :data:`RETRY_FIRST` seconds,
    backing off to :data:`RETRY_MAX` while it stays away; the change both ways is logged once.
    """

    __slots__ = ("name", "_key_prefix", "_script", "_down_until", "_backoff", "_lock",
                 "_pending", "_flushing", "_tasks", "_executor")

    def __init__(self, client: "redis.Redis", name: str, rate: float, burst: int, *,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 65536,
                 prefix: str = KEY_PREFIX) -> None:
        super().__init__(rate, burst, clock=clock, max_keys=max_keys)
        self.name = name
        self._key_prefix = f"{prefix}{name}:"
        self._script = client.register_script(_TAKE)
        self._down_until = 0.0
        self._backoff = 0.0
        #: the local fallback is used from the loop and from the bucket's thread
        self._lock = threading.Lock()
        #: per event loop: keys waiting for the next call, and whether a call is under way
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[str, asyncio.Future[float]]]] = {}
        self._flushing: set[asyncio.AbstractEventLoop] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._executor: ThreadPoolExecutor | None = None

    @property
    def degraded(self) -> bool:
        """True while the local bucket decides (Redis failed recently)."""
        return self._backoff > 0

    def _local(self, keys: list[str]) -> list[float]:
        metrics().rate_local.labels(self.name).inc(len(keys))
        with self._lock:
            return [TokenBucket.take(self, key) for key in keys]

    def take(self, key: str) -> float:
        """Consume one token for ``key`` from the shared bucket; 0 if admitted, else seconds to wait."""
        return self.take_many([key])[0]

    def take_many(self, keys: list[str]) -> list[float]:
        """One token for each of ``keys`` in order, in one atomic Redis call (blocking); each one's wait."""
        if self.rate <= 0:
            return [0.0] * len(keys)
        now = self._clock()
        if now < self._down_until:
            return self._local(keys)
        try:
            reply = self._script(keys=[self._key_prefix + key for key in keys], args=[repr(self.rate), self.burst])
        except Exception as exc:
            from akrelay.store.redis.client import DOWN, outage_kind, outage_reason

            kind = outage_kind(exc)
            if kind is None:  # a bug; a full Redis (OOM), one that cannot persist or a replica is an outage
                raise
            self._backoff = min(RETRY_MAX, self._backoff * 2) if self._backoff else RETRY_FIRST
            if self._backoff == RETRY_FIRST:
                log.warning("rate limit %r: Redis %s (%s); each worker limits on its own for now", self.name,
                            "unreachable" if kind == DOWN else "refuses the bucket's write", outage_reason(exc))
            self._down_until = now + self._backoff
            return self._local(keys)
        if self._backoff:
            log.warning("rate limit %r: Redis is back; the limit is deployment-wide again", self.name)
            self._backoff = 0.0
        return [float(wait) for wait in reply]

    async def acquire(self, key: str) -> float:
        """:meth:`take` without blocking the event loop: batched with the other requests waiting meanwhile."""
        if self.rate <= 0:
            return 0.0
        if self._clock() < self._down_until:  # the outage back-off: decide here, no thread hop
            return self._local([key])[0]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        self._pending.setdefault(loop, []).append((key, future))
        if loop not in self._flushing:
            self._flushing.add(loop)
            task = loop.create_task(self._flush(loop))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send the keys queued on ``loop``, a call at a time, until none is left."""
        try:
            await asyncio.sleep(0)  # requests already read in this pass join the first call
            while self._pending.get(loop):
                batch = self._pending.pop(loop)
                for start in range(0, len(batch), TAKE_CHUNK):
                    part = batch[start:start + TAKE_CHUNK]
                    if self._executor is None:
                        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"akrelay-ratelimit-{self.name}")
                    try:
                        waits = await loop.run_in_executor(self._executor, self.take_many, [k for k, _ in part])
                    except Exception as exc:  # noqa: BLE001 - every waiter learns of it (an answer never hangs)
                        for _, future in part:
                            if not future.done():
                                future.set_exception(exc)
                        continue
                    for (_, future), wait in zip(part, waits):
                        if not future.done():
                            future.set_result(wait)
        finally:
            self._flushing.discard(loop)
            for _, future in self._pending.pop(loop, []):  # only if the loop is closing under us
                if not future.done():
                    future.cancel()

    def close(self) -> None:
        """Stop the bucket's thread (after the last request)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)


class RateLimits(dict[str, TokenBucket]):
    """The ``write`` and ``read`` buckets of one worker, and the Redis client they share (if any)."""

    def __init__(self, buckets: dict[str, TokenBucket], client: "redis.Redis | None" = None) -> None:
        super().__init__(buckets)
        self._client = client

    def close(self) -> None:
        """Close the Redis connections (the app's shutdown); idempotent."""
        for bucket in self.values():
            bucket.close()
        client, self._client = self._client, None
        if client is not None:
            client.close()


def limiter_client(url: str) -> "redis.Redis":
    """A Redis client for the limiter: waits of at most :data:`REDIS_TIMEOUT` (it runs on the event loop)."""
    from akrelay.store.redis.client import connect

    return connect(url, reply_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT, health_check_interval=0)


def rate_limit_budgets(settings: Settings) -> dict[str, tuple[float, int]]:
    """``kind -> (rate, burst)`` of the ``write``, ``read`` and ``knowql`` buckets (the backend builds them)."""
    return {"write": (settings.write_rate, settings.write_burst),
            "read": (settings.read_rate, settings.read_burst),
            "knowql": (settings.knowql.rate, settings.knowql.burst)}
