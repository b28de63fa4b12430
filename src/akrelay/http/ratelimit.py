"""Per-client-IP token buckets: local admission policy for writes and reads.

A refusal is ``rate_limited`` (429) with ``Retry-After``, which tells a client
the object was not judged invalid, only not admitted now (Knowledge §8.2). The
buckets live in each worker process; with ``--workers N`` a client can reach at
most N times the configured rate, which ``docs/operations.md`` states.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Callable


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
