"""Wake event-stream tails when a turn's events change, instead of polling the store.

A writer (a turn thread, a cancel, an expiry) calls :meth:`Wakeups.notify` after its
transaction commits; a tail (on the event loop) takes :meth:`Wakeups.mark` before it
reads the store and then awaits :meth:`Wakeups.wait`, which returns at once if a notify
came in between, so no event is missed. The turn store owns one :class:`Wakeups`; on
Redis, :class:`akrelay.knowql.redis_store.RedisTurnStore` also publishes every change and
feeds what other nodes publish into it. Writes by another worker process of a SQLite
store are not seen here: tails fall back to a slow poll (:data:`akrelay.knowql.sse.FALLBACK_SECONDS`).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, defaultdict


class Wakeups:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: per watched query: how many tails watch it, and how often it changed meanwhile
        self._watchers: Counter[str] = Counter()
        self._versions: dict[str, int] = {}
        self._waiters: defaultdict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)

    def watch(self, query_id: str) -> None:
        """Start counting changes of ``query_id`` (a tail, before its first :meth:`mark`)."""
        with self._lock:
            self._watchers[query_id] += 1

    def unwatch(self, query_id: str) -> None:
        with self._lock:
            self._watchers[query_id] -= 1
            if self._watchers[query_id] <= 0:
                del self._watchers[query_id]
                self._versions.pop(query_id, None)
                self._waiters.pop(query_id, None)

    def mark(self, query_id: str) -> int:
        """The query's change count now (take it before reading the store)."""
        with self._lock:
            return self._versions.get(query_id, 0)

    def notify(self, query_id: str) -> None:
        """``query_id`` changed (thread-safe; never blocks). Unwatched queries cost nothing."""
        with self._lock:
            if query_id not in self._watchers:
                return
            self._versions[query_id] = self._versions.get(query_id, 0) + 1
            waiters = list(self._waiters.get(query_id, ()))
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop has closed
                pass

    async def wait(self, query_id: str, mark: int, timeout: float) -> None:
        """Return once ``query_id`` changed after ``mark``, or after ``timeout`` seconds."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            if self._versions.get(query_id, 0) != mark:
                return
            self._waiters[query_id].add(entry)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                waiters = self._waiters.get(query_id)
                if waiters is not None:
                    waiters.discard(entry)
