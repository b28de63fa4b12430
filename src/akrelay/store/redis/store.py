"""The shared acceptance log on Redis: several relay nodes, one ``seq`` space.

Why it is shaped this way (docs/architecture.md, "The Redis store", has the key layout):

* **One Lua script per commit group.** The idempotency check (``ids`` hash), the
  ``seq`` allocation (the ``hwm`` counter), the record and every index entry are
  written by one script, which Redis runs atomically: a ``seq`` is handed out
  exactly once per deployment, together with its record, so a failed write leaves
  no gap and a resubmission to any node finds the original record (same ``seq``,
  ``accepted_at`` and canonical bytes). A whole group of envelopes is one script
  call: one round trip and one AOF write (one fsync under ``appendfsync always``)
  for the group.
* **Exact filtering on the server.** Each index term (``protocol.query.index_terms``)
  is a sorted set of ``seq`` values scored by ``seq``. A query starts from the
  smallest set in the ``(after_seq, upto_seq]`` window (``ZCOUNT`` is a log-time
  count), checks the other terms by ``ZSCORE``, the ``created_at`` bounds and the
  folded search text (plain ``string.find``) of each candidate, and returns the
  matches in ascending ``seq``: complete, never ranked. One script call scans at
  most :attr:`RedisStore.scan_budget` candidates and says where it stopped; the
  client loops, so no single call holds Redis for long. Blocks of 1024 ``seq``
  values keep their ``created_at`` range, so a time bound skips whole blocks.
* **Checked before any write.** The write scripts carry a ``#!lua`` header (Redis 7),
  so Redis refuses one whole when it is out of memory or cannot persist, instead of
  failing at its first write; the read scripts are declared ``no-writes``.
* **A namespace.** Every key starts with ``<namespace>:``, so several deployments
  can share a database; a format-version key is checked on open, and a log written
  by a newer akrelay is refused (as :mod:`akrelay.store.schema` does for SQLite).
* **Outages are 503s.** Every call goes through :meth:`RedisStore._call`, which asks
  :func:`akrelay.store.redis.client.outage_kind`: a Redis that is down, loading its
  AOF, out of memory, unable to persist or a read-only replica raises
  :class:`StoreUnavailable`, never a redis-py exception. Only "down" puts calls on hold:
  a Redis that refuses writes still answers reads.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
# Loose types: redis-py leaves a script's reply untyped (its shape is the Lua script's, not the client's), so
# script replies stay loose here and are converted to typed values (Record, int) where read.
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar, cast

import redis
import redis.client
import redis.exceptions
from redis.typing import EncodableT

from akrelay.protocol.envelope import Envelope
from akrelay.protocol.merkle import Frontier
from akrelay.store.base import (LogEntry, Queryable, QueryParams, Record, StoreRefused, StoreUnavailable, event_hash_bytes,
                                indexed_facts)
from akrelay.store.tlog import append_all_levels, leaf_of
from akrelay.store.redis import client as redis_client
from akrelay.store.redis.client import RETRY_AFTER, connect, describe
from akrelay.store.redis.text import TextIndex, fts_query, indexable
from akrelay.store.sqlite_planner import COUNT_CAP
from akrelay.store.text_indexer import TextIndexer
from akrelay.store.schema import SchemaVersionError
from akrelay.store.redis.scripts import lua

log = logging.getLogger("akrelay.store.redis.store")

T = TypeVar("T")

#: The layout version this akrelay writes and reads (the ``<ns>:format`` key).
FORMAT_VERSION = 1
#: ``seq`` values per ``created_at`` summary block (see the module docstring).
BLOCK = 1024
#: Envelopes per commit script call, records per read call: bound how long one call holds Redis.
COMMIT_CHUNK = 256
ITER_CHUNK = 1000
#: Seconds every call fails at once after an outage was seen (a ``ping`` probes through it).
OUTAGE_HOLD = 1.0
#: Seconds a commit watcher waits after a wake-up before the next: the commits announced meanwhile (a
#: busy deployment sends one message per commit group to every process) cost one wake-up together.
WATCH_COALESCE = 0.02

#: The shared metadata key holding the log's random ID (node-local text indexes check they follow this log).
LOG_ID_KEY = "text-index.log-id"

class RedisFormatError(SchemaVersionError):
    """The namespace holds a log in a layout this akrelay does not read."""


class WeakDurability(StoreRefused):
    """Redis's live persistence settings do not make every acknowledged acceptance survive a crash."""



_COMMIT = lua("commit", BLOCK=BLOCK)


