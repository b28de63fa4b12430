"""The store's reconciliation view: precomputed fingerprints over ``(created_at, event hash)`` (issue 26).

Why: :class:`akrelay.protocol.reconcile.Reconciler` asks its :class:`~akrelay.protocol.reconcile.Storage`
for counts, items and fingerprints of index ranges. Building a sorted in-memory copy of
a 1M-event log for every request costs seconds; this view answers the same questions from
aggregates the store keeps current in the commit, so one question costs a bounded number
of aggregate reads plus an edge scan, whatever the size of the log.

The items are the records a peer can fetch: retained and not withheld. A record leaves the
set when it is withheld or removed and comes back when it is shown again.

Layout (every backend keeps the same facts): the items themselves, ordered by
``(created_at, hash)``, and per *level* a count and an id sum (modulo 2^256) per time
bucket ``created_at >> shift`` for the shifts in :data:`LEVELS`. Each level has 64 times
the span of the one below (:data:`FANOUT`), so the items below a key are the whole top
buckets before it, at most 63 buckets of each lower level, and the raw items of one
bottom bucket (:data:`LEVELS[0]` ms wide): about 7 small reads.

What bounds the work: every read of a :class:`StoreView` is charged to its ``budget`` (rows
read); past it the view raises :class:`ViewBudgetExceeded` (``invalid_request``), so a small
message never costs a large scan. The view also runs inside the backend's snapshot
(``recon_snapshot``) so that one message sees one state of the log.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import threading
import time
from contextlib import AbstractContextManager
from typing import Callable, Iterable, Iterator, Protocol, Sequence

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.reconcile import ALIGN_SHIFTS, Bound, Item, PackedItems, fingerprint

#: Bucket widths as shifts of ``created_at`` (ms): 256 ms, 16 s, 17 min, 18 h, 50 days, 8.7 years, 557 years;
#: the protocol's split alignments, so that a split at bucket boundaries reads only bucket rows.
LEVELS: tuple[int, ...] = ALIGN_SHIFTS
FANOUT = 64
_MOD = 2**256
#: Rows one message may read by default: enough for the largest honest message (a frame of
#: about 2,400 ranges, 150 of them split) at 1M items; a few seconds of one thread at most.
DEFAULT_BUDGET = 1_000_000
#: No item is later than this (``created_at`` is at most 2^53 - 1); keys past it stand for the end.
MAX_ITEM_TIMESTAMP = 2**53 - 1
#: The largest range read in one scan when the protocol is about to split or list it.
PREFETCH = 2048
#: Items the view reads forward from the last key it located before it jumps by the aggregates
#: instead: the bounds of one message ascend, and most of them lie a few items after the last.
SCAN_AHEAD = 64
#: A located key that is a multiple of 2^ALIGNED_SCAN ms with an empty id prefix (a bucket
#: boundary of a coarse split) is located by the aggregates at once: the items between it and
#: the last key are many, and a forward scan would be read in vain.
ALIGNED_SCAN = LEVELS[1]
_ZERO_ID = bytes(32)
#: Item sums are kept as eight 32-bit limbs where a backend can only add 64-bit integers (SQLite).
LIMBS = 8


class ViewBudgetExceeded(ProtocolError):
    """One message needs more store reads than its budget (a hostile or oversized message)."""

    def __init__(self, budget: int) -> None:
        super().__init__("invalid_request",
                         f"reconciliation message: answering it would read more than {budget:,} index rows; "
                         "send fewer ranges")


class ViewChanged(Exception):
    """The aggregates and the items disagree (a backend without snapshots changed under a message)."""


def to_limbs(total: int) -> list[int]:
    return [(total >> (32 * i)) & 0xFFFFFFFF for i in range(LIMBS)]


def from_limbs(limbs: Iterable[int]) -> int:
    a, b, c, d, e, f, g, h = limbs  # LIMBS, unrolled: this runs for every bucket row read
    return (a + (b << 32) + (c << 64) + (d << 96) + (e << 128) + (f << 160) + (g << 192) + (h << 224)) % _MOD


def id_value(ident: bytes) -> int:
    return int.from_bytes(ident, "little")


def bucket_deltas(items: Iterable[Item], sign: int) -> dict[tuple[int, int], tuple[int, int]]:
    """What adding (``sign=1``) or removing (``-1``) ``items`` changes per ``(shift, bucket)``: (count, id sum)."""
    out: dict[tuple[int, int], list[int]] = {}
    for ts, ident in items:
        value = id_value(ident)
        for shift in LEVELS:
            row = out.setdefault((shift, ts >> shift), [0, 0])
            row[0] += sign
            row[1] += sign * value
    return {k: (v[0], v[1]) for k, v in out.items()}


class ReconIndex(Protocol):
    """What a backend provides for the view (each method reads a bounded range)."""

    def recon_snapshot(self) -> AbstractContextManager[None]:
        """One consistent state of the index for the reads inside it."""
        ...

    def recon_buckets(self, shift: int, lo: int, hi: int | None) -> list[tuple[int, int, int]]:
        """``(bucket, count, id sum)`` of the non-empty buckets ``lo <= bucket < hi`` (``None``: no upper end), ascending."""
        ...

    def recon_items(self, lo: Item, hi: Item | None, limit: int) -> list[Item]:
        """Up to ``limit`` items with ``lo <= item < hi`` (``None``: no upper end), ascending."""
        ...

    def recon_counts(self, shift: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """``(bucket, count)`` of the non-empty buckets ``lo <= bucket < hi``: what a descent needs."""
        ...

    def recon_sum(self, shift: int, lo: int, hi: int) -> tuple[int, int]:
        """(count, id sum) of the buckets ``lo <= bucket < hi`` together (a backend may add them up itself)."""
        ...

    def recon_sums(self, spans: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
        """:meth:`recon_sum` of each ``(shift, lo, hi)`` of ``spans``, in one read where the backend can."""
        ...

    # Optional: ``recon_columns(since, until) -> (array("Q") of timestamps, bytes of ids)``, the
    # items with ``since <= created_at < until`` in key order as two columns, for a copy of the set
    # read in one statement (SQLite); a backend without it is copied a page of items at a time.
    # Optional: ``recon_news(after_seq, limit) -> [(seq, item or None)]``, the records after a seq
    # as items (``None``: withheld), for a kept copy's catch-up without parsing envelopes (SQLite);
    # otherwise it reads the store's ``iter_records``.


class BucketSums:
    """``recon_counts`` and ``recon_sum`` from ``recon_buckets``, for backends that cannot add limbs themselves."""

    def recon_buckets(self, shift: int, lo: int, hi: int | None) -> list[tuple[int, int, int]]:
        raise NotImplementedError

    def recon_counts(self, shift: int, lo: int, hi: int) -> list[tuple[int, int]]:
        return [(b, n) for b, n, _ in self.recon_buckets(shift, lo, hi)]

    def recon_sum(self, shift: int, lo: int, hi: int) -> tuple[int, int]:
        rows = self.recon_buckets(shift, lo, hi)
        return sum(r[1] for r in rows), sum(r[2] for r in rows) % _MOD

    def recon_sums(self, spans: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
        return [self.recon_sum(*span) for span in spans]


class StoreView:
    """A :class:`~akrelay.protocol.reconcile.Storage` over a :class:`ReconIndex`, for one message.

    ``since`` / ``until`` narrow the set to ``since <= created_at < until`` (a filter of
    the endpoint); both sides of a reconciliation must use the same narrowing.
    """

    def __init__(self, index: ReconIndex, *, budget: int = DEFAULT_BUDGET,
                 since: int | None = None, until: int | None = None) -> None:
        self.index = index
        self.budget = budget
        self.reads = 0
        self._top: list[tuple[int, int, int]] | None = None
        #: index -> (item, sum of the ids before it)
        self._selected: dict[int, tuple[Item, int]] = {}
        #: key -> (count before, sum before)
        self._prefixes: dict[tuple[int, bytes], tuple[int, int]] = {}
        self._sums: dict[int, int] = {0: 0}
        self._count_cache: dict[tuple[int, int], list[tuple[int, int]]] = {}
        #: prefetched ranges: (first index, their items, the id sums before each and after the last)
        self._windows: list[tuple[int, list[Item], list[int]]] = []
        #: the last key located: (key, count below it, id sum below it), over the whole index
        self._cursor: tuple[tuple[int, bytes], int, int] | None = None
        #: the items the last forward scan read: (view index of the first, their items)
        self._scan: tuple[int, list[Item]] | None = None
        #: view index -> a key whose first item at or above it is that index's item
        self._anchors: dict[int, tuple[int, bytes]] = {}
        self._base = (0, 0)
        base = self._prefix((since, b"")) if since is not None else (0, 0)
        end = self._prefix((until, b"")) if until is not None else self._total()
        self._base = base
        self._size = max(0, end[0] - base[0])
        self._sums = {0: 0, self._size: (end[1] - base[1]) % _MOD}

    # -- budgeted reads ----------------------------------------------------------------------
    def _charge(self, rows: int) -> None:
        self.reads += rows + 1
        if self.reads > self.budget:
            raise ViewBudgetExceeded(self.budget)

    def _buckets(self, shift: int, lo: int, hi: int | None) -> list[tuple[int, int, int]]:
        if hi is not None and hi <= lo:
            return []
        rows = self.index.recon_buckets(shift, lo, hi)
        self._charge(len(rows))
        return rows

    def _items(self, lo: Item, hi: Item | None, limit: int) -> list[Item]:
        room = max(0, self.budget - self.reads)
        # never read more than the budget has left (plus one row, which then breaks it)
        rows = self.index.recon_items(lo, hi, min(limit, room + 1))
        self._charge(len(rows))
        return rows

    def _counts(self, shift: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """``(bucket, count)`` of the non-empty buckets of one parent (read once per message): what a descent walks."""
        key = (shift, lo)
        rows = self._count_cache.get(key)
        if rows is None:
            rows = self.index.recon_counts(shift, lo, hi)
            self._charge(len(rows))
            self._count_cache[key] = rows
        return rows

    def _top_rows(self) -> list[tuple[int, int, int]]:
        if self._top is None:
            self._top = self._buckets(LEVELS[-1], 0, None)
        return self._top

    def _total(self) -> tuple[int, int]:
        rows = self._top_rows()
        return sum(r[1] for r in rows), sum(r[2] for r in rows) % _MOD

    def _prefix(self, key: tuple[int, bytes]) -> tuple[int, int]:
        """(count, id sum) of the whole index's items below ``key``."""
        cached = self._prefixes.get(key)
        if cached is not None:
            return cached
        ts, ident = key
        if ts > MAX_ITEM_TIMESTAMP:  # beyond every item (e.g. the protocol's infinity): the whole index
            return self._total()
        if ident == _ZERO_ID:
            ident = b""  # no id sorts below it: the same items are below, and no edge scan is needed
        count = total = 0
        top = LEVELS[-1]
        for bucket, n, s in self._top_rows():
            if bucket >= ts >> top:
                break
            count += n
            total += s
        spans = []
        for level in range(len(LEVELS) - 2, -1, -1):
            shift, parent = LEVELS[level], LEVELS[level + 1]
            lo, hi = (ts >> parent) << (parent - shift), ts >> shift
            if lo < hi:
                spans.append((shift, lo, hi))
        if spans:
            # one aggregate over at most FANOUT rows per level, added up by the backend, in one read
            self._charge(len(spans) * FANOUT // 8)
            for n, s in self.index.recon_sums(spans):
                count += n
                total += s
        low = (ts >> LEVELS[0]) << LEVELS[0]
        if (ts, ident) > (low, b""):
            # the edge: the raw items of one bottom bucket below the key
            for _, i in self._items((low, b""), (ts, ident), self.budget):
                count += 1
                total += id_value(i)
        out = (count, total % _MOD)
        self._prefixes[key] = out
        return out

    def _select(self, index: int) -> tuple[Item, int]:
        """The item at ``index`` of the view and the id sum of the view's items before it."""
        hit = self._selected.get(index)
        if hit is not None:
            return hit
        if self._windows:
            begin, rows, sums = self._windows[-1]
            if begin <= index < begin + len(rows):
                return rows[index - begin], sums[index - begin] % _MOD
        if not 0 <= index < self._size:
            raise IndexError(index)
        remaining = index + self._base[0]
        chosen = None
        for bucket, n, _ in self._top_rows():
            if remaining < n:
                chosen = bucket
                break
            remaining -= n
        if chosen is None:
            raise ViewChanged("an index beyond the aggregates")
        for level in range(len(LEVELS) - 2, -1, -1):
            shift, span = LEVELS[level], LEVELS[level + 1] - LEVELS[level]
            lo = chosen << span
            parent, chosen = chosen, None
            for bucket, n in self._counts(shift, lo, (parent + 1) << span):
                if remaining < n:
                    chosen = bucket
                    break
                remaining -= n
            if chosen is None:
                raise ViewChanged("a bucket holds fewer items than its count")
        low = chosen << LEVELS[0]
        # one item more: a split asks for the items on both sides of each boundary
        items = self._items((low, b""), ((chosen + 1) << LEVELS[0], b""), remaining + 2)
        if len(items) <= remaining:
            raise ViewChanged("a bucket holds fewer items than its count")
        item = items[remaining]
        # the counts found the item; its sum comes from the level sums below it (one read), not the rows walked
        result = (item, (self._prefix(item)[1] - self._base[1]) % _MOD)
        self._selected[index] = result
        self._sums[index] = result[1]
        if remaining and index - 1 not in self._selected:
            prev = items[remaining - 1]
            prev_sum = (result[1] - id_value(prev[1])) % _MOD
            self._selected[index - 1] = (prev, prev_sum)
            self._sums[index - 1] = prev_sum
        if len(items) > remaining + 1 and index + 1 < self._size and index + 1 not in self._selected:
            next_sum = (result[1] + id_value(item[1])) % _MOD
            self._selected[index + 1] = (items[remaining + 1], next_sum)
            self._sums[index + 1] = next_sum
        return result

    def _sum_before(self, index: int) -> int:
        known = self._sums.get(index)
        if known is not None:
            return known
        if self._windows:
            begin, rows, sums = self._windows[-1]
            if begin <= index <= begin + len(rows):
                return sums[index - begin] % _MOD
        return self._select(index)[1]

    def prefetch(self, begin: int, end: int) -> None:
        """Read a range of at most :data:`PREFETCH` items in one scan: its items, bounds and sums are then known."""
        if end - begin > PREFETCH or end - begin < 2 or (begin in self._selected and end - 1 in self._selected):
            return
        if self._windows and self._windows[-1][0] <= begin and end <= self._windows[-1][0] + len(self._windows[-1][1]):
            return
        scan = self._scan
        if scan is not None and scan[0] <= begin and end <= scan[0] + len(scan[1]):
            # the forward scan that located ``end`` read these items already
            rows = scan[1][begin - scan[0]:end - scan[0]]
            before = self._sum_before(begin)
        else:
            if self.budget - self.reads < 4 * (end - begin):
                return  # near the end of the budget: the item-by-item descent reads less for a few bounds
            rows = self._read_from(begin, end - begin)
            before = self._sum_before(begin)
        sums = list(itertools.accumulate([int.from_bytes(i, "little") for _, i in rows], initial=before))
        self._windows.append((begin, rows, sums))

    def _read_from(self, begin: int, count: int) -> list[Item]:
        """The ``count`` items from view index ``begin`` on, in one scan (from a located key when there is one)."""
        anchor = self._anchors.get(begin)
        start = anchor if anchor is not None else self._select(begin)[0]
        rows = self._items(start, None, count)
        if len(rows) != count:
            raise ViewChanged("fewer items than counted")
        return rows

    def _in_window(self, key: tuple[int, bytes]) -> int | None:
        """The view index of ``key`` if it falls inside the last prefetched range (else ``None``)."""
        begin, rows, _ = self._windows[-1]
        if rows[0] < key <= rows[-1]:
            return begin + bisect.bisect_left(rows, key)
        return None

    def _locate(self, key: tuple[int, bytes]) -> tuple[int, int]:
        """(count, id sum) of the whole index's items below ``key``: a short scan on from the last key
        located when ``key`` follows it closely (the bounds of one message ascend), else :meth:`_prefix`."""
        cursor = self._cursor
        aligned = key[1] == _ZERO_ID and not key[0] & ((1 << ALIGNED_SCAN) - 1)
        if cursor is not None and cursor[0] <= key and key[0] <= MAX_ITEM_TIMESTAMP and not aligned:
            start, count, total = cursor
            if start == key:
                return count, total
            rows = self._items(start, key, SCAN_AHEAD)
            if len(rows) < SCAN_AHEAD:  # every item between the two keys: no aggregate needed
                self._scan = (count - self._base[0], rows)
                for _, i in rows:
                    total += id_value(i)
                out = (count + len(rows), total % _MOD)
                self._cursor = (key, *out)
                return out
        out = self._prefix(key)
        self._cursor = (key, *out)
        return out

    def aligned_splits(self, lower: int, upper: int, low: Bound, high: Bound,
                       parts: int) -> list[tuple[Bound, int]] | None:
        """:func:`akrelay.protocol.reconcile.aligned_splits` from the bucket rows: no item is read.

        From the top level down, the non-empty buckets of the range (within those of the
        level above) until they span ``parts`` buckets; the boundaries are the starts of those
        buckets, their indices one exact prefix (an aligned key: no edge scan) plus the counts
        of the buckets between. ``None`` (split by counts) when no level spans enough.
        """
        count = upper - lower
        if count < 2:
            return None
        lo_key, hi_key = low.key(), high.key()
        if self._base != (0, 0) or self._size != self._total()[0]:
            return None  # a narrowed view (since / until): its edge buckets hold items outside it
        top = LEVELS[-1]
        rows = [r for r in self._top_rows() if lo_key[0] >> top <= r[0] <= min(hi_key[0], MAX_ITEM_TIMESTAMP) >> top]
        chosen: tuple[int, list[tuple[int, int, int]]] | None = None
        for level in range(len(LEVELS) - 1, -1, -1):
            shift = LEVELS[level]
            if level < len(LEVELS) - 1:
                if not rows:
                    return None
                up = LEVELS[level + 1] - shift
                lo = max(rows[0][0] << up, lo_key[0] >> shift)
                hi = min((rows[-1][0] + 1) << up, (min(hi_key[0], MAX_ITEM_TIMESTAMP) >> shift) + 1)
                if hi - 1 - lo < parts:
                    if not level:
                        return None
                    # these buckets cannot span enough: no read, the next level down within the same span
                    rows = [(lo, 0, 0), (hi - 1, 0, 0)]
                    continue
                rows = self._buckets(shift, lo, hi)
            if rows and rows[-1][0] - rows[0][0] >= parts:
                chosen = shift, rows
                break
        if chosen is None:
            return None
        shift, rows = chosen
        # the bucket starts strictly inside the range, each with the count and id sum below it
        starts = [r for r in rows if (r[0] << shift, b"") > lo_key and (r[0] << shift, _ZERO_ID) < hi_key]
        if not starts:
            return None
        n, total = self._prefix((starts[0][0] << shift, b""))
        candidates: list[tuple[int, int, int]] = []
        for bucket, bn, bs in starts:
            candidates.append((bucket << shift, n - self._base[0], total))
            n += bn
            total += bs
        out: list[tuple[Bound, int]] = []
        previous, j = lower, 0
        for k in range(1, parts):
            target = lower + k * count // parts
            while j + 1 < len(candidates) and candidates[j + 1][1] <= target:
                j += 1
            ts, index, below = candidates[j]
            if previous < index <= target:  # so below upper
                out.append((Bound(ts), index))
                self._sums[index] = (below - self._base[1]) % _MOD
                self._anchors.setdefault(index, (ts, b""))
                previous = index
        return out or None

    # -- the Storage protocol ------------------------------------------------------------------
    def size(self) -> int:
        return self._size

    def state(self) -> tuple[int, int]:
        """The view's item count and id sum: what a copy of it must still match to stand for it."""
        return self._size, self._sums[self._size]

    def item(self, index: int) -> Item:
        return self._select(index)[0]

    def lower_bound(self, first: int, last: int, bound: Bound) -> int:
        key = bound.key()
        found = self._in_window(key) if self._windows else None
        if found is not None:
            begin, _, sums = self._windows[-1]
            self._cursor = (key, found + self._base[0], (sums[found - begin] + self._base[1]) % _MOD)
            return min(max(found, first), last)
        count, total = self._locate(key)
        index = count - self._base[0]
        if index <= first:
            return first
        if index >= last:
            return last
        self._sums.setdefault(index, (total - self._base[1]) % _MOD)
        self._anchors.setdefault(index, key)
        return index

    def fingerprint(self, begin: int, end: int) -> bytes:
        return fingerprint(self._sum_before(end) - self._sum_before(begin), end - begin)

    def ids(self, begin: int, end: int) -> Sequence[bytes]:
        if end <= begin:
            return []
        scan = self._scan
        if scan is not None and scan[0] <= begin and end <= scan[0] + len(scan[1]):
            return [i for _, i in scan[1][begin - scan[0]:end - scan[0]]]
        hit = self._selected.get(begin)
        rows = self._items(hit[0], None, end - begin) if hit is not None else self._read_from(begin, end - begin)
        if len(rows) != end - begin:
            raise ViewChanged("fewer items than counted")
        return [i for _, i in rows]


#: Items an initiator copies into memory for one reconciliation (:func:`snapshot_items`) at most:
#: about 50 MB at 1M (63 MB at peak while SQLite's columns are copied, 95 MB where pages are); a larger set is
#: read from the aggregates every round instead.
SNAPSHOT_CAP = 2_000_000
#: Items read from the index in one page while copying it.
SNAPSHOT_PAGE = 50_000


#: The initiator copies its set once the rows its rounds have read from the aggregates reach
#: this multiple of the set's size (:class:`OwnSet`), and a responder likewise over the last
#: minute (:class:`ResponderCopy`). Measured on SQLite at 1M items: with 10,000 differences, 1
#: rather than 2 cut the initiator's CPU from 11.5 to 8.7 s and the responder's from 9.2 to
#: 6.7 s; with 1,000 it changed nothing (2.5 and 2.0 s), while 0.5 bought copies those
#: rounds never repay (4.2 and 3.8 s). A reconciliation of few differences never copies.
COPY_AFTER = 1.0


def snapshot_items(index: ReconIndex, *, since: int | None = None, until: int | None = None,
                   cap: int = SNAPSHOT_CAP) -> PackedItems | None:
    """Our own items in ``[since, until)`` copied into memory once, or ``None`` past ``cap`` items.

    Why: the initiator's side of a round over :class:`StoreView` locates every bound of the
    peer's message in the aggregates (hundreds of reads a round when differences are many);
    over a copy each costs a bisection. The copy is read inside one snapshot, in pages of
    :data:`SNAPSHOT_PAGE` in key order, so it is one state of the log; what arrives later is
    reconciled next time. A responder copies through :class:`ResponderCopy`.
    """
    with index.recon_snapshot():
        return _copy(index, since, until, StoreView(index, since=since, until=until).size(), cap)


def _copy(index: ReconIndex, since: int | None, until: int | None, size: int, cap: int) -> PackedItems | None:
    """The copy of :func:`snapshot_items`, read inside the caller's snapshot.

    A backend that can read the set as two columns in one statement (``recon_columns``,
    optional) hands them over whole; otherwise, or if they do not come in order, the
    items are read in pages.
    """
    if size > cap:
        return None
    columns = getattr(index, "recon_columns", None)
    if columns is not None:
        times, ids = columns(since, until)
        if len(times) > cap:
            return None
        try:
            return PackedItems.from_columns(times, ids)
        except ValueError:
            pass  # not in key order: read the pages below
    hi: Item | None = (until, b"") if until is not None else None
    start: Item = (since if since is not None else 0, b"")

    def pages() -> Iterator[list[Item]]:
        # one page of tuples alive at a time: the copy's peak is about its packed size plus a page;
        # whole pages, flattened in C by chain.from_iterable (a generator step per item costs 0.2 us)
        lo, first, read = start, True, 0
        while True:
            page = index.recon_items(lo, hi, SNAPSHOT_PAGE + (0 if first else 1))
            rows = page if first else page[1:]  # each later page starts at the last item of the one before
            read += len(rows)
            if read > cap:
                raise _TooLarge
            yield rows
            if len(rows) < SNAPSHOT_PAGE:
                return
            lo, first = page[-1], False

    try:
        return PackedItems(itertools.chain.from_iterable(pages()))
    except _TooLarge:
        return None


class _TooLarge(Exception):
    """The set grew past the cap while it was copied (a backend without snapshots)."""


class KeptSet(Protocol):
    """What :class:`OwnSet` asks of a process's kept copy (:class:`akrelay.store.recon_copy.KeptCopy`)."""

    def current(self, view: StoreView) -> PackedItems | None:
        """The copy if it is the set ``view`` reads, else ``None``."""
        ...


class OwnSet:
    """The initiator's own set for one reconciliation: its aggregates while that is cheap, then a copy.

    :meth:`storage` is called inside ``index.recon_snapshot()`` once per step. It answers
    from a fresh :class:`StoreView` until the views' reads add up to :data:`COPY_AFTER`
    times the set's size, then copies the set (:func:`snapshot_items`, at most ``cap``
    items) and answers every later step from memory. At 200k items, 1 difference read
    6,000 rows and 100 read 118,000 (no copy); 2,000 read 1.4M over 26 rounds without one.
    """

    def __init__(self, index: ReconIndex, *, since: int | None = None, until: int | None = None,
                 cap: int = SNAPSHOT_CAP, copy_after: float = COPY_AFTER, kept: KeptSet | None = None) -> None:
        """``kept``: the process's kept copy (:mod:`akrelay.store.recon_copy`), used for the whole session if it is
        current at the first step."""
        self.index, self.since, self.until, self.cap, self.copy_after = index, since, until, cap, copy_after
        self.kept = kept if since is None and until is None else None
        self.copy: PackedItems | None = None
        #: rows read by the views so far (the copy's own reads not counted)
        self.view_reads = 0
        self._view: StoreView | None = None
        self._too_large = False
        self._steps = 0
        #: (step, deferred, view_reads) when a step last left part of the set for later
        self._mark: tuple[int, int, int] | None = None

    def storage(self, deferred: int = 0) -> StoreView | PackedItems:
        """The set to answer the next step from; ``deferred``: the last step's ``Outcome.deferred``."""
        if self.copy is not None:
            return self.copy
        if self.kept is not None:
            # asked once, at the first step (the initiator brought it up to date just before): a copy
            # that is not the set then stays out of this session, rather than being tried every round
            kept, self.kept = self.kept.current(StoreView(self.index)), None
            if kept is not None:
                self.copy = kept
                return kept
        view = self._view
        if view is not None:
            self.view_reads += view.reads
            self._steps += 1
            size = view.size()
            if not self._too_large and self.view_reads + self._ahead(deferred) >= self.copy_after * size:
                self.copy = _copy(self.index, self.since, self.until, size, self.cap)
                self._too_large = self.copy is None
                if self.copy is not None:
                    self._view = None
                    return self.copy
        self._view = StoreView(self.index, since=self.since, until=self.until)
        return self._view

    def _ahead(self, deferred: int) -> int:
        """The rows the views can be expected to read in the steps still ahead.

        Why: a reconciliation of many differences is a sweep through the set, a frame at a
        time; each full frame leaves what follows its last range to the next (``deferred``).
        How fast that part shrinks, against how many rows the views read meanwhile, tells
        how many rows are still ahead, so the copy is bought when the sweep starts, not once
        its reads have paid for it (measured at 1M: 10,000 differences take 49 steps, and
        the copy comes at step 7 instead of 19). Until the deferred part has shrunk once,
        nothing is assumed ahead. A peer that shapes its answers to look like a long sweep
        gains nothing: it costs us at most the one copy a session may make anyway. The
        responder keeps to its reads (:class:`ResponderCopy`): there, a forecast that a few
        cheap messages could steer would buy a copy for every state of the set.
        """
        if deferred <= 0:
            return 0
        mark = self._mark
        self._mark = (self._steps, deferred, self.view_reads)
        if mark is None or deferred >= mark[1]:
            return 0
        steps = self._steps - mark[0]
        shrink = (mark[1] - deferred) / steps
        reads = (self.view_reads - mark[2]) / steps
        return int(deferred / shrink * reads)


#: Seconds without a message after which a responder's copy is given back (at the next message),
#: and over which the views' reads are added up towards :data:`COPY_AFTER`.
RESPONDER_IDLE = 60.0


class ResponderCopy:
    """The whole set copied into memory while it stays the same, for the answers of a large reconciliation.

    Why: a responder answers each message from a fresh :class:`StoreView`, several index reads
    per bound; a reconciliation of thousands of differences sends a hundred thousand bounds.
    Once the views' reads over the last :data:`RESPONDER_IDLE` seconds add up to
    :data:`COPY_AFTER` times the set's size, the message that crosses it copies the set
    (:func:`_copy`, at most ``cap`` items, about 50 bytes an item), and later messages are
    answered from the copy for as long as the set's count and id sum are those it was copied
    at (one read each time). This is no state between rounds: it is the same answer, from a
    cache of the index that any peer's messages share; a change of the set, or a quiet
    :data:`RESPONDER_IDLE` seconds, drops it at the next message. Only the whole set is
    copied (a ``since`` / ``until`` window is answered from the view). Thread-safe: one thread
    copies while the others go on answering from their views.
    """

    def __init__(self, *, copy_after: float = COPY_AFTER, cap: int = SNAPSHOT_CAP, idle: float = RESPONDER_IDLE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.copy_after, self.cap, self.idle, self.clock = copy_after, cap, idle, clock
        self._lock = threading.Lock()
        self._copy: PackedItems | None = None
        self._state: tuple[int, int] | None = None
        self._reads = 0
        self._last = float("-inf")
        #: copies made, and messages answered from a copy (for tests and the operator's curiosity)
        self.copies = 0
        self.answered = 0

    def storage(self, index: ReconIndex, view: StoreView) -> StoreView | PackedItems:
        """What to answer one message from (inside ``index.recon_snapshot()``): the copy if it is current, else ``view``."""
        now = self.clock()
        state = view.state()
        with self._lock:
            if now - self._last > self.idle or state != self._state:
                self._copy, self._state, self._reads = None, state, 0
            self._last = now
            if self._copy is not None:
                self.answered += 1
                return self._copy
            due = self._reads >= self.copy_after * view.size() and 0 < view.size() <= self.cap
        if not due or not self._lock.acquire(blocking=False):
            return view
        try:  # this thread copies; others keep answering from their views meanwhile
            if self._copy is not None and self._state == state:  # another thread copied meanwhile
                return self._copy
            copy = _copy(index, None, None, view.size(), self.cap)
            if copy is None or copy.size() != view.size():
                return view
            self._copy, self.copies, self.answered = copy, self.copies + 1, self.answered + 1
            return copy
        finally:
            self._lock.release()

    def spent(self, view: StoreView) -> None:
        """Count the reads a view made answering a message (towards the copy)."""
        with self._lock:
            self._reads += view.reads


class MemoryReconIndex(BucketSums):
    """The index held in memory (the memory store's, and a readable statement of the layout)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._items: list[Item] = []
        self._members: set[Item] = set()
        #: per shift: bucket -> [count, id sum], and the sorted bucket numbers
        self._buckets: dict[int, dict[int, list[int]]] = {shift: {} for shift in LEVELS}
        self._keys: dict[int, list[int]] = {shift: [] for shift in LEVELS}

    def recon_snapshot(self) -> AbstractContextManager[None]:
        @contextlib.contextmanager
        def held() -> Iterator[None]:
            with self._lock:
                yield

        return held()

    def add(self, items: Iterable[Item]) -> None:
        self._apply([i for i in items], 1)

    def discard(self, items: Iterable[Item]) -> None:
        self._apply([i for i in items], -1)

    def _apply(self, items: list[Item], sign: int) -> None:
        with self._lock:
            changed = []
            for item in items:
                if (item in self._members) == (sign > 0):
                    continue  # already there / already gone: idempotent
                changed.append(item)
                if sign > 0:
                    self._members.add(item)
                    bisect.insort(self._items, item)
                else:
                    self._members.discard(item)
                    del self._items[bisect.bisect_left(self._items, item)]
            for (shift, bucket), (n, s) in bucket_deltas(changed, sign).items():
                rows = self._buckets[shift]
                row = rows.get(bucket)
                if row is None:
                    row = rows[bucket] = [0, 0]
                    bisect.insort(self._keys[shift], bucket)
                row[0] += n
                row[1] += s
                if row[0] == 0:
                    del rows[bucket]
                    keys = self._keys[shift]
                    del keys[bisect.bisect_left(keys, bucket)]

    def recon_buckets(self, shift: int, lo: int, hi: int | None) -> list[tuple[int, int, int]]:
        with self._lock:
            keys = self._keys[shift]
            start = bisect.bisect_left(keys, lo)
            end = len(keys) if hi is None else bisect.bisect_left(keys, hi)
            rows = self._buckets[shift]
            return [(b, rows[b][0], rows[b][1] % _MOD) for b in keys[start:end]]

    def recon_items(self, lo: Item, hi: Item | None, limit: int) -> list[Item]:
        with self._lock:
            start = bisect.bisect_left(self._items, lo)
            end = len(self._items) if hi is None else bisect.bisect_left(self._items, hi)
            return self._items[start:min(end, start + max(0, limit))]
