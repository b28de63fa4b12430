"""The trigram text indexer: one :class:`~akrelay.store.follow.LogFollower` for every store.

Both stores keep a trigram index of the log's search text off the commit path
(SQLite in a table of its own file, Redis in a node-local file,
:mod:`akrelay.store.redis.text`); what differs is only the *target*, the store's
``index_text(n)``, which takes up to ``n`` records past the index's position in
one transaction. The pacing rule is this one: trigram indexing costs far more CPU
per record than the rest of an acceptance, so while the log grows (the shared
checkpoint moved since the previous step) a step takes only :attr:`busy_batch`
records and the next waits :attr:`busy_pace`; while it is still, :attr:`batch`
records a step. Queries scan exactly whatever the index has not reached, so the
pace trades nothing but CPU.

The indexer is built with its store and started by whoever owns the store's
background work (``start()``); building it starts nothing.
"""

from __future__ import annotations

from typing import Protocol

from akrelay.store.follow import LogFollower


class TextTarget(Protocol):
    """What the indexer needs of a store."""

    def checkpoint(self) -> int: ...
    def index_text(self, max_records: int = 500) -> int: ...
    def text_index_position(self) -> int: ...


class TextIndexer(LogFollower):
    """Keeps ``target``'s trigram index caught up with its log (a background thread once started)."""

    def __init__(self, target: TextTarget, *, thread_name: str, interval: float, batch: int, busy_batch: int,
                 busy_pace: float, quiet_pace: float = 0.0) -> None:
        super().__init__(interval=interval)
        self.thread_name = thread_name
        self.target = target
        self.batch = batch
        self.busy_batch = busy_batch
        self.busy_pace = busy_pace
        self.quiet_pace = quiet_pace
        self._last = -1
        self._busy = False

    def position(self) -> int:
        return self.target.text_index_position()

    def step(self) -> int:
        checkpoint = self.target.checkpoint()
        self._busy, self._last = checkpoint != self._last and self._last >= 0, checkpoint
        return self.target.index_text(self.busy_batch if self._busy else self.batch)

    def step_interval(self) -> float:
        return self.busy_pace if self._busy else self.quiet_pace
