"""Wiring a KIP runtime to a relay's store and data directory.

Used by the HTTP route provider and the CLI: load the operator configuration,
resume the persisted nexus (or rebuild it), and start the follower.
"""

from __future__ import annotations

import gc
import hashlib
import hmac
import os
from pathlib import Path
from typing import Any

from akrelay.kip.budget import DEFAULT_BUDGET_MS
from akrelay.kip.config import KipConfig
from akrelay.kip.follower import KipFollower, load_nexus, rebuild, save_nexus, snapshot_path
from akrelay.kip.runtime import KipRuntime
from akrelay.leader import LeaderLock

CURSOR_SECRET_KEY = "relay.cursor_secret"
FREEZE_AFTER = 10_000
SNAPSHOT_LOCK = "kip-snapshot.lock"


def cursor_secret(store: Any) -> bytes:
    """A KIP cursor key derived from the relay's persisted secret, so all workers agree."""
    base = None
    getter = getattr(store, "meta_get", None)
    if getter is not None:
        base = getter(CURSOR_SECRET_KEY)
    if base is None:
        return os.urandom(32)
    return hmac.new(base, b"akrelay-kip", hashlib.sha256).digest()


def withheld_predicate(store: Any) -> Any:
    """``event_id -> bool``: the operator's withholding, read live from the store."""
    def withheld(event_id: str) -> bool:
        record = store.get(event_id)
        return record is not None and record.withheld
    return withheld


def open_runtime(store: Any, data_dir: str | os.PathLike[str] | None, *, origin: str,
                 follow: bool = True, config: KipConfig | None = None, environment: Any = None,
                 budget_ms: int | None = DEFAULT_BUDGET_MS) -> tuple[KipRuntime, KipFollower]:
    """A runtime over ``store``, resumed from ``<data>/kip-nexus.pickle`` when valid.

    ``config`` and ``environment`` are read from their files unless the caller
    loaded them already (the HTTP route does so at app start).
    """
    config = config if config is not None else KipConfig.load(data_dir, origin=origin)
    path = snapshot_path(data_dir) if data_dir is not None else None
    nexus = load_nexus(path, config.space_id, store.checkpoint()) if path is not None else None
    runtime = KipRuntime(config, nexus, cursor_secret=cursor_secret(store), environment=environment,
                         budget_ms=budget_ms)
    runtime.nexus.withheld = withheld_predicate(store)
    writer_lock = LeaderLock(Path(data_dir) / SNAPSHOT_LOCK) if data_dir is not None else None
    follower = KipFollower(store, runtime, snapshot=path, writer_lock=writer_lock)
    if follower.catch_up() > FREEZE_AFTER:
        # The nexus is long-lived and append-only: take it out of the cyclic collector's
        # working set so that full collections do not pause reads (projection p99).
        gc.collect()
        gc.freeze()
    if follow:
        follower.start()
    return runtime, follower


def reindex(store: Any, data_dir: str | os.PathLike[str], *, origin: str) -> dict[str, Any]:
    """Rebuild the nexus from the whole log and persist it (``akrelay reindex --kip``)."""
    config = KipConfig.load(data_dir, origin=origin)
    nexus = rebuild(store, config.space_id)
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    save_nexus(nexus, snapshot_path(data_dir))
    return {"space_id": nexus.space_id, "space_seq": nexus.head, "transactions": len(nexus.transactions),
            "elements": nexus.counts()}
