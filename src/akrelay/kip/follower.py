"""The importer: a follower that keeps the nexus in step with the acceptance log.

Import never sits on the acceptance hot path: acceptance commits to the store and
returns; the follower tails ``store.iter_records(after_seq, limit)`` in its own
thread and imports each record as one KIP transaction.

With the on-disk nexus (:mod:`akrelay.kip.nexus_sqlite`) exactly one process per
data directory imports: the holder of the importer's leader lock. Its position is
the nexus head, committed in the same SQLite transaction as the records of each
batch, so a killed importer leaves the nexus of a prefix of the log and the next
leader (another worker, or the restarted relay) resumes from there. Every other
process only reads the file. With the in-memory nexus (tests, a relay without a
data directory) the follower imports into the runtime's own nexus.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from akrelay.kip.mapping import import_record
from akrelay.kip.nexus import Nexus, NexusBase
from akrelay.store.base import Store
from akrelay.store.follow import BURST_RATE, LogFollower

if TYPE_CHECKING:
    from akrelay.kip.runtime import KipRuntime
    from akrelay.leader import LeaderLock

log = logging.getLogger("akrelay.kip")
#: records per lock hold of the in-memory nexus: a read waits for at most this many imports
LOCK_CHUNK = 64
#: records per SQLite transaction of the on-disk nexus (a commit makes them visible to every worker).
#: Each record adds about five elements to a dozen indexes with scattered keys, so a commit writes
#: roughly one page per insert; larger transactions share more pages (118k records: 2,937 events
#: per CPU second at 500, 3,303 at 2,000). At ~3,000/s a transaction lasts under a second, which
#: bounds both the visibility delay in a backlog and the wait of a graceful stop.
DISK_BATCH = 2000
#: a request-time catch-up imports at most this many records; a longer backlog is the thread's job
REQUEST_CATCH_UP = 2000


def rebuild(store: Store, space_id: str, batch: int = 2000) -> Nexus:
    """A fresh in-memory nexus from the whole acceptance log."""
    nexus = Nexus(space_id)
    follow(store, nexus, batch=batch)
    return nexus


def follow(store: Store, nexus: NexusBase, *, batch: int = 2000, lock: contextlib.AbstractContextManager[object] | None = None,
           chunk: int | None = None, max_records: int | None = None, stop: threading.Event | None = None) -> int:
    """Import every record after ``nexus.head``; returns how many records were read.

    Records are imported ``chunk`` at a time, each chunk in one ``nexus.batch()``
    (one durable transaction on disk) and, when ``lock`` is given, under it.
    """
    if chunk is None:
        chunk = LOCK_CHUNK if lock is not None else DISK_BATCH
    done = 0
    while max_records is None or done < max_records:
        if stop is not None and stop.is_set():
            break
        size = batch if max_records is None else min(batch, max_records - done)
        records = store.iter_records(nexus.head, size)
        if not records:
            break
        for start in range(0, len(records), chunk):
            if stop is not None and stop.is_set():  # a graceful stop waits for one chunk at most
                return done
            with lock if lock is not None else contextlib.nullcontext(), nexus.batch():
                for record in records[start:start + chunk]:
                    import_record(nexus, record)
            done += len(records[start:start + chunk])
    return done


class KipFollower(LogFollower):
    """Keeps a runtime's nexus current: imports (memory, or as the on-disk leader) or waits for the leader.

    ``open_writer`` (disk mode) opens the importer's own connection to the nexus file;
    it is called once this process holds ``leader`` (a :class:`akrelay.leader.LeaderLock`).
    Without it, the follower imports into ``runtime.nexus`` under ``runtime.lock``.
    ``_mutate`` serializes the importing callers (the thread, request-time catch-ups).
    ``importer=False`` (disk mode): never import here, only wait for the process that does.
    """

    thread_name = "akrelay-kip-importer"
    #: After a step that imported, wait this long before the next one even when woken:
    #: under ingest, commits wake the importer constantly, and importing every few
    #: milliseconds would cost a nexus transaction per tiny batch (the poll-only
    #: importer batched 0.2 s of acceptances). An idle importer still reacts at once.
    min_step_interval = 0.2
    #: Hold off while the log grows this fast (records/s): see :class:`akrelay.store.follow.BurstGate`.
    burst_rate = BURST_RATE

    def __init__(self, store: Store, runtime: KipRuntime, *, open_writer: Callable[[], NexusBase] | None = None,
                 leader: LeaderLock | None = None, interval: float = 0.2, importer: bool = True) -> None:
        super().__init__(interval=interval)
        self.importer = importer or open_writer is None
        self.store, self.runtime = store, runtime
        self._open_writer = open_writer
        self.leader = leader
        self.writer: NexusBase | None = None
        self._refused: str | None = None
        self._mutate = threading.Lock()

    @property
    def disk(self) -> bool:
        return self._open_writer is not None

    def _lead(self) -> bool:
        """Whether this process imports: the memory mode always; on disk, the leader with an open writer."""
        if not self.disk:
            return True
        if self.writer is not None:
            return True
        if not self.importer:
            return False
        if self._refused is not None or (self.leader is not None and not self.leader.acquire()):
            return False
        try:
            self.writer = self._open_writer()  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - e.g. a nexus of an unknown format: refuse clearly, once
            self._refused = str(exc)
            log.error("KIP importer: %s", exc)
            return False
        log.info("KIP importer: this process (%s) imports into %s at head %d",
                 getattr(self.leader, "path", "-"), getattr(self.writer, "path", "-"), self.writer.head)
        return True

    def catch_up(self, *, timeout: float | None = None, max_records: int | None = None) -> int:
        """Bring the nexus to the store's checkpoint; records imported here, ``-1`` if that did not happen
        within ``timeout`` seconds (the importer was busy, or, in a reader process, the leader is behind).

        A caller with a ``timeout`` is a request: it imports at most ``REQUEST_CATCH_UP``
        records itself and leaves a longer backlog to the thread.
        """
        if timeout is not None and max_records is None:
            max_records = REQUEST_CATCH_UP
        if not self._lead():
            return self._wait_for_leader(timeout)
        if not self._mutate.acquire(timeout=-1 if timeout is None else timeout):
            return -1
        try:
            if self.writer is not None:
                return follow(self.store, self.writer, max_records=max_records)
            return follow(self.store, self.runtime.nexus, lock=self._runtime_mutex(), max_records=max_records)
        finally:
            self._mutate.release()

    def _runtime_mutex(self) -> contextlib.AbstractContextManager[object]:
        lock = self.runtime.lock
        return getattr(lock, "mutex", lock)

    def _wait_for_leader(self, timeout: float | None) -> int:
        target = self.store.checkpoint()
        deadline = time.monotonic() + (5.0 if timeout is None else timeout)
        while True:
            try:
                if self.runtime.nexus.head >= target:
                    return 0
            except Exception:  # noqa: BLE001 - the file is not there yet: the leader is creating it
                pass
            if time.monotonic() >= deadline or self.stopping:
                return -1
            time.sleep(0.01)

    def notify(self) -> None:
        """Wake the importer; a process that does not import ignores commits (it retries leadership by polling)."""
        if self.writer is not None or not self.disk:
            super().notify()

    def position(self) -> int:
        """The nexus head: committed with the records of each import batch."""
        target = self.writer if self.writer is not None else self.runtime.nexus
        return int(target.head)

    def log_head(self) -> int | None:
        """The log's head while this process imports (else ``None``: nothing to hold off)."""
        if self.disk and self.writer is None:
            return None
        return int(self.store.checkpoint())

    def step(self) -> int:
        """The thread's step: import what is new, as the importer (else nothing: another process leads).

        A step stops at the head it saw first, so an importer slower than a long burst
        still returns between steps (to its pacing, its burst gate and a graceful stop).
        """
        if not self._lead() or not self._mutate.acquire(timeout=self.interval):
            return 0
        try:
            target = self.writer if self.writer is not None else self.runtime.nexus
            lock = None if self.writer is not None else self._runtime_mutex()
            pending = int(self.store.checkpoint()) - int(target.head)
            return follow(self.store, target, lock=lock, stop=self._halt, max_records=max(pending, 1))
        finally:
            self._mutate.release()

    def release(self) -> None:
        """Release the file and the leadership (nothing to write: each batch is durable)."""
        with self._mutate:
            if self.writer is not None:
                self.writer.close()
                self.writer = None
            if self.leader is not None:
                self.leader.release()
        self.runtime.nexus.close()


def legacy_snapshot(data_dir: Path) -> Path:
    """Where releases before the on-disk nexus kept a pickled snapshot (deleted on sight)."""
    return Path(data_dir) / "kip-nexus.pickle"
