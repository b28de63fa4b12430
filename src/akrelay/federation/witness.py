"""This relay as a witness of its peers' logs (C2SP ``tlog-witness``, issue 23).

The witness keeps, per log origin, the latest checkpoint it cosigned. It cosigns a
new checkpoint of a log it knows (a peer of the peer file with a ``log_key``) only
if it is consistent with that one, so it never cosigns two checkpoints of a log
that are not consistent; the check and the write are one atomic step (a
``BEGIN IMMEDIATE`` transaction in ``witness.sqlite3`` in the data directory, or a
compare-and-set on ``<namespace>:witness:latest`` in a deployment's Redis, so every
node of a deployment witnesses one history).

Two ways in: ``POST /v1/knowledge/witness/add-checkpoint`` (a log pushes a checkpoint
with a consistency proof) and the sync pass (a checkpoint it verified from the
peer's entries, proved consistent with the latest cosigned by the peer's own proof).
"""

from __future__ import annotations

import base64
import json
import sqlite3
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Protocol, TypedDict

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.note import Checkpoint, NoteError, Verifier, cosign, parse_checkpoint, parse_note, parse_vkey
from akrelay.protocol.witness import AddCheckpoint, check_consistency, check_signature, parse_add_checkpoint
from akrelay.store.redis.client import unavailable
from akrelay.store.schema import Schema, ensure_schema, script

if TYPE_CHECKING:
    import redis
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from akrelay.federation.peers import Peer

STATE_FILE = "witness.sqlite3"
SCHEMA = Schema("witness state", {0: script(
    "CREATE TABLE IF NOT EXISTS latest (origin TEXT PRIMARY KEY, data TEXT NOT NULL);")})

class Record(TypedDict):
    """A witnessed checkpoint as kept in SQLite or Redis (JSON)."""

    size: int
    root: str  #: base64
    note: str  #: the checkpoint note with our cosignature
    time: int
Update = Callable[[Record | None], Record | None]


class WitnessState(Protocol):
    def latest(self, origin: str) -> Record | None: ...
    def update(self, origin: str, change: Update) -> Record | None: ...
    def close(self) -> None: ...


class SqliteWitnessState:
    """The witness's records in one SQLite file; ``update`` reads, decides and writes in one transaction."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.execute("PRAGMA synchronous=FULL")
        try:
            ensure_schema(self._db, SCHEMA, str(path))
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def open_in(cls, data_dir: str | Path) -> "SqliteWitnessState":
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        return cls(Path(data_dir) / STATE_FILE)

    def latest(self, origin: str) -> Record | None:
        with self._lock:
            row = self._db.execute("SELECT data FROM latest WHERE origin = ?", (origin,)).fetchone()
        return json.loads(row[0]) if row else None

    def update(self, origin: str, change: Update) -> Record | None:
        """``change(current)`` returns the new record (``None``: keep the current) or raises to refuse."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT data FROM latest WHERE origin = ?", (origin,)).fetchone()
                current = json.loads(row[0]) if row else None
                new = change(current)
                if new is not None:
                    self._db.execute("INSERT INTO latest VALUES (?, ?) ON CONFLICT(origin) DO UPDATE SET data = "
                                     "excluded.data", (origin, json.dumps(new, sort_keys=True)))
                self._db.execute("COMMIT")
                return new if new is not None else current
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()


_SWAP = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""
_redis_outage = unavailable("the witness state (Redis)")


class RedisWitnessState:
    """The deployment's witness records in one Redis hash; ``update`` is a compare-and-set, retried."""

    def __init__(self, client: redis.Redis, prefix: str, *, owns_client: bool = False) -> None:
        self._r = client
        self._key = prefix + "latest"
        self._swap = client.register_script(_SWAP)
        self._owns = owns_client

    @_redis_outage
    def latest(self, origin: str) -> Record | None:
        raw = self._r.hget(self._key, origin)
        return json.loads(raw) if raw else None

    @_redis_outage
    def update(self, origin: str, change: Update) -> Record | None:
        for _ in range(100):
            raw = self._r.hget(self._key, origin)
            current = json.loads(raw) if raw else None
            new = change(current)
            if new is None:
                return current
            if int(self._swap(keys=[self._key], args=[origin, raw or b"", json.dumps(new, sort_keys=True)])):
                return new
        raise ProtocolError("service_unavailable", f"The witness state of {origin!r} kept changing; try again.")

    def close(self) -> None:
        if self._owns:
            self._r.close()


