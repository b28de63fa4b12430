"""Persisted per-peer sync state and the bounded pending set.

Kept in its own small SQLite file in the data directory (``federation.sqlite3``)
so it survives restarts, and so that a checkpoint and the pending entries of one
pass commit in one transaction. With ``--store redis://...`` it lives in Redis
instead (:mod:`akrelay.federation.redis_state`), shared by the deployment's nodes,
so a new sync leader on another node continues where the old one stopped. The
acceptance log itself stays in the store: replaying a pass after a crash only
resubmits envelopes, which the store answers as exact resubmissions.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator, Protocol

from akrelay.store.schema import Schema, ensure_schema, script

STATE_FILE = "federation.sqlite3"

#: Counters kept per peer; ``akrelay peers status`` prints them in this order.
COUNTERS = (
    "passes", "failed_passes", "pages", "accepted", "duplicates", "rejected",
    "resolved", "pending_added", "pending_accepted", "pending_dropped", "batch_errors",
    "offered", "offers_accepted", "offers_refused", "offers_deferred",
)


@dataclass(slots=True)
class PeerState:
    """What we know about one peer; ``checkpoint`` is the only value we act on."""

    origin: str
    #: The peer's checkpoint at the end of our last *complete* enumeration.
    checkpoint: int = 0
    #: The peer checkpoint most recently observed (first page of the last pass).
    peer_checkpoint: int = 0
    #: After a failed pass, the ``seq`` of its last fully processed page: every record up to
    #: it was submitted, so the next enumeration starts after it. 0 once a pass completes.
    resume_seq: int = 0
    last_attempt: int | None = None
    last_success: int | None = None
    last_error: str | None = None
    #: The last failure of a dependency fetch (``batch``); it does not fail the pass.
    last_batch_error: str | None = None
    consecutive_failures: int = 0
    #: Unix ms before which the peer is not contacted (back-off, Retry-After).
    retry_at: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    #: The peer's last verified signed checkpoint (with ``log_key``; issue 23): the note, and the frontier
    #: (base64 hashes) of its tree, from which the next pass recomputes the next checkpoint's root.
    log_note: str | None = None
    log_frontier: list[str] = field(default_factory=list)
    #: Why the peer's log did not verify (a fork, a rewrite, a missing record); no more pulls until cleared.
    misbehaving: str | None = None
    #: What proves it: both checkpoints and the proof or entry that failed.
    evidence: dict[str, object] | None = None
    #: Unix ms of the last set reconciliation with the peer (issue 26), and what it did or why there is none.
    last_reconcile: int | None = None
    reconcile_note: str | None = None
    #: The peer's last verified checkpoint with our ``cosignature/v1`` line (C2SP tlog-witness style).
    cosigned: str | None = None
    #: Misbehaviour an operator cleared (``akrelay peers clear``), oldest first: each keeps the
    #: reason, the evidence and what had been verified, so clearing never loses the proof.
    cleared: list[dict[str, object]] = field(default_factory=list)
    #: How its news reaches us: ``pushed`` (subscribed to its stream) or ``polled (why)`` (``peers status``).
    push: str | None = None
    #: Events the peer refused when offered after a reconciliation (4xx), newest last, at most 1,000:
    #: never offered again. And Unix ms before which nothing is offered (its 429/503 Retry-After).
    offer_refused: list[str] = field(default_factory=list)
    offer_retry_at: int = 0

    @property
    def lag(self) -> int:
        """Peer sequence numbers observed but not yet processed."""
        return max(0, self.peer_checkpoint - max(self.checkpoint, self.resume_seq))

    def bump(self, counter: str, by: int = 1) -> None:
        self.counts[counter] = self.counts.get(counter, 0) + by

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["lag"] = self.lag
        return data

    def clear_misbehaving(self, now_ms: int) -> "PeerState":
        """This state with its misbehaviour archived in ``cleared`` and everything verified forgotten.

        The next pass trusts nothing it verified before: the signed log is re-verified from
        size 0 (no kept checkpoint or frontier) and every record is enumerated again from
        seq 0 (no sync checkpoint), so each entry is matched to a record once more. Records
        already stored come back as duplicates. Counters and the error history stay.
        """
        archive: dict[str, object] = {"cleared_at": now_ms, "misbehaving": self.misbehaving, "evidence": self.evidence,
                   "log_note": self.log_note, "checkpoint": self.checkpoint}
        return replace(copy.deepcopy(self), misbehaving=None, evidence=None, log_note=None, log_frontier=[],
                       cosigned=None, checkpoint=0, resume_seq=0, retry_at=0, consecutive_failures=0,
                       cleared=[*copy.deepcopy(self.cleared), archive])

    @classmethod
    def from_json(cls, text: str | bytes) -> "PeerState":
        """The state :meth:`to_json` saved (``lag`` is derived; counters added later start at 0)."""
        data = json.loads(text)
        data.pop("lag", None)
        counts = dict.fromkeys(COUNTERS, 0) | data.pop("counts", {})
        return cls(**data, counts=counts)


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """A verified-shape envelope from ``origin`` whose dependencies are not yet retained."""

    origin: str
    event_id: str
    raw: bytes
    missing: tuple[str, ...]
    added_at: int
    attempts: int
    #: Unix ms before which the peer is not asked again for this entry's dependencies.
    retry_at: int = 0


#: Version 1 is the layout before files were versioned; add a step to ``SCHEMA.migrations`` for each change.
_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS peer_state (origin TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pending (
    origin TEXT NOT NULL, event_id TEXT NOT NULL, raw BLOB NOT NULL,
    missing TEXT NOT NULL, added_at INTEGER NOT NULL, attempts INTEGER NOT NULL,
    ord INTEGER NOT NULL, retry_at INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (origin, event_id));
CREATE INDEX IF NOT EXISTS pending_ord ON pending (origin, ord);
"""
SCHEMA = Schema("federation state", {0: script(_SCHEMA_V1)})


