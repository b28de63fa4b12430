"""The reconciliation index in Redis (issue 26; layout in :mod:`akrelay.store.recon`).

Keys under the store's prefix: ``rc:items`` (a sorted set of members ``created_at`` as 8
big-endian bytes + the 32-byte hash, all at score 0, so lexicographic order is the items'
order), per level ``rc:b:SHIFT`` (a hash: ``BUCKET:n`` and ``BUCKET:0``..``BUCKET:7``, the
count and the id sum as 32-bit limbs, added with ``HINCRBY``) and ``rc:k:SHIFT`` (the
non-empty buckets, scored by number, for range reads).

Why a follower in the commit path, as the Merkle log here: the commit script stays as it
is, and every node runs :meth:`RedisReconIndex.catch_up` right after its commits (and
before a view is read), adding what was committed after ``rc:seq``. Adding and removing
are idempotent (a member already there or already gone changes no aggregate), so nodes
racing each other, a crash between a commit and its catch-up, and the back-fill of an
existing deployment (``rc:seq`` absent: everything) are all the same operation. The view
is therefore bounded to the records up to ``rc:seq``; withholding and removal update it
directly. Redis has no read snapshot across calls: a view that sees the index change under
it raises ``ViewChanged`` and the endpoint answers 503 (retry).
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol, Sequence, TypeVar, cast

from redis.typing import EncodableT

from akrelay.protocol.reconcile import Item
from akrelay.store.base import Record, event_hash_bytes
from akrelay.store.recon import LEVELS, LIMBS, BucketSums, from_limbs, id_value, to_limbs
from akrelay.store.redis.scripts import lua

if TYPE_CHECKING:  # annotations only
    import redis

log = logging.getLogger("akrelay.store")
T = TypeVar("T")


class StoreCall(Protocol):
    """The store's outage handling (:meth:`RedisStore._call`): runs ``fn`` and returns its reply."""

    def __call__(self, fn: Callable[[], T], *, name: str = ...) -> T: ...


class LogReader(Protocol):
    """What the index reads of its :class:`~akrelay.store.redis.store.RedisStore` (named here, not imported: no cycle)."""

    prefix: str

    def get(self, event_id: str) -> Record | None: ...

    def iter_records(self, after_seq: int, limit: int) -> list[Record]: ...

#: Records one catch-up step reads; a view waits for at most :data:`CATCH_UP_LIMIT` of them.
CATCH_UP_BATCH = 1000
CATCH_UP_LIMIT = 20000
#: Items one script call adds or removes: small, so that no call holds Redis (or waits for it) long.
#: recon_apply.lua sums a call's limbs per bucket in Lua doubles: exact while APPLY_CHUNK * 2^32 < 2^53.
APPLY_CHUNK = 100
assert APPLY_CHUNK < 2 ** 21

_APPLY = lua("recon_apply")

_BUCKETS = lua("recon_buckets")

#: A descent's bucket counts without their id sums (one field a bucket instead of nine).
_COUNTS = lua("recon_counts")

#: Several spans' buckets in one call (a prefix's level sums): per span its bucket count, then n and the
#: limbs of each bucket; added up in Python (Lua's numbers are doubles, which the limb sums may outgrow).
_SPANS = lua("recon_spans")

_ADVANCE = lua("recon_advance")


def member(item: Item) -> bytes:
    ts, ident = item
    return ts.to_bytes(8, "big") + ident


