"""The turn threads of one worker, shared fairly between clients.

A plain FIFO pool lets one client's burst (300 background turns, or LLM turns that wait
on a slow upstream) sit in front of every other client's turn. Here each client has its
own queue, and a free thread takes the next turn of the client with the fewest turns
running (among those, the one served least recently): a client asking one turn at a time is
served as soon as any thread frees, however many turns another client has queued.
How many a client may queue at all is :class:`akrelay.knowql.admission.Admission`'s job.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict, deque
from concurrent.futures import Future
from typing import Callable, TypeVar

_T = TypeVar("_T")


class FairPool:
    def __init__(self, threads: int, *, name: str = "akrelay-knowql") -> None:
        self.size, self.name = threads, name
        self.threads: list[threading.Thread] = []
        #: per client, its queued turns: how to cancel each (its future) and how to run it (into its future)
        self._queues: OrderedDict[str, deque[tuple[Callable[[], object], Callable[[], None]]]] = OrderedDict()
        self._running: Counter[str] = Counter()
        #: when each client with turns queued or running was last served (a newcomer: never, first)
        self._served: dict[str, int] = {}
        self._tick = 0
        self._cond = threading.Condition()
        self._closed = False

    def submit(self, client: str, fn: Callable[..., _T], *args: object) -> Future[_T]:
        future: Future[_T] = Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to the future's owner
                    future.set_exception(exc)

        with self._cond:
            if self._closed:
                raise RuntimeError("the turn pool is shut down")
            self._queues.setdefault(client, deque()).append((future.cancel, run))
            if len(self.threads) < self.size:
                thread = threading.Thread(target=self._work, name=f"{self.name}_{len(self.threads)}", daemon=True)
                self.threads.append(thread)
                thread.start()
            self._cond.notify()
        return future

    def _next(self) -> tuple[str, Callable[[], None]] | None:
        """The next job (called with the lock held): the least-served client's oldest turn."""
        if not self._queues:
            return None
        client = min(self._queues, key=lambda c: (self._running[c], self._served.get(c, -1)))
        queue = self._queues[client]
        _cancel, job = queue.popleft()
        if not queue:
            del self._queues[client]
        self._tick += 1
        self._served[client] = self._tick
        return client, job

    def _work(self) -> None:
        while True:
            with self._cond:
                picked = self._next()
                while picked is None:
                    if self._closed:
                        return
                    self._cond.wait()
                    picked = self._next()
                client, job = picked
                self._running[client] += 1
            try:
                job()
            finally:
                with self._cond:
                    self._running[client] -= 1
                    if self._running[client] <= 0:
                        del self._running[client]
                        if client not in self._queues:
                            self._served.pop(client, None)  # bounded: only clients with work are remembered

    def shutdown(self, *, cancel_futures: bool = True) -> None:
        """Refuse new turns, cancel queued ones (when asked) and let the threads end after their turn."""
        with self._cond:
            self._closed = True
            if cancel_futures:
                for queue in self._queues.values():
                    for cancel, _job in queue:
                        cancel()
                self._queues.clear()
            self._cond.notify_all()
