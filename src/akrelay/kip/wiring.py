"""Wiring a KIP runtime to a relay's store and data directory.

Used by the HTTP route provider and the CLI: load the operator configuration,
open the data directory's nexus (or an in-memory one), and start the follower.
"""

from __future__ import annotations

import gc
import hashlib
import hmac
import os
from pathlib import Path
from typing import Callable, TypedDict

from akrelay.kip.budget import DEFAULT_BUDGET_MS
from akrelay.kip.config import KipConfig
from akrelay.kip.follower import KipFollower, follow as follow_log, legacy_snapshot
from akrelay.kip.nexus_sqlite import (
    FORMAT_VERSION, SqliteNexus, create_file, nexus_path, open_writer, stored_space,
)
from akrelay.kip.package import SchemaEnvironment
from akrelay.kip.runtime import KipRuntime
from akrelay.leader import LeaderLock
from akrelay.store.base import Store
from akrelay.store.capabilities import MetadataHolding

CURSOR_SECRET_KEY = "relay.cursor_secret"
FREEZE_AFTER = 10_000
#: the flock whose holder is the one importer of a data directory's nexus
IMPORTER_LOCK = "kip-importer.lock"
MEMORY, DISK = "memory", "sqlite"
#: ``memory`` makes a relay with a data directory keep a private in-memory nexus per worker
#: (the design before the on-disk nexus; for comparison benchmarks and debugging)
BACKEND_ENV = "AKRELAY_KIP_NEXUS"


def cursor_secret(store: object) -> bytes:
    """A KIP cursor key derived from the relay's persisted secret, so all workers agree."""
    base = store.meta_get(CURSOR_SECRET_KEY) if isinstance(store, MetadataHolding) else None
    if base is None:
        return os.urandom(32)
    return hmac.new(base, b"akrelay-kip", hashlib.sha256).digest()


def withheld_predicate(store: Store) -> Callable[[str], bool]:
    """``event_id -> bool``: the operator's withholding, read live from the store."""
    def withheld(event_id: str) -> bool:
        record = store.get(event_id)
        return record is not None and record.withheld
    return withheld


def open_runtime(store: Store, data_dir: str | os.PathLike[str] | None, *, origin: str, follow: bool = True,
                 backend: str | None = None, config: KipConfig | None = None, environment: SchemaEnvironment | None = None,
                 budget_ms: int | None = DEFAULT_BUDGET_MS, importer: bool = True) -> tuple[KipRuntime, KipFollower]:
    """A runtime over ``store`` and the follower that keeps its nexus current.

    With a data directory the nexus is the shared file ``<data>/kip-nexus.sqlite3``:
    this process reads it, and imports into it only while it holds the importer
    lock. ``backend="memory"`` (or no data directory) keeps a private in-memory
    nexus built from the log (tests, embedded use; ``AKRELAY_KIP_NEXUS=memory``).
    ``config`` and ``environment`` are read from their files unless the caller
    loaded them already (the HTTP route does so at app start). ``importer=False``
    (the on-disk nexus): another process imports (:mod:`akrelay.process.followers`); this one
    only reads the file and starts no importer thread.
    """
    config = config if config is not None else KipConfig.load(data_dir, origin=origin)
    backend = backend or os.environ.get(BACKEND_ENV) or (MEMORY if data_dir is None else DISK)
    if backend not in (MEMORY, DISK):
        raise ValueError(f"unknown KIP nexus backend {backend!r}")
    if backend == DISK and not follow:
        found = stored_space(nexus_path(data_dir))  # type: ignore[arg-type]
        if found is not None and found != config.space_id:
            # a one-shot reader (akrelay kip/kql --data) with another origin than the relay's:
            # answer for its own Space from a private nexus, and leave the relay's file alone
            backend = MEMORY
    nexus = None
    if backend == DISK:
        assert data_dir is not None
        data = Path(data_dir)
        path = nexus_path(data)
        legacy_snapshot(data).unlink(missing_ok=True)
        nexus = SqliteNexus(path, config.space_id)
    runtime = KipRuntime(config, nexus, cursor_secret=cursor_secret(store), environment=environment,
                         budget_ms=budget_ms)
    if backend == MEMORY:
        follower = KipFollower(store, runtime)
    else:
        follower = KipFollower(store, runtime, leader=LeaderLock(data / IMPORTER_LOCK), importer=importer,
                               open_writer=lambda: open_writer(path, config.space_id, checkpoint=store.checkpoint()))
    runtime.nexus.withheld = withheld_predicate(store)
    if not follow:
        follower.catch_up()
    elif follower.importer:
        # what a first request may expect to read (read-your-writes); a long backlog is the thread's
        follower.catch_up(timeout=1.0)
        follower.start()
    # else another process imports: each request waits for it (KipFollower.catch_up)
    if backend == DISK or runtime.nexus.head > FREEZE_AFTER:
        # What exists now (the in-memory nexus, and in every process the modules and the
        # app) lives as long as the process: take it out of the cyclic collector's working
        # set, so that full collections do not pause reads. On disk this is what the KQL
        # p99 is made of: a full collection over the worker's startup objects costs about
        # 10 ms, against 2 ms for a typical query (bench_nexus).
        gc.collect()
        gc.freeze()
    return runtime, follower


class ReindexSummary(TypedDict):
    """What ``akrelay reindex --kip`` reports of the rebuilt nexus."""

    space_id: str
    space_seq: int
    transactions: int
    elements: dict[str, int]       # element count per kind
    file: str
    format_version: int


def reindex(store: Store, data_dir: str | os.PathLike[str], *, origin: str) -> ReindexSummary:
    """Rebuild the on-disk nexus from the whole log (``akrelay reindex --kip``).

    Refused while a running relay imports into this data directory. The new file is
    built beside the old one and renamed into place when complete, so a failed
    rebuild leaves the previous nexus as it was.
    """
    config = KipConfig.load(data_dir, origin=origin)
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    leader = LeaderLock(data / IMPORTER_LOCK)
    if not leader.acquire():
        raise RuntimeError("a running relay imports into this KIP nexus; stop it before `akrelay reindex --kip`")
    try:
        path = nexus_path(data)
        fresh = path.with_name(path.name + ".rebuild")
        for leftover in (fresh, Path(f"{fresh}-wal"), Path(f"{fresh}-shm")):
            leftover.unlink(missing_ok=True)
        create_file(fresh, config.space_id)
        nexus = SqliteNexus(fresh, config.space_id, writer=True)
        try:
            follow_log(store, nexus)
            summary: ReindexSummary = {"space_id": nexus.space_id, "space_seq": nexus.head,
                       "transactions": len(nexus.transactions()), "elements": nexus.counts(),
                       "file": str(path), "format_version": FORMAT_VERSION}
        finally:
            nexus.close()
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        os.replace(fresh, path)
        legacy_snapshot(data).unlink(missing_ok=True)
        return summary
    finally:
        leader.release()