class StateStore(Protocol):
    """The federation state as the sync engine uses it: :class:`FederationState` (a SQLite file
    per data directory) or :class:`akrelay.federation.redis_state.RedisFederationState` (one per
    deployment, writes fenced by the sync lease's token)."""

    path: str
    max_pending: int
    max_pending_bytes: int

    def get(self, origin: str) -> PeerState: ...
    def put(self, state: PeerState) -> None: ...
    def all(self) -> list[PeerState]: ...
    def pending(self, origin: str, limit: int | None = None) -> list[PendingEntry]: ...
    def pending_count(self, origin: str | None = None) -> int: ...
    def add_pending(self, origin: str, event_id: str, raw: bytes, missing: list[str] | tuple[str, ...],
                    now_ms: int, retry_at: int = 0) -> int: ...
    def remove_pending(self, origin: str, event_id: str) -> bool: ...
    def is_pending(self, origin: str, event_id: str) -> bool: ...
    def iter_origins_with_pending(self) -> Iterator[str]: ...
    def clear_misbehaving(self, origin: str, now_ms: int) -> PeerState | None: ...
    def close(self) -> None: ...



class FederationState:
    """Thread-safe store of :class:`PeerState` and pending entries in one SQLite file.

    Its writer is the data directory's leader (an ``flock``), so its writes need no fencing.
    """

    def __init__(self, path: str | Path = ":memory:", *, max_pending: int = 10_000,
                 max_pending_bytes: int = 64 * 1024 * 1024) -> None:
        self.path = str(path)
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        if self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        try:
            ensure_schema(self._db, SCHEMA, self.path)
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def open_in(cls, data_dir: str | Path, **kwargs: int) -> "FederationState":
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        return cls(Path(data_dir) / STATE_FILE, **kwargs)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- peer state ---------------------------------------------------------

    def get(self, origin: str) -> PeerState:
        with self._lock:
            row = self._db.execute("SELECT data FROM peer_state WHERE origin = ?", (origin,)).fetchone()
        return PeerState.from_json(row[0]) if row is not None else PeerState(origin)

    def put(self, state: PeerState) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO peer_state (origin, data) VALUES (?, ?) "
                "ON CONFLICT(origin) DO UPDATE SET data = excluded.data",
                (state.origin, json.dumps(state.to_json(), sort_keys=True)),
            )

    def all(self) -> list[PeerState]:
        with self._lock:
            origins = [r[0] for r in self._db.execute("SELECT origin FROM peer_state ORDER BY origin")]
        return [self.get(o) for o in origins]

    def clear_misbehaving(self, origin: str, now_ms: int) -> PeerState | None:
        """An operator's ``peers clear``: the cleared state, or ``None`` if the peer was not misbehaving.

        One ``BEGIN IMMEDIATE`` transaction, so it is safe next to a running ``serve``: its sync
        loop does not write a misbehaving peer's state (it skips the peer), and any other
        write waits for this one.
        """
        with self._lock:
            cur = self._db.execute("BEGIN IMMEDIATE")
            try:
                row = cur.execute("SELECT data FROM peer_state WHERE origin = ?", (origin,)).fetchone()
                old = PeerState.from_json(row[0]) if row is not None else None
                if old is None or not old.misbehaving:
                    cur.execute("ROLLBACK")
                    return None
                new = old.clear_misbehaving(now_ms)
                cur.execute("UPDATE peer_state SET data = ? WHERE origin = ?",
                            (json.dumps(new.to_json(), sort_keys=True), origin))
                cur.execute("COMMIT")
                return new
            except BaseException:
                if self._db.in_transaction:
                    cur.execute("ROLLBACK")
                raise

    # -- pending set --------------------------------------------------------

    def pending(self, origin: str, limit: int | None = None) -> list[PendingEntry]:
        """Oldest first, so long-waiting events are retried before new ones."""
        sql = ("SELECT origin, event_id, raw, missing, added_at, attempts, retry_at FROM pending "
               "WHERE origin = ? ORDER BY ord")
        args: tuple[str | int, ...] = (origin,)
        if limit is not None:
            sql += " LIMIT ?"
            args += (limit,)
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [PendingEntry(o, e, bytes(r), tuple(json.loads(m)), a, n, t) for o, e, r, m, a, n, t in rows]

    def pending_count(self, origin: str | None = None) -> int:
        with self._lock:
            if origin is None:
                row = self._db.execute("SELECT COUNT(*) FROM pending").fetchone()
            else:
                row = self._db.execute("SELECT COUNT(*) FROM pending WHERE origin = ?", (origin,)).fetchone()
        count: int = row[0]
        return count

    def add_pending(self, origin: str, event_id: str, raw: bytes, missing: list[str] | tuple[str, ...],
                    now_ms: int, retry_at: int = 0) -> int:
        """Keep ``raw`` until its dependencies arrive; returns how many old entries were evicted.

        The set is bounded by count and bytes per peer; the oldest entries go first,
        because a dependency that has been unobtainable longest is least likely to appear.
        """
        with self._lock:
            cur = self._db.execute("BEGIN IMMEDIATE")
            try:
                row = cur.execute("SELECT attempts, added_at, ord FROM pending WHERE origin = ? AND event_id = ?",
                                  (origin, event_id)).fetchone()
                if row is not None:
                    cur.execute("UPDATE pending SET missing = ?, attempts = ?, retry_at = ? "
                                "WHERE origin = ? AND event_id = ?",
                                (json.dumps(sorted(missing)), row[0] + 1, retry_at, origin, event_id))
                    cur.execute("COMMIT")
                    return 0
                nxt = cur.execute("SELECT COALESCE(MAX(ord), 0) + 1 FROM pending WHERE origin = ?",
                                  (origin,)).fetchone()[0]
                cur.execute("INSERT INTO pending VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            (origin, event_id, raw, json.dumps(sorted(missing)), now_ms, 1, nxt, retry_at))
                evicted = 0
                while True:
                    count, size = cur.execute(
                        "SELECT COUNT(*), COALESCE(SUM(LENGTH(raw)), 0) FROM pending WHERE origin = ?",
                        (origin,)).fetchone()
                    if count <= 1 or (count <= self.max_pending and size <= self.max_pending_bytes):
                        break
                    cur.execute("DELETE FROM pending WHERE origin = ? AND ord = "
                                "(SELECT MIN(ord) FROM pending WHERE origin = ?)", (origin, origin))
                    evicted += 1
                cur.execute("COMMIT")
                return evicted
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def remove_pending(self, origin: str, event_id: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM pending WHERE origin = ? AND event_id = ?", (origin, event_id))
            return cur.rowcount > 0

    def is_pending(self, origin: str, event_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM pending WHERE origin = ? AND event_id = ?",
                                    (origin, event_id)).fetchone() is not None

    def iter_origins_with_pending(self) -> Iterator[str]:
        with self._lock:
            rows = self._db.execute("SELECT DISTINCT origin FROM pending ORDER BY origin").fetchall()
        for (origin,) in rows:
            yield origin