def known_logs(peers: Iterable[Peer]) -> dict[str, Verifier]:
    """Log origin line -> pinned key, for every peer with a ``log_key``: the only logs this relay witnesses."""
    out: dict[str, Verifier] = {}
    for peer in peers:
        log_key = getattr(peer, "log_key", None)
        if log_key:
            verifier = parse_vkey(log_key)
            out[verifier.name] = verifier
    return out


def _checkpoint_of(record: Record) -> Checkpoint:
    return parse_checkpoint(parse_note(record["note"]).text)


class Witness:
    """Cosigns checkpoints of the logs in ``verifiers`` with ``key`` as ``name``, recorded in ``state``."""

    def __init__(self, name: str, key: Ed25519PrivateKey, verifiers: dict[str, Verifier], state: WitnessState,
                 clock: Callable[[], float] | None = None) -> None:
        import time

        self.name = name
        self.key = key
        self.verifiers = verifiers
        self.state = state
        self.clock = clock or time.time

    def _record(self, request: AddCheckpoint) -> Record:
        note = cosign(request.note, self.name, self.key, int(self.clock()))
        return {"size": request.checkpoint.size, "root": base64.b64encode(request.checkpoint.root).decode(),
                "note": note.encode(), "time": int(self.clock())}

    def add_checkpoint(self, body: bytes) -> str:
        """The add-checkpoint call: our cosignature line(s), or a :class:`ProtocolError` (400/403/404/409/422)."""
        request = parse_add_checkpoint(body)
        check_signature(request, self.verifiers)

        def change(current: Record | None) -> Record | None:
            latest = _checkpoint_of(current) if current is not None else None
            check_consistency(request, latest)
            if latest is not None and latest.size == request.checkpoint.size:
                return None  # the same checkpoint again: the cosignature we gave stands
            return self._record(request)

        record = self.state.update(request.checkpoint.origin, change)
        assert record is not None
        ours = [s for s in parse_note(record["note"]).signatures if s.name == self.name]
        return "".join(s.line() for s in ours)

    def after_sync(self, note_text: str, proof: Callable[[int, int], list[str]]) -> str | None:
        """Cosign a checkpoint the sync pass verified; ``proof(m, n)`` asks the peer for a consistency proof.

        Returns the cosigned note we now hold for the origin, or raises :class:`NoteError`
        when the verified checkpoint is not consistent with what we cosigned before (the
        peer showed the witness another history: the caller marks it misbehaving).
        """
        note = parse_note(note_text)
        checkpoint = parse_checkpoint(note.text)

        def change(current: Record | None) -> Record | None:
            if current is None:
                return self._record(AddCheckpoint(0, (), note, checkpoint))
            latest = _checkpoint_of(current)
            small, large = (latest, checkpoint) if latest.size <= checkpoint.size else (checkpoint, latest)
            hashes = [] if small.size in (0, large.size) else proof(small.size, large.size)
            try:
                raw = tuple(base64.b64decode(h, validate=True) for h in hashes)
            except ValueError:
                raw = ()
            request = AddCheckpoint(small.size, raw, note, large)  # only the sizes, roots and proof are checked
            try:
                check_consistency(request, small)
            except ProtocolError as exc:
                raise NoteError(f"it is not consistent with the checkpoint of size {latest.size} this relay "
                                f"cosigned as a witness: {exc.message}") from None
            return self._record(AddCheckpoint(latest.size, raw, note, checkpoint)) if checkpoint.size > latest.size \
                else None

        record = self.state.update(checkpoint.origin, change)
        return record["note"] if record is not None else None

    def cosigned(self, origin: str) -> str | None:
        record = self.state.latest(origin)
        return record["note"] if record is not None else None
