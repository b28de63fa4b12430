"""KnowQL admission: turns in flight and SSE tails per client, and a bounded turn queue per worker.

The request rate is the ``knowql`` token bucket (``akrelay.http.ratelimit``, shared in
Redis when the store is); this module bounds what one worker holds at once, so that one
client's load cannot slow every other client's turn (issue 24, item 3):

* a client (IP) may have at most ``knowql_inflight`` turns in flight here, background
  ones included: past that, 429 ``rate_limited``;
* the worker runs ``TURN_THREADS`` turns at once and queues at most ``knowql_queue``
  more: past that, 503 ``service_unavailable`` (the worker is full, not the client wrong);
* a client may hold at most ``knowql_tails`` event streams open: past that, 429.

Every refusal carries ``Retry-After``. Counts are per worker process.
"""

from __future__ import annotations

import threading
from collections import Counter

from akrelay.knowql.errors import KnowqlError

#: ``Retry-After`` seconds of each refusal.
RETRY_TURN = 1
RETRY_QUEUE = 2
RETRY_TAIL = 5


class Admission:
    def __init__(self, *, per_client: int, threads: int, queue: int, tails: int) -> None:
        self.per_client, self.capacity, self.max_tails = per_client, threads + queue, tails
        self.queue = queue
        self._turns: Counter[str] = Counter()
        self._tails: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        return sum(self._turns.values())

    def enter_turn(self, client: str) -> None:
        """Take a turn slot for ``client`` (429 past its cap, 503 when the worker's queue is full)."""
        with self._lock:
            if self._turns[client] >= self.per_client:
                raise _refusal(429, "rate_limited", f"this client already has {self.per_client} KnowQL turn(s) in "
                               f"progress on this worker; retry after {RETRY_TURN} s", RETRY_TURN)
            if sum(self._turns.values()) >= self.capacity:
                raise _refusal(503, "service_unavailable", f"KnowQL is at capacity here ({self.queue} turns "
                               f"already queued); retry after {RETRY_QUEUE} s", RETRY_QUEUE)
            self._turns[client] += 1

    def leave_turn(self, client: str) -> None:
        with self._lock:
            self._turns[client] -= 1
            if self._turns[client] <= 0:
                del self._turns[client]

    def enter_tail(self, client: str) -> None:
        with self._lock:
            if self._tails[client] >= self.max_tails:
                raise _refusal(429, "rate_limited", f"this client already has {self.max_tails} KnowQL event "
                               f"stream(s) open on this worker; retry after {RETRY_TAIL} s", RETRY_TAIL)
            self._tails[client] += 1

    def leave_tail(self, client: str) -> None:
        with self._lock:
            self._tails[client] -= 1
            if self._tails[client] <= 0:
                del self._tails[client]


def _refusal(status: int, code: str, message: str, retry_after: int) -> KnowqlError:
    error = KnowqlError(status, code, message)
    error.headers["Retry-After"] = str(retry_after)
    return error