_QUERY = lua("query", BLOCK=BLOCK)

#: Check given candidates (from the node's text index) exactly, in order, up to a limit of matches.
#: ARGV: prefix, the index's position, last seq and its digest, limit, include withheld, created_from,
#: created_before, nt, terms..., nq, texts..., candidates... A removed candidate has no ``flt`` entry and is
#: skipped; the text is always the log's own. Replies {0} when the log is shorter than the index or no longer
#: holds the record the index took last (restored from an older backup): the index is then not used. Else
#: 1, the high-water mark, then the matches.
_VERIFY = lua("verify")

_GET = lua("get")

#: Up to ARGV[3] records after ``seq`` ARGV[2]: their ``rec`` values, or with ARGV[4] = ``flt`` their filter
#: values (what the text indexer reads).
_ITER = lua("iter")

_WITHHOLD = lua("withhold")

#: ARGV: prefix, id, seq the caller read, then the record's index terms (computed from its envelope).
_REMOVE = lua("remove")

#: Append records with their own seq (migration). ARGV: prefix, n, then per record:
#: id, seq, accepted_at, withheld, created_at, body, text, nterms, terms...
#: Refuses (changing nothing) when an ID or a seq is already there or a seq is not above the mark.
_APPEND = lua("append", BLOCK=BLOCK)

#: Raise the high-water mark to at least ARGV[2]; return the mark.
_RAISE = lua("raise")


#: The Merkle log (issue 23): append entries and interior nodes if the log still has ARGV[2] entries.
#: ARGV: prefix, expected size, n, (seq, 32-byte hash) * n, m, ("level:idx", hash) * m. Returns -1 when
#: appended, else the size found (another node appended first: the caller reloads and retries).
_LOG_APPEND = lua("log_append")

#: Set ARGV[2] in the meta hash to ARGV[4] only if it holds ARGV[3] (ARGV[5] == '1': it must be absent).
_META_REPLACE = lua("meta_replace")


def _record(seq: int, value: bytes, withheld: int) -> Record:
    """A record from the stored ``b"<accepted_at>:<canonical body>"``."""
    colon = value.index(b":")
    return Record(seq, int(value[:colon]), None, bool(withheld), body=value[colon + 1:])


def _at_least_one(chunks: Iterator[list[int]]) -> Iterator[list[int]]:
    """The candidate chunks, or one empty chunk: a verify call also checks that the index follows this log."""
    empty = True
    for chunk in chunks:
        empty = False
        yield chunk
    if empty:
        yield []


def _triples(reply: list[Any], start: int = 0) -> Iterator[tuple[int, bytes, int]]:  # Any: a script reply, by position
    for k in range(start, len(reply), 3):
        yield int(reply[k]), reply[k + 1], int(reply[k + 2])


@dataclass(slots=True)
class _Filters:
    """What a query asks of each record besides its ``seq`` window."""

    terms: list[str]
    texts: list[str]
    created_from: int | None
    created_before: int | None
    include_withheld: bool

    def head(self) -> list[EncodableT]:
        """The verify script's arguments before its candidates."""
        return ["1" if self.include_withheld else "0",
                "" if self.created_from is None else int(self.created_from),
                "" if self.created_before is None else int(self.created_before),
                len(self.terms), *self.terms, len(self.texts), *self.texts]


