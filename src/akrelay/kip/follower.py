"""The follower that keeps the nexus in step with the acceptance log.

Import never sits on the acceptance hot path: acceptance commits to the store and
returns; this follower tails ``store.iter_records(after_seq, limit)`` in its own
thread, imports each record as one transaction and persists the nexus together
with the seq it has caught up to, so a restart resumes instead of rebuilding.

The snapshot is a pickle of the nexus in the operator's data directory (trusted
local state, like the SQLite file beside it), written atomically. A snapshot for
another Space, of an unknown format, or ahead of the store is discarded and the
nexus is rebuilt from the log — which is always correct, because the nexus is a
deterministic function of the log.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any

from akrelay.kip.mapping import import_record
from akrelay.kip.nexus import Nexus

log = logging.getLogger("akrelay.kip")
SNAPSHOT_FORMAT = "akrelay-kip-nexus-1"
SNAPSHOT_FILE = "kip-nexus.pickle"
LOCK_CHUNK = 64


def snapshot_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / SNAPSHOT_FILE


def save_nexus(nexus: Nexus, path: str | os.PathLike[str]) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        pickle.dump({"format": SNAPSHOT_FORMAT, "space_id": nexus.space_id, "head": nexus.head, "nexus": nexus},
                    fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def load_nexus(path: str | os.PathLike[str], space_id: str, checkpoint: int) -> Nexus | None:
    """A persisted nexus for ``space_id`` no further ahead than the store, else ``None``."""
    try:
        with open(path, "rb") as fh:
            doc = pickle.load(fh)
    except FileNotFoundError:
        return None
    except Exception as exc:  # a torn or foreign file is discarded, never trusted
        log.warning("discarding unreadable KIP snapshot %s: %s", path, exc)
        return None
    if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT or doc.get("space_id") != space_id:
        return None
    nexus = doc.get("nexus")
    if not isinstance(nexus, Nexus) or nexus.head > checkpoint:
        return None
    return nexus


def rebuild(store: Any, space_id: str, batch: int = 2000) -> Nexus:
    """A fresh nexus from the whole acceptance log."""
    nexus = Nexus(space_id)
    follow(store, nexus, batch=batch)
    return nexus


def follow(store: Any, nexus: Nexus, *, batch: int = 2000, lock: Any = None, max_records: int | None = None) -> int:
    """Import every record after ``nexus.head``; returns how many records were read."""
    done = 0
    while max_records is None or done < max_records:
        size = batch if max_records is None else min(batch, max_records - done)
        records = store.iter_records(nexus.head, size)
        if not records:
            break
        if lock is not None:
            # short lock holds: a read waits for at most LOCK_CHUNK imports, not a batch
            for start in range(0, len(records), LOCK_CHUNK):
                with lock:
                    for record in records[start:start + LOCK_CHUNK]:
                        import_record(nexus, record)
        else:
            for record in records:
                import_record(nexus, record)
        done += len(records)
    return done


class KipFollower:
    """Tails the store into a runtime's nexus; persists to ``snapshot`` when given.

    Two locks: ``runtime.lock`` is held by readers and by each short chunk of
    imports; ``_mutate`` serializes the mutators (the follower thread, request-time
    catch-ups) and the snapshot writer. Pickling holds only ``_mutate``, so reads go
    on while a snapshot is written; a request-time catch-up that finds the follower
    busy for more than a second skips and reads the (consistent, slightly older) current snapshot.
    """

    def __init__(self, store: Any, runtime: Any, *, snapshot: str | os.PathLike[str] | None = None,
                 interval: float = 0.2, save_every: float = 30.0, writer_lock: Any = None) -> None:
        self.store, self.runtime = store, runtime
        self.snapshot = Path(snapshot) if snapshot is not None else None
        self.interval, self.save_every = interval, save_every
        # Several workers follow one data directory; only the holder of
        # ``writer_lock`` (a LeaderLock) writes the shared snapshot file.
        self.writer_lock = writer_lock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutate = threading.Lock()
        self._saved_head = runtime.nexus.head
        self._last_save = time.monotonic()

    def catch_up(self, *, timeout: float | None = None) -> int:
        """Import what the log has beyond the nexus head; ``-1`` if the follower stayed
        busy (importing or writing a snapshot) for longer than ``timeout`` seconds."""
        if not self._mutate.acquire(timeout=-1 if timeout is None else timeout):
            return -1
        try:
            count = follow(self.store, self.runtime.nexus, lock=self.runtime.lock)
            if self.snapshot is not None and time.monotonic() - self._last_save >= self.save_every:
                self._save_locked()
            return count
        finally:
            self._mutate.release()

    def save(self) -> None:
        with self._mutate:
            self._save_locked()

    def _save_locked(self) -> None:
        if self.snapshot is None or self.runtime.nexus.head == self._saved_head:
            return
        if self.writer_lock is not None and not self.writer_lock.acquire():
            return
        started = time.monotonic()
        save_nexus(self.runtime.nexus, self.snapshot)
        self._saved_head = self.runtime.nexus.head
        self._last_save = time.monotonic()
        # A large nexus takes seconds to pickle: keep snapshots to a small share
        # of the follower's time instead of a fixed cadence.
        self.save_every = max(self.save_every, 20 * (self._last_save - started))

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="akrelay-kip-follower", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        delay = self.interval
        while not self._stop.is_set():
            try:
                self.catch_up()
                delay = self.interval
            except Exception:  # keep following (the log is the truth and is re-read), backing off
                log.exception("KIP import failed; retrying in %.1f s", delay)
                delay = min(delay * 2, 30.0)
            self._stop.wait(delay)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        try:
            self.save()
        except OSError:  # the data directory went away; the log still rebuilds it
            log.warning("could not persist the KIP nexus to %s", self.snapshot)
