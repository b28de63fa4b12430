"""The single indexer: follows the acceptance log by ``seq`` into the Tantivy index.

Tantivy allows one writer per index, and Granian runs several worker
processes on one data directory. The worker that takes an exclusive
``flock`` on ``search/indexer.lock`` is the indexer; the others keep retrying
in the background (so a crashed indexer is replaced) and meanwhile only read.
The OS drops the lock when its holder dies, so no stale lock survives.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from akrelay.leader import LeaderLock
from akrelay.search.index import SearchIndex
from akrelay.store.base import Store
from akrelay.store.follow import BURST_RATE, LogFollower

log = logging.getLogger("akrelay.search")

LOCK_NAME = "indexer.lock"


#: The indexer is the leader of this lock (see :mod:`akrelay.leader`).
IndexerLock = LeaderLock


class Follower:
    """Copies records after the index position into the index, committing in batches."""

    def __init__(self, index: SearchIndex, store: Store, *, batch: int = 2000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.index = index
        self.store = store
        self.batch = batch
        self.clock = clock
        self.position = index.position()
        self._last_seq = self.position
        # Records committed beyond the position (before a crash) are indexed
        # again from the log; drop them first so none appears twice.
        index.discard_after(self.position)

    def step(self, max_records: int = 20_000) -> int:
        """Index what the log holds beyond the position (up to ``max_records``) and commit.

        The position advances only to a checkpoint read *before* a fetch that
        came back short: a checkpoint covers only committed records, so nothing
        at or below it was left out. Returns the number of records indexed.
        """
        added = 0
        position = self.position
        while added < max_records:
            checkpoint = self.store.checkpoint()
            records = self.store.iter_records(self._last_seq, self.batch)
            if records:
                self.index.add(records)
                added += len(records)
                self._last_seq = records[-1].seq
            if len(records) < self.batch:
                position = max(position, checkpoint)
                break
        if position != self.position or added:
            self.index.commit(position)
            self.position = position
            self._last_seq = max(self._last_seq, position)
        return added

    def catch_up(self) -> int:
        """Index until the position reaches the checkpoint seen at the start."""
        target = self.store.checkpoint()
        total = 0
        while self.position < target:
            total += self.step()
        return total


class IndexerThread(LogFollower):
    """Background loop of the elected indexer (see :class:`akrelay.store.follow.LogFollower`).

    The index is crash-safe, so stopping only ends the loop; the service closes the index.
    """

    thread_name = "akrelay-search-indexer"
    #: Shortest time between two commits that added records. Committing every few
    #: milliseconds under ingest made many tiny segments, and merging them cost
    #: Tantivy's merge thread ≈ 0.2 ms of CPU per accepted event; 0.25 s keeps
    #: the search lag well under its 1 s goal.
    min_step_interval = 0.25
    #: Hold off while the log grows this fast (records/s): see :class:`akrelay.store.follow.BurstGate`.
    burst_rate = BURST_RATE

    def __init__(self, follower: Follower, *, interval: float = 0.05) -> None:
        super().__init__(interval=interval)
        self.follower = follower

    def position(self) -> int:
        return self.follower.position

    def log_head(self) -> int:
        return self.follower.store.checkpoint()

    def step(self) -> int:
        return self.follower.step()