class RedisStore(Queryable):
    """The shared acceptance log (``redis://``); see the module docstring for the design."""

    #: Candidates one query script call may examine before handing back to the client.
    scan_budget = 2000
    #: Redis reads from the network: the HTTP layer runs its calls off the event loop.
    blocking_io = True

    #: Candidates per verify call on the text-index path.
    verify_chunk = 1000
    #: Text-index candidates counted (at most) against the sparsest request term's postings: when both
    #: pass it, the index drives (its candidates hold the ``q`` trigrams, so far more of them match).
    count_cap = COUNT_CAP

    def __init__(self, url: str, *, namespace: str = "akrelay", client: redis.Redis | None = None,
                 text_index: str | os.PathLike[str] | None = None, text_indexer: bool = True) -> None:
        """``text_index``: this node's trigram file for ``q`` (:mod:`akrelay.store.redis.text`), kept caught
        up by a background thread from :meth:`start` on unless ``text_indexer`` is false; without it ``q`` is
        verified by scanning. ``client``: a client shared with the rest of the node (the backend's); the
        store still closes it on :meth:`close`, which comes last. Nothing starts here."""
        if not namespace or any(c in namespace for c in " \n\r\t"):
            raise ValueError(f"invalid Redis key namespace {namespace!r}")
        self.url = url
        self.namespace = namespace
        self.prefix = f"{namespace}:"
        self.channel = f"{self.prefix}commits"
        self._client = client if client is not None else connect(url)
        #: where round trips and outages are reported (the node's backend points it at ``/metrics``)
        self.observer: redis_client.Observing = redis_client.Observer()
        self._closed = False
        #: until when calls fail at once after an outage (see :meth:`_call`), and why
        self._down_until = 0.0
        self._down_reason = ""
        self._watchers: list[_Watcher] = []
        self._scripts = {
            name: self._client.register_script(source)
            for name, source in (("commit", _COMMIT), ("query", _QUERY), ("get", _GET), ("iter", _ITER),
                                 ("withhold", _WITHHOLD), ("remove", _REMOVE), ("append", _APPEND),
                                 ("raise", _RAISE), ("verify", _VERIFY))
        }
        self.text_index: TextIndex | None = None
        self._indexer: TextIndexer | None = None
        from akrelay.store.redis.recon import RedisReconIndex

        #: the reconciliation index (issue 26), a follower in the commit path like the Merkle log
        self.recon = RedisReconIndex(self, self._client, self._call)
        try:
            self._check_format()
            if text_index is not None:
                log_id = self.meta_setdefault(LOG_ID_KEY, os.urandom(16).hex().encode()).decode("ascii", "replace")
                self.text_index = TextIndex(text_index, log_id)
        except BaseException:
            self._client.close()
            raise
        self._text_indexer = text_indexer

    def start(self) -> None:
        """Start the trigram indexer (the node's store component, first in start order); idempotent."""
        if self.text_index is not None and self._text_indexer and self._indexer is None and not self._closed:
            self._indexer = self.text_indexer()
            self._indexer.start()

    def stop(self) -> None:
        """Stop what :meth:`start` started; the store stays open."""
        indexer, self._indexer = self._indexer, None
        if indexer is not None:
            indexer.stop()

    # -- plumbing ------------------------------------------------------------------
    def _call(self, fn: Callable[[], T], *, probe: bool = False, name: str = "other") -> T:
        """Run one Redis exchange; an outage (or a server that cannot take writes now) is :class:`StoreUnavailable`.

        After an outage every call fails at once for :data:`OUTAGE_HOLD` seconds instead of
        waiting for its own connect or reply timeout: with Redis unreachable (a host down,
        a stalled server) requests would otherwise queue behind each other's timeouts far
        past the few seconds a 503 may take. ``probe`` calls (``ping``, for ``/readyz``) go
        through anyway, and a success ends the hold.
        """
        if self._closed:
            raise RuntimeError("store is closed")
        if not probe and self._down_until and time.monotonic() < self._down_until:
            self.observer.outage()
            raise StoreUnavailable(self._down_reason, RETRY_AFTER)
        started = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:
            kind = redis_client.outage_kind(exc)
            if kind is None:
                raise
            self.observer.outage()
            error = redis_client.unavailable_error(f"the Redis store at {describe(self.url)}", exc)
            if kind == redis_client.DOWN:  # a server that refuses writes (OOM, MISCONF, READONLY) still serves reads
                self._down_reason, self._down_until = str(error), time.monotonic() + OUTAGE_HOLD
            raise error from exc
        self.observer.call(name, time.perf_counter() - started)
        self._down_until = 0.0
        return value

    def _script(self, name: str, args: Sequence[EncodableT]) -> Any:  # Any: the Lua script's reply (redis-py: Any)
        script = self._scripts[name]
        return self._call(lambda: script(keys=[], args=[self.prefix, *args]), name=name)

    def _check_format(self) -> None:
        key = self.prefix + "format"
        found = self._call(lambda: self._client.get(key))
        if found is None:
            self._call(lambda: self._client.set(key, str(FORMAT_VERSION), nx=True))
            found = self._call(lambda: self._client.get(key))
        try:
            version = int(found)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            version = -1
        if version != FORMAT_VERSION:
            shown = found.decode("utf-8", "replace") if isinstance(found, bytes) else repr(found)
            raise RedisFormatError(
                f"{describe(self.url)} namespace {self.namespace!r}: the acceptance log there has format version "
                f"{shown}, and this akrelay reads version {FORMAT_VERSION}; run the akrelay that wrote it "
                "(or a newer one), or use another --store database or namespace"
            )

    # -- reads ---------------------------------------------------------------------
    def get(self, event_id: str) -> Record | None:
        return self.get_many([event_id]).get(event_id)

    def get_many(self, event_ids: Sequence[str]) -> dict[str, Record]:
        ids = list(dict.fromkeys(event_ids))
        out: dict[str, Record] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            reply = self._script("get", chunk)
            for event_id, (seq, value, withheld) in zip(chunk, _triples(reply)):
                if seq:
                    out[event_id] = _record(seq, value, withheld)
        return out

    def checkpoint(self) -> int:
        value = self._call(lambda: self._client.get(self.prefix + "hwm"))
        return int(value) if value is not None else 0

    def iter_records(self, after_seq: int, limit: int) -> list[Record]:
        """In calls of at most :data:`ITER_CHUNK` records, so a large ``limit`` never holds Redis long."""
        out: list[Record] = []
        after = int(after_seq)
        while len(out) < limit:
            want = min(ITER_CHUNK, limit - len(out))
            reply = self._script("iter", [after, want])
            out += [_record(seq, value, withheld) for seq, value, withheld in _triples(reply)]
            if len(reply) < 3 * want:
                break
            after = out[-1].seq
        return out

    def select(self, params: QueryParams) -> list[Record]:
        """Exact, complete enumeration: text-index candidates verified in Redis where that is the
        narrower path (see :meth:`_query_indexed`), else server-side scans of bounded size, resumed
        until ``limit`` or the end."""
        texts, upto_seq, limit = list(params.texts), params.upto_seq, params.limit
        filters = _Filters(list(params.terms), texts, params.created_from, params.created_before,
                           params.include_withheld)
        after = int(params.after_seq)
        if self.text_index is not None and indexable(texts):
            indexed = self._query_indexed(filters, after, upto_seq, limit)
            if indexed is not None:
                return indexed
        return self._scan(filters, after, "" if upto_seq is None else int(upto_seq), limit)

    def _query_indexed(self, f: _Filters, after: int, upto_seq: int | None, limit: int) -> list[Record] | None:
        """Candidates from the node's text index up to its position, verified in Redis; the rest scanned.

        ``None`` when the index cannot be used now (missing, another log, being
        rebuilt) or a request term has fewer postings in the window than the
        index has candidates: the scan path then answers the whole page.
        """
        assert self.text_index is not None
        upto: int | str = "" if upto_seq is None else int(upto_seq)  # "": the mark the first call reads
        if upto != "" and int(upto) <= after:
            return []
        out: list[Record] = []
        done = after
        with self.text_index.snapshot() as snap:
            if snap is None:
                return None
            indexed = snap.position if upto == "" else min(snap.position, int(upto))
            if indexed > after:
                match = fts_query(indexable(f.texts))
                try:
                    if f.terms:
                        smallest = min(self._term_counts(f.terms, after, indexed))
                        if smallest < self.count_cap and smallest <= snap.count(match, after, indexed, smallest):
                            return None
                    chunks = snap.chunks(match, after, indexed, 2 * limit + 16, self.verify_chunk)
                    for chunk in _at_least_one(chunks):
                        reply = self._script("verify", [snap.position, snap.last_seq, snap.last_digest,
                                                        limit - len(out), *f.head(), *chunk])
                        if not int(reply[0]):
                            self.text_index.failed("it does not match the log (restored from an older backup?)")
                            return None
                        if upto == "":
                            upto = int(reply[1])  # the window ends at the mark the first call saw
                        out.extend(_record(seq, value, withheld) for seq, value, withheld in _triples(reply, 2))
                        if len(out) >= limit:
                            return out
                        done = chunk[-1] if chunk else indexed
                    done = indexed
                except sqlite3.Error as exc:  # every candidate up to ``done`` was verified: scan the rest
                    self.text_index.failed(exc)
        return out + self._scan(f, done, upto, limit - len(out))

    def _term_counts(self, terms: Sequence[str], after: int, upto: int) -> list[int]:
        def run() -> list[int]:
            pipe = self._client.pipeline(transaction=False)
            for term in terms:
                pipe.zcount(self.prefix + "t:" + term, f"({after}", upto)
            return [int(c) for c in pipe.execute()]

        return self._call(run)

    def _scan(self, f: _Filters, after: int, upto: int | str, limit: int) -> list[Record]:
        """Server-side scans of at most :attr:`scan_budget` candidates per call over ``(after, upto]``."""
        out: list[Record] = []
        if limit <= 0 or (upto != "" and after >= int(upto)):
            return out
        head = f.head()
        for _ in range(1_000_000):  # bounded: every call advances ``after`` or ends
            reply = self._script("query", [after, upto, self.scan_budget, limit - len(out), *head])
            position, exhausted, upto = int(reply[0]), int(reply[1]), int(reply[2])
            out.extend(_record(seq, value, withheld) for seq, value, withheld in _triples(reply, 3))
            if exhausted or len(out) >= limit or position <= after:
                break
            after = position
        return out

    # -- the node's text index ---------------------------------------------------------
    def index_text(self, max_records: int = 500) -> int:
        """Add up to ``max_records`` records past its position to this node's text index; how many were added.

        Only the process holding the index's leader lock writes (others return 0).
        The position moves to the checkpoint read first when fewer than asked came
        back: every record at or below it was visible to the read that followed.
        """
        index = self.text_index
        if index is None:
            return 0
        with index.write_lock:
            if not index.leader.acquire():
                return 0
            return self._index_text(index, max_records)

    def text_indexer(self) -> TextIndexer:
        """The follower that keeps this node's text index caught up (built here, started by the caller).

        Trigram indexing costs about half a millisecond of CPU per record, which ingest
        needs more while the log grows: 32 records a step then, 500 while it is still.
        """
        return TextIndexer(self, thread_name="akrelay-redis-text-indexer", interval=0.2, batch=500, busy_batch=32,
                           busy_pace=0.25, quiet_pace=0.25)

    def text_index_position(self) -> int:
        """The text index's committed position, as its writer here has it (0: not this process's to write)."""
        index = self.text_index
        return index.state()[0] if index is not None and index.leader.held else 0

    def _index_text(self, index: TextIndex, max_records: int) -> int:
        try:
            checkpoint = self.checkpoint()
            index.check_log(checkpoint, self._text_at)
            position = index.state()[0]
            reply = self._script("iter", [position, max_records, "flt"])
            rows = [(seq, bytes(value)) for seq, value, _ in _triples(reply)]
            moved = rows[-1][0] if rows else position
            if len(rows) < max_records:
                moved = max(moved, checkpoint)
            if rows or moved != position:
                index.add(rows, moved)
            return len(rows)
        except sqlite3.Error:
            index.discard_writer()  # checked again (and rebuilt if need be) on the next step
            raise

    def _text_at(self, seq: int) -> bytes | None:
        value = cast("bytes | None", self._call(lambda: self._client.hget(self.prefix + "flt", str(seq))))
        return None if value is None else bytes(value)

    def text_index_lag(self) -> int:
        """Retained records past this node's text-index position (queries scan those in Redis)."""
        if self.text_index is None:
            return 0
        with self.text_index.snapshot() as snap:
            position = snap.position if snap is not None else 0
        return int(self._call(lambda: self._client.zcount(self.prefix + "all", f"({position}", "+inf")))

    # -- writes --------------------------------------------------------------------
    def commit(self, envelope: Envelope, accepted_at: int) -> tuple[Record, bool]:
        return self.commit_many([(envelope, accepted_at)])[0]

    def commit_many(self, items: Iterable[tuple[Envelope, int]]) -> list[tuple[Record, bool]]:
        """Commit in order, :data:`COMMIT_CHUNK` envelopes per atomic script call."""
        items = list(items)
        out: list[tuple[Record, bool]] = []
        for start in range(0, len(items), COMMIT_CHUNK):
            out += self._commit_chunk(items[start:start + COMMIT_CHUNK])
        if any(created for _, created in out):
            self._log_after_commit(out)
            try:
                self.recon.catch_up()
            except StoreUnavailable:
                log.warning("the reconciliation index could not be extended now; the next commit or read will")
        return out

    def _log_after_commit(self, out: list[tuple[Record, bool]]) -> None:
        """Extend the Merkle log right after the commit; an outage here leaves it to the next commit or signer."""
        try:
            self.log_catch_up()
        except StoreUnavailable:
            log.warning("the Merkle log could not be extended now; the next commit or checkpoint will")
            return
        fresh = [record for record, created in out if created]
        if len(fresh) <= 1000:  # their leaf indices, in one round trip
            found = self._call(lambda: self._client.hmget(self.prefix + "log:s", [str(r.seq) for r in fresh]))
            for record, index in zip(fresh, found):
                record.log_index = int(index) if index is not None else None

    def try_commit_many(self, items: Sequence[tuple[Envelope, int]]) -> list[tuple[Record, bool]] | None:
        """Redis serializes writers itself: a commit never waits for another writer here, so always commits."""
        return self.commit_many(items)

    def _commit_chunk(self, items: Sequence[tuple[Envelope, int]]) -> list[tuple[Record, bool]]:
        args: list[EncodableT] = [len(items)]
        bodies: list[bytes] = []
        for envelope, accepted_at in items:
            terms, text = indexed_facts(envelope)
            body = envelope.canonical_bytes()
            bodies.append(body)
            args += [envelope.id, int(accepted_at), envelope.created_at, body, text, len(terms), *terms]
        reply = self._script("commit", args)
        out: list[tuple[Record, bool]] = []
        for k, (created, seq, value, withheld) in enumerate(zip(reply[0::4], reply[1::4], reply[2::4], reply[3::4])):
            if created:
                envelope, accepted_at = items[k]
                out.append((Record(int(seq), int(accepted_at), envelope, False, body=bodies[k]), True))
            else:
                out.append((_record(int(seq), value, withheld), False))
        return out

    def append_records(self, records: Sequence[Record]) -> int:
        """Append ``records`` with their own ``seq``, ``accepted_at`` and withheld state (migration).

        In one atomic call: refused with :class:`ValueError`, changing nothing, when an
        ID is already here or a ``seq`` is not above the high-water mark (records must
        come in ascending ``seq``). Returns the new high-water mark.
        """
        args: list[EncodableT] = [len(records)]
        for record in records:
            terms, text = indexed_facts(record.envelope)
            args += [record.id, record.seq, record.accepted_at, "1" if record.withheld else "0",
                     record.envelope.created_at, record.canonical_bytes(), text, len(terms), *terms]
        try:
            return int(self._script("append", args))
        except redis.exceptions.ResponseError as exc:
            if "AKRELAY" in str(exc):
                raise ValueError(str(exc).split("AKRELAY ", 1)[-1]) from None
            raise

    def raise_high_water_mark(self, seq: int) -> int:
        """Never hand out ``seq`` or below again (migration, restore); return the new mark."""
        return int(self._script("raise", [int(seq)]))

    def set_withheld(self, event_id: str, withheld: bool) -> bool:
        done = bool(self._script("withhold", [event_id, "1" if withheld else "0"]))
        if done:
            self.recon.follow_withheld(event_id, withheld)
        return done

    def remove(self, event_id: str) -> bool:
        """Drop the record and its index entries (terms recomputed from its envelope); the mark stays."""
        for _ in range(10):
            record = self.get(event_id)
            if record is None:
                return False
            terms, _ = indexed_facts(record.envelope)
            done = int(self._script("remove", [event_id, str(record.seq), *terms]))
            if done == 1:
                self.recon.discard([(record.envelope.created_at, event_hash_bytes(event_id))])
            if done >= 0:
                return done == 1
        raise RuntimeError(f"remove({event_id}): the record kept changing under us")  # pragma: no cover

    # -- metadata ------------------------------------------------------------------
    def meta_get(self, key: str) -> bytes | None:
        value = cast("bytes | None", self._call(lambda: self._client.hget(self.prefix + "meta", key)))
        return bytes(value) if value is not None else None

    def meta_set(self, key: str, value: bytes) -> None:
        self._call(lambda: self._client.hset(self.prefix + "meta", key, bytes(value)))

    def meta_setdefault(self, key: str, value: bytes) -> bytes:
        name = self.prefix + "meta"

        def run() -> bytes:
            pipe = self._client.pipeline(transaction=True)
            pipe.hsetnx(name, key, bytes(value))
            pipe.hget(name, key)
            stored: bytes = pipe.execute()[1]
            return stored

        return bytes(self._call(run))

    def meta_replace(self, key: str, expected: bytes | None, value: bytes) -> bool:
        args: list[EncodableT] = [key, b"" if expected is None else bytes(expected), bytes(value),
                                  "1" if expected is None else "0"]
        return bool(self._log_script("meta_replace", args))

    # -- the Merkle log (issue 23): a follower in the commit path ------------------------------------
    # Redis's Lua has no SHA-256, so the tree is computed here, right after each commit (and by the
    # checkpoint signer), and written with a compare-and-set on the log's size: every node computes the
    # same deterministic tree, so a node that loses the race reloads the frontier and goes on.
    def _log_script(self, name: str, args: Sequence[EncodableT]) -> int:
        if name not in self._scripts:
            self._scripts[name] = self._client.register_script({"log_append": _LOG_APPEND,
                                                                "meta_replace": _META_REPLACE}[name])
        return int(self._script(name, args))  # both scripts answer an integer

    def log_catch_up(self, limit: int = 100000) -> int:
        """Append every committed record that the log lacks yet (at most ``limit``); return the log's size."""
        lock = self.__dict__.setdefault("_log_lock", threading.Lock())
        with lock:
            done = 0
            while True:
                size = self.log_size()
                frontier: Frontier | None = self.__dict__.get("_frontier")
                if frontier is None or frontier.size != size:
                    frontier = Frontier.load(size, self.log_nodes)
                last = self.log_entries(size - 1, 1)[0].seq if size else 0
                records = self.iter_records(last, min(1000, limit - done))
                if not records:
                    return size
                entries = [(r.seq, event_hash_bytes(r.id)) for r in records]
                grown = frontier.copy()
                nodes = append_all_levels(grown, entries)  # every level: read without folding
                args: list[EncodableT] = [size, len(entries)]
                for seq, event_hash in entries:
                    args += [seq, event_hash]
                args.append(len(nodes))
                for level, index, value in nodes:
                    args += [f"{level}:{index}", value]
                if int(self._log_script("log_append", args)) == -1:
                    self.__dict__["_frontier"] = grown
                    done += len(entries)
                    if done >= limit:
                        return grown.size

    def log_size(self) -> int:
        value = self._call(lambda: self._client.get(self.prefix + "log:size"))
        return int(value) if value is not None else 0

    def log_entries(self, start: int, limit: int) -> list[LogEntry]:
        size = self.log_size()
        indices = list(range(max(0, start), min(size, max(0, start) + max(0, limit))))
        if not indices:
            return []
        raw = cast("list[bytes | None]",  # this client answers bytes (no decode_responses)
                   self._call(lambda: self._client.hmget(self.prefix + "log:e", [str(i) for i in indices])))
        pairs = []
        for index, value in zip(indices, raw):
            if value is None:
                break
            colon = value.index(b":")
            pairs.append((index, int(value[:colon]), bytes(value[colon + 1:])))
        seqs = [str(seq) for _, seq, _ in pairs]

        def flags() -> list[int]:
            pipe = self._client.pipeline(transaction=False)
            for seq in seqs:
                pipe.hexists(self.prefix + "rec", seq)
                pipe.sismember(self.prefix + "wh", seq)
            return pipe.execute()

        got = self._call(flags) if seqs else []
        return [LogEntry(index, seq, h, bool(got[2 * k + 1]) if got[2 * k] else None)
                for k, (index, seq, h) in enumerate(pairs)]

    def log_index(self, seq: int) -> int | None:
        value = self._call(lambda: self._client.hget(self.prefix + "log:s", str(int(seq))))
        return int(value) if value is not None else None

    def log_nodes(self, keys: Sequence[tuple[int, int]]) -> list[bytes]:
        leaves = [index for level, index in keys if level == 0]
        inner = [f"{level}:{index}" for level, index in keys if level > 0]

        def run() -> list[list[bytes | None]]:
            pipe = self._client.pipeline(transaction=False)
            pipe.hmget(self.prefix + "log:e", [str(i) for i in leaves] or ["-"])
            pipe.hmget(self.prefix + "log:n", inner or ["-"])
            return pipe.execute()

        got_leaves, got_inner = self._call(run)
        leaf_iter, inner_iter = iter(got_leaves), iter(got_inner)
        out: list[bytes] = []
        for level, index in keys:
            value: bytes | None = next(leaf_iter) if level == 0 else next(inner_iter)
            if value is None:
                raise KeyError((level, index))
            if level == 0:
                colon = value.index(b":")
                out.append(leaf_of(int(value[:colon]), bytes(value[colon + 1:])))
            else:
                out.append(bytes(value))
        return out

    # -- operations ----------------------------------------------------------------
    def ping(self) -> None:
        """Whether Redis answers (``/readyz``); one that refuses writes (OOM, MISCONF, READONLY) still serves reads."""
        try:
            self._call(self._client.ping, probe=True)
        except StoreUnavailable as exc:
            if redis_client.outage_kind(exc.__cause__ or exc) == redis_client.REFUSING:  # MISCONF refuses even PING
                return
            # the next probe starts from a new connection: none kept from before the outage is trusted
            self._client.connection_pool.disconnect(inuse_connections=False)
            raise

    def memory(self) -> tuple[int, int]:
        """Redis's ``used_memory`` and ``maxmemory`` (0: no limit) from ``INFO memory``, for ``/metrics``."""
        info = self._call(lambda: self._client.info("memory"))
        return int(info["used_memory"]), int(info.get("maxmemory", 0))

    def durability(self) -> dict[str, str]:
        """Redis's live ``appendonly`` and ``appendfsync`` (``CONFIG GET``); raises if CONFIG is refused."""
        def run() -> dict[str, str]:
            found = self._client.config_get("append*")
            return {str(k): str(v) for k, v in found.items()}

        return self._call(run)

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` (on a subscriber thread) whenever any node commits new records; returns ``stop``.

        One thread per call keeps a pub/sub connection to the commit channel and
        reconnects after an outage; followers keep polling as the fallback. Commits
        announced within :data:`WATCH_COALESCE` of a wake-up share the next one.
        """
        watcher = _Watcher(self.url, self.channel, callback)
        self._watchers.append(watcher)
        watcher.start()

        def stop() -> None:
            watcher.stop()
            if watcher in self._watchers:
                self._watchers.remove(watcher)

        return stop

    def close(self) -> None:
        if self._closed:
            return
        self.stop()
        if self.text_index is not None:
            self.text_index.close()
        self._closed = True
        for watcher in list(self._watchers):
            watcher.stop()
        self._watchers.clear()
        self._client.close()


class _Watcher:
    """The pub/sub subscriber behind :meth:`RedisStore.watch` (one daemon thread)."""

    def __init__(self, url: str, channel: str, callback: Callable[[], None]) -> None:
        self.url = url
        self.channel = channel
        self.callback = callback
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="akrelay-redis-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        delay = 0.2
        while not self._halt.is_set():
            client = connect(self.url, health_check_interval=15)  # a silently dropped subscription shows
            pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self.channel)
                delay = 0.2
                # a wake-up after (re)subscribing: commits made while we were away are found by the followers
                self._fire()
                while not self._halt.is_set():
                    woken = pubsub.get_message(timeout=0.5) is not None
                    while woken and not self._halt.is_set():
                        self._fire()
                        # Under load a message comes per commit group: wait a little, then take every
                        # message that came meanwhile without blocking, and wake once more for all of them
                        # (the wake-up just fired may have looked before those commits).
                        self._halt.wait(WATCH_COALESCE)
                        woken = self._drain(pubsub)
            except (redis.exceptions.RedisError, OSError) as exc:
                log.debug("commit channel %s: %s; resubscribing", self.channel, exc)
                self._halt.wait(delay)
                delay = min(delay * 2, 5.0)
            finally:
                try:
                    pubsub.close()
                    client.close()
                except (redis.exceptions.RedisError, OSError):  # pragma: no cover
                    pass

    @staticmethod
    def _drain(pubsub: redis.client.PubSub) -> bool:
        """Read every message already there without waiting; whether there was any."""
        drained = False
        for _ in range(100_000):  # bounded: a message is read per turn
            if pubsub.get_message(timeout=0.0) is None:
                break
            drained = True
        return drained

    def _fire(self) -> None:
        try:
            self.callback()
        except Exception:  # noqa: BLE001 - a wake-up must not end the subscriber
            log.warning("commit watcher callback failed", exc_info=True)


def check_durability(store: RedisStore, *, accept_weak: bool = False) -> None:
    """Refuse a Redis whose *live* settings could lose an acknowledged acceptance.

    Needs ``appendonly yes`` and ``appendfsync always`` (read with ``CONFIG GET``:
    they can be changed at runtime, so the config file proves nothing). With
    ``accept_weak`` the operator has chosen less; a warning is logged instead.
    """
    where = describe(store.url)
    try:
        live = store.durability()
    except redis.exceptions.ResponseError as exc:
        if accept_weak:
            log.warning("cannot read the persistence settings of %s (%s); accepted by --accept-weak-durability", where, exc)
            return
        raise WeakDurability(
            f"cannot read the persistence settings of the Redis at {where}: CONFIG GET was refused ({exc}); "
            "a managed Redis often disables or renames CONFIG. Make sure it runs with the AOF on and "
            "appendfsync always, then start with --accept-weak-durability (AKRELAY_ACCEPT_WEAK_DURABILITY=1) "
            "to vouch for it"
        ) from None
    problems = []
    if live.get("appendonly") != "yes":
        problems.append(f"appendonly is {live.get('appendonly')!r} (the AOF is off): run CONFIG SET appendonly yes "
                        "and set it in redis.conf")
    if live.get("appendfsync") != "always":
        problems.append(f"appendfsync is {live.get('appendfsync')!r}: run CONFIG SET appendfsync always "
                        "and set it in redis.conf")
    if not problems:
        return
    message = (f"the Redis at {where} could lose acknowledged acceptances on a crash: " + "; ".join(problems))
    if accept_weak:
        log.warning("%s (accepted by --accept-weak-durability)", message)
        return
    raise WeakDurability(message + "; or start with --accept-weak-durability to accept weaker durability")