class RedisReconIndex(BucketSums):
    """:class:`akrelay.store.recon.ReconIndex` over a :class:`RedisStore`'s client (through its outage handling)."""

    def __init__(self, store: LogReader, client: redis.Redis, call: StoreCall) -> None:
        """``call`` is the store's outage handling (:meth:`RedisStore._call`); ``client`` its connection."""
        self.store = store
        self.prefix = store.prefix
        self._client = client
        self._store_call = call
        self._apply_script = client.register_script(_APPLY)
        self._buckets_script = client.register_script(_BUCKETS)
        self._counts_script = client.register_script(_COUNTS)
        self._advance_script = client.register_script(_ADVANCE)
        self._spans_script = client.register_script(_SPANS)

    def _call(self, fn: Callable[[], T], name: str) -> T:
        return self._store_call(fn, name=name)

    # -- maintenance -----------------------------------------------------------------------------
    def _apply(self, items: Iterable[Item], add: bool) -> int:
        todo = list(items)
        return sum(self._apply_chunk(todo[k:k + APPLY_CHUNK], add) for k in range(0, len(todo), APPLY_CHUNK))

    def _apply_chunk(self, chunk: list[Item], add: bool) -> int:
        args: list[EncodableT] = [self.prefix, "1" if add else "0", len(LEVELS)]
        if not chunk:
            return 0
        args.append(len(chunk))
        for ts, ident in chunk:
            args.append(member((ts, ident)))
            limbs = to_limbs(id_value(ident))
            for shift in LEVELS:
                args += [shift, ts >> shift, *(v if add else -v for v in limbs)]
        script = self._apply_script
        return int(self._call(lambda: script(keys=[], args=args), "recon_apply"))

    def add(self, items: Iterable[Item]) -> int:
        return self._apply(items, True)

    def discard(self, items: Iterable[Item]) -> int:
        return self._apply(items, False)

    def indexed_seq(self) -> int:
        value = self._call(lambda: self._client.get(self.prefix + "rc:seq"), "recon_seq")
        return int(value) if value is not None else 0

    def catch_up(self, limit: int = CATCH_UP_LIMIT) -> int:
        """Add the fetchable records committed after ``rc:seq`` (at most ``limit``); how many were read."""
        after = self.indexed_seq()
        done = 0
        while done < limit:
            records = self.store.iter_records(after, min(CATCH_UP_BATCH, limit - done))
            if not records:
                break
            self.add((r.envelope.created_at, event_hash_bytes(r.id)) for r in records if not r.withheld)
            after = records[-1].seq
            done += len(records)
            script = self._advance_script
            self._call(lambda: script(keys=[], args=[self.prefix, after]), "recon_seq")
        if done >= CATCH_UP_BATCH:
            log.info("reconciliation index: caught up %d records (to seq %d)", done, after)
        return done

    def follow_withheld(self, event_id: str, withheld: bool) -> None:
        record = self.store.get(event_id)
        if record is None or record.seq > self.indexed_seq():
            return  # not retained, or not indexed yet: the catch-up reads its flag then
        item = (record.envelope.created_at, event_hash_bytes(event_id))
        self._apply([item], not withheld)

    # -- the ReconIndex protocol ---------------------------------------------------------------------
    def recon_snapshot(self) -> AbstractContextManager[None]:
        @contextlib.contextmanager
        def caught_up() -> Iterator[None]:
            self.catch_up()
            yield

        return caught_up()

    def recon_buckets(self, shift: int, lo: int, hi: int | None) -> list[tuple[int, int, int]]:
        script = self._buckets_script
        args: list[EncodableT] = [self.prefix, shift, lo, "+inf" if hi is None else f"({hi}"]
        flat = self._call(lambda: script(keys=[], args=args), "recon_buckets")
        out = []
        for k in range(0, len(flat), 2 + LIMBS):
            n = int(flat[k + 1])
            if n:
                out.append((int(flat[k]), n, from_limbs(int(v) for v in flat[k + 2:k + 2 + LIMBS])))
        return out

    def recon_counts(self, shift: int, lo: int, hi: int) -> list[tuple[int, int]]:
        script = self._counts_script
        flat = self._call(lambda: script(keys=[], args=[self.prefix, shift, lo, f"({hi}"]), "recon_counts")
        return [(int(flat[k]), n) for k in range(0, len(flat), 2) if (n := int(flat[k + 1]))]

    def recon_sums(self, spans: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
        if not spans:
            return []
        script = self._spans_script
        args: list[EncodableT] = [self.prefix, len(spans)]
        for span in spans:
            args += span
        flat = self._call(lambda: script(keys=[], args=args), "recon_sums")
        out, k = [], 0
        for _ in spans:
            rows, k = int(flat[k]), k + 1
            count = total = 0
            for _ in range(rows):
                count += int(flat[k])
                total += from_limbs([int(v) for v in flat[k + 1:k + 1 + LIMBS]])
                k += 1 + LIMBS
            out.append((count, total % (1 << 256)))
        return out

    def recon_items(self, lo: Item, hi: Item | None, limit: int) -> list[Item]:
        if limit <= 0:
            return []
        key = self.prefix + "rc:items"
        upper = b"+" if hi is None else b"(" + member(hi)
        lower = b"[" + member(lo)
        # the store's client answers bytes (it does not decode responses)
        rows = cast("list[bytes]", self._call(lambda: self._client.zrangebylex(key, lower, upper, start=0, num=limit),
                                              "recon_items"))
        return [(int.from_bytes(m[:8], "big"), bytes(m[8:])) for m in rows]
