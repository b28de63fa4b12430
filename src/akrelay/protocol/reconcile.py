"""Range-based set reconciliation (RBSR), wire-compatible with negentropy protocol V1.

Why: a relay that polls ``after_seq`` pulls each event once per peer it follows and never
asks again for an event it missed. Reconciling the two *sets* of events instead finds the
differences in a few round trips whose size grows with the number of differences, not with
the size of the logs, and the responder keeps no state between rounds.

The items of a set are ``(timestamp, id)``: the envelope's ``created_at`` and the 32 raw
bytes of its event hash, sorted by timestamp and then by id. A *range* of that order is
described by its exclusive upper :class:`Bound`; the sender gives for each range either
nothing to do (skip), a fingerprint of what it holds there, or the list of its ids. A
fingerprint is SHA-256 over the sum of the ids (32-byte little-endian integers, modulo
2^256) followed by the item count as a varint, cut to 16 bytes: it is additive, so a
:class:`Storage` can precompute it and answer any range in O(log n) or better.

Everything here is pure: :class:`Reconciler` turns one message into the next over a
:class:`Storage` the caller provides. What is bounded, and why (a peer may be hostile):
the size of every message produced (``frame_limit``), the size and the number of ranges of
every message accepted (:data:`MAX_MESSAGE`, :data:`MAX_RANGES`), and so the work one
message can cost a responder; a bound that goes backwards, a truncated message or a
varint past 64 bits is a :class:`ProtocolError` (``invalid_request``).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import operator
import struct
from array import array
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple, Protocol, Sequence

from akrelay.protocol.errors import ProtocolError

#: The protocol version byte (negentropy V1).
PROTOCOL_VERSION = 0x61
#: The reserved "infinity" timestamp, which no item may carry.
MAX_TIMESTAMP = 2**64 - 1
ID_SIZE = 32
FINGERPRINT_SIZE = 16

SKIP, FINGERPRINT, IDLIST = 0, 1, 2

#: Ranges a message is split into where it differs (when it is split by counts, see below).
DEFAULT_BUCKETS = 16
#: Timestamp alignments (shifts of ``created_at`` in ms) at which a differing range is split
#: when its items span more than one such bucket: the levels of the store's aggregates
#: (:data:`akrelay.store.recon.LEVELS`), so that a store-backed side can describe a split from
#: its bucket rows, and answer bounds ``(multiple of 2^shift, empty prefix)`` from them, with
#: no item read. Any other bound stays legal (a peer may split as it likes).
ALIGN_SHIFTS: tuple[int, ...] = (8, 14, 20, 26, 32, 38, 44)
#: The smallest frame limit (negentropy's): room for at least one bucket split and an id list.
MIN_FRAME_LIMIT = 4096
DEFAULT_FRAME_LIMIT = 60_000
#: The largest message accepted, and the most ranges in it: what one round may cost us.
MAX_MESSAGE = 256 * 1024
MAX_RANGES = 4096
#: Rounds an initiator takes at most: honest peers need about log16(n) / 2 + 1 (4 at 1M
#: items) plus one per frame of ids that differ (about 1,800 ids a frame at the default
#: limit); a peer that answers every id list with a new fingerprint would never finish.
MAX_ROUNDS = 256

_MOD = 2**256


def _bad(message: str) -> ProtocolError:
    return ProtocolError("invalid_request", f"reconciliation message: {message}")


Item = tuple[int, bytes]


class Bound(NamedTuple):
    """An exclusive upper bound: a timestamp and an id prefix (omitted bytes are zero).

    A named tuple, not a frozen dataclass: a message holds thousands of bounds, and a frozen
    dataclass costs about 2.7 us to make against 0.4 us for a tuple.
    """

    timestamp: int
    prefix: bytes = b""

    def key(self) -> tuple[int, bytes]:
        return self.timestamp, self.prefix.ljust(ID_SIZE, b"\0")


INFINITY = Bound(MAX_TIMESTAMP)
ZERO = Bound(0)


def minimal_bound(prev: Item, curr: Item) -> Bound:
    """The shortest bound that separates ``prev`` (below) from ``curr`` (at or above)."""
    if curr[0] != prev[0]:
        return Bound(curr[0])
    shared = 0
    for a, b in zip(prev[1], curr[1]):
        if a != b:
            break
        shared += 1
    return Bound(curr[0], curr[1][: shared + 1])


# ---- fingerprints -----------------------------------------------------------------------------

_ONE_BYTE = [bytes([n]) for n in range(0x80)]


def encode_varint(n: int) -> bytes:
    if 0 <= n < 0x80:  # modes, counts, prefix lengths and most timestamp deltas: one byte
        return _ONE_BYTE[n]
    if n < 0:
        raise ValueError("varints are unsigned")
    out = [n & 0x7F]
    n >>= 7
    while n:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(out))


def id_sum(ids: Iterable[bytes]) -> int:
    """The sum of ``ids`` as little-endian integers modulo 2^256 (a fingerprint's accumulator)."""
    total = 0
    for i in ids:
        total += int.from_bytes(i, "little")
    return total % _MOD


def fingerprint(total: int, count: int) -> bytes:
    """The fingerprint of a range from its id sum and item count."""
    digest = hashlib.sha256((total % _MOD).to_bytes(32, "little")
                            + (_ONE_BYTE[count] if count < 0x80 else encode_varint(count))).digest()
    return digest[:FINGERPRINT_SIZE]


#: Ranges with more items than this are split at bucket boundaries (:func:`aligned_splits`);
#: smaller ones by counts (a store-backed view reads such a range in one scan first).
ALIGN_ABOVE = 2048


def split_shift(first: int, last: int, parts: int) -> int | None:
    """The coarsest shift of :data:`ALIGN_SHIFTS` at which ``first`` and ``last`` lie ``parts`` buckets apart or more."""
    for shift in reversed(ALIGN_SHIFTS):
        if (last >> shift) - (first >> shift) >= parts:
            return shift
    return None


def aligned_splits(storage: "Storage", lower: int, upper: int, parts: int) -> list[tuple["Bound", int]] | None:
    """Where to split ``[lower, upper)`` into about ``parts`` ranges at bucket boundaries: ``(bound, index)``.

    Why: a store-backed view can then describe the split from its bucket rows (counts and id
    sums) without locating an item, and the other side answers such bounds the same way.
    At the shift of :func:`split_shift` (first and last items), the range is cut at the start
    of the bucket that holds the item at each ``lower + k * count // parts``: parts of about
    equal counts, each boundary ``(multiple of 2^shift, empty prefix)``. ``None`` when the
    items do not span enough buckets (a burst): the caller splits by counts.
    """
    count = upper - lower
    if count < 2:
        return None
    shift = split_shift(storage.item(lower)[0], storage.item(upper - 1)[0], parts)
    if shift is None:
        return None
    out: list[tuple[Bound, int]] = []
    previous = lower
    for k in range(1, parts):
        target = lower + k * count // parts
        bound = Bound((storage.item(target)[0] >> shift) << shift)
        index = storage.lower_bound(previous, target + 1, bound)
        if index > previous:
            out.append((bound, index))
            previous = index
    return out or None


# ---- storage ----------------------------------------------------------------------------------

class Storage(Protocol):
    """A sorted, immutable view of one side's items for the length of one message."""

    def size(self) -> int: ...

    def item(self, index: int) -> Item: ...

    def lower_bound(self, first: int, last: int, bound: Bound) -> int:
        """The first index in ``[first, last)`` whose item is at or above ``bound`` (``last`` if none)."""
        ...

    def fingerprint(self, begin: int, end: int) -> bytes: ...

    def ids(self, begin: int, end: int) -> Sequence[bytes]: ...

    # Optional: ``boundary(index)``, :func:`minimal_bound` of the items at ``index - 1`` and
    # ``index``, for a storage that can tell it without making both items.
    # Optional: ``prefetch(begin, end)``, called before a range is split or listed, lets a
    # view that reads from a store fetch a small range in one read instead of item by item.
    # Optional: ``aligned_splits(lower, upper, low, high, parts)`` (``low`` / ``high`` the
    # range's bounds) splits like :func:`aligned_splits`, for a view that can without reading items.


class SortedItems:
    """A :class:`Storage` over items held in memory, with prefix sums for O(1) fingerprints."""

    def __init__(self, items: Iterable[Item]) -> None:
        ordered = sorted(set(items))
        for ts, ident in ordered:
            if not _is_item(ts, ident):
                raise ValueError(f"not an item: ({ts!r}, {ident!r})")
        self._keys = ordered
        prefix = [0]
        total = 0
        for _, ident in ordered:
            total += int.from_bytes(ident, "little")
            prefix.append(total)
        self._prefix = prefix

    def size(self) -> int:
        return len(self._keys)

    def item(self, index: int) -> Item:
        return self._keys[index]

    def lower_bound(self, first: int, last: int, bound: Bound) -> int:
        return bisect.bisect_left(self._keys, bound.key(), first, last)

    def fingerprint(self, begin: int, end: int) -> bytes:
        return fingerprint(self._prefix[end] - self._prefix[begin], end - begin)

    def ids(self, begin: int, end: int) -> Sequence[bytes]:
        return [ident for _, ident in self._keys[begin:end]]


class PackedItems:
    """A :class:`Storage` over sorted items in two columns: about 50 bytes an item in memory.

    Why: an initiator reconciles its own set, which cannot change the answer of its peer, so
    it may copy the set once per reconciliation and answer every round from memory instead
    of from its store's aggregates (and a responder, while its set stays the same). A tuple
    per item (:class:`SortedItems`) costs about 230 bytes. Here the timestamps are one array
    of unsigned 64-bit integers (8 bytes each), so that a bound is located by a bisection in
    C, and the ids are one ``bytes`` (32 each).

    The id sums are kept per *chunk* of about :attr:`CHUNK` consecutive items, and within a
    chunk per *block* of about :attr:`STEP` items: the sum of all the ids before each block
    (a Python int: nothing to convert when it is read), so a fingerprint converts at most half
    a block of ids per end. Blocks are what make :meth:`merged` cheap: an item added joins the
    block it falls in, whose sum grows by the item's id alone (a block that grows past twice
    :attr:`STEP` is cut again, a chunk past twice :attr:`CHUNK` too), and the sums after it
    move by additions, with no id converted again, wherever the item falls.

    Both columns can be handed over whole (:meth:`from_columns`, what a store that can read
    them in one statement does), or built from items a batch of :attr:`BATCH` at a time with
    C-level checks. Either way the items are checked: ascending, distinct, each an item.
    """

    STEP = 8  # a built copy's blocks; inlined in _sum_before
    BATCH = 65_536
    CHUNK = 4096

    def __init__(self, items: Iterable[Item] = (), *, columns: tuple[array[int], bytes] | None = None,
                 _chunks: tuple[list[int], list[list[int] | None], list[list[int]]] | None = None) -> None:
        """``items`` ascending and distinct (as a store's index returns them); checked as they are packed.

        ``columns`` instead: see :meth:`from_columns` (``_chunks``: their sums, from :meth:`merged`).
        """
        if columns is not None:
            timestamps, joined = columns
            if not isinstance(timestamps, array) or timestamps.typecode != "Q" or not isinstance(joined, bytes) \
                    or len(joined) != ID_SIZE * len(timestamps):
                raise ValueError("not the columns of items: an array('Q') of timestamps and 32 bytes of id for each")
            if _chunks is not None:
                self._adopt(timestamps, joined, *_chunks)
            else:
                self._setup(timestamps, joined)
            return
        timestamps = array("Q")
        ids: list[bytes] = []
        source = iter(items)
        while True:
            batch = list(itertools.islice(source, self.BATCH))
            if not batch:
                break
            try:  # in C: a pair each, an unsigned 64-bit integer and 32 bytes
                if set(map(len, batch)) != {2}:
                    raise TypeError
                timestamps.extend(map(_FIRST, batch))  # refuses what is not an int of 64 bits or fewer
                if set(map(len, map(_SECOND, batch))) != {ID_SIZE}:
                    raise TypeError
                ids.append(b"".join(map(_SECOND, batch)))  # refuses text
            except (OverflowError, TypeError, ValueError):
                raise ValueError(f"not an item: {_first_bad(batch)!r}") from None
            del batch
        self._setup(timestamps, b"".join(ids))

    @classmethod
    def from_columns(cls, timestamps: array[int], ids: bytes) -> PackedItems:
        """The items whose timestamps are ``timestamps`` (an ``array("Q")``) and ids ``ids`` (32 bytes each), in that order."""
        return cls(columns=(timestamps, ids))

    def _setup(self, timestamps: array[int], ids: bytes) -> None:
        """Check the columns (ascending, distinct, no reserved timestamp) and keep the id sums."""
        n = len(timestamps)
        if n and timestamps[-1] >= MAX_TIMESTAMP:  # ascending: the last is the largest
            raise ValueError(f"not an item: the reserved timestamp {MAX_TIMESTAMP}")
        later = itertools.islice(timestamps, 1, None)
        if not all(map(operator.le, timestamps, later)):
            raise ValueError("items must be ascending and distinct")
        # where two items share a timestamp, their ids must ascend
        for k in itertools.compress(range(n - 1), map(operator.eq, timestamps, itertools.islice(timestamps, 1, None))):
            if ids[ID_SIZE * k:ID_SIZE * k + ID_SIZE] >= ids[ID_SIZE * k + ID_SIZE:ID_SIZE * k + 2 * ID_SIZE]:
                raise ValueError("items must be ascending and distinct")
        starts = list(range(0, n, self.CHUNK))
        sums: list[list[int]] = []
        base = 0
        for begin in starts:
            local = self._block_sums(ids, begin, min(n, begin + self.CHUNK))
            sums.append([base + v for v in local])
            base += local[-1]
        self._adopt(timestamps, ids, starts, [None] * len(starts), sums)

    def _adopt(self, timestamps: array[int], ids: bytes, starts: list[int], blocks: list[list[int] | None],
               sums: list[list[int]]) -> None:
        self._ts = timestamps
        self._ids = ids  # immutable: its slices are hashable ids
        self._size = len(timestamps)
        #: per chunk: its first index; where its blocks start, from its start (``None``: every
        #: STEP items, as built); the sum of all the ids before each block, and before its end
        self._starts, self._blocks, self._sums = starts, blocks, sums
        self._last = (0, 0, 0, 0)

    @classmethod
    def _block_sums(cls, ids: bytes, begin: int, end: int) -> list[int]:
        """The sums of the ids of ``[begin, end)`` before each STEP-th item from ``begin``, and before ``end``."""
        step, count = cls.STEP, end - begin
        # each id as four 64-bit limbs, unpacked in C; the running sums of each limb are small
        # ints, added in C too, and put together only at every STEP-th item (a third faster
        # than an int.from_bytes per id)
        words = struct.unpack_from(f"<{4 * count}Q", ids, ID_SIZE * begin)
        limbs = [list(itertools.accumulate(words[k::4], initial=0)) for k in range(4)]
        out = [a + (b << 64) + (c << 128) + (d << 192) for a, b, c, d in zip(*(limb[::step] for limb in limbs))]
        if count % step:
            a, b, c, d = (limb[-1] for limb in limbs)
            out.append(a + (b << 64) + (c << 128) + (d << 192))
        return out

    def merged(self, items: Iterable[Item]) -> PackedItems:
        """A new copy with ``items`` added (those already here are skipped); this one is unchanged.

        Why: a copy kept current (:class:`akrelay.store.recon_copy.KeptCopy`) takes in what was
        accepted since it was made without reading the whole set again. Both columns are
        rebuilt from slices (in C); each item added is converted once and joins its block,
        and the sums after it move by additions: 10,000 items added to 1M cost about the
        copying of the columns, not a conversion of every id.
        """
        given = list(items)
        bad = [entry for entry in given if not (isinstance(entry, tuple) and len(entry) == 2 and _is_item(*entry))]
        if bad:
            raise ValueError(f"not an item: {bad[0]!r}")
        times, ids, n = self._ts, self._ids, self._size
        view = memoryview(ids)  # slices of it copy nothing until the one join
        new_ts, new_ids = array("Q"), list[bytes | memoryview]()
        at = 0
        #: (the old index it goes before, its id's value) of each item added, ascending
        places: list[tuple[int, int]] = []
        for ts, ident in sorted(set(given)):
            index = self.lower_bound(at, n, Bound(ts, ident))
            if index < n and times[index] == ts and ids[ID_SIZE * index:ID_SIZE * index + ID_SIZE] == ident:
                continue  # already here
            new_ts.extend(times[at:index])
            new_ts.append(ts)
            new_ids += (view[ID_SIZE * at:ID_SIZE * index], ident)
            places.append((index, int.from_bytes(ident, "little")))
            at = index
        if not places:
            return self
        new_ts.extend(times[at:])
        new_ids.append(view[ID_SIZE * at:])
        # by construction ascending and distinct: each item went where the lower bound put it
        joined = b"".join(new_ids)
        del new_ids
        view.release()
        starts = self._starts or [0]
        # the chunk each added item joins: the last that starts at or before its old index
        grown: dict[int, list[tuple[int, int]]] = {}
        for place in places:
            grown.setdefault(_bisect_right(starts, place[0]) - 1, []).append(place)
        out_starts: list[int] = []
        out_blocks: list[list[int] | None] = []
        out_sums: list[list[int]] = []
        shift = 0  # items added before the chunk
        moved = 0  # the sum of their ids
        for chunk, begin in enumerate(starts):
            old_sums = self._sums[chunk] if self._sums else [0, 0]
            added = grown.get(chunk)
            if not added:
                out_starts.append(begin + shift)
                out_blocks.append(self._blocks[chunk])
                out_sums.append(old_sums if not moved else [v + moved for v in old_sums])
                continue
            new_begin = begin + shift
            sizes, totals = self._grow(chunk, begin, added, old_sums)
            # blocks grown past twice STEP are cut again, their ids read from the new column
            cut_sizes: list[int] = []
            cut_totals: list[int] = []
            at = new_begin
            for size, total in zip(sizes, totals):
                if size <= 2 * self.STEP:
                    cut_sizes.append(size)
                    cut_totals.append(total)
                else:
                    local = self._block_sums(joined, at, at + size)
                    cut_sizes += [min(self.STEP, size - k) for k in range(0, size, self.STEP)]
                    cut_totals += [b - a for a, b in zip(local, local[1:])]
                at += size
            first_sum = old_sums[0] + moved
            shift += len(added)
            moved += sum(value for _, value in added)
            # chunks of about CHUNK items, at block boundaries, when this one grew past twice that
            offsets = list(itertools.accumulate(cut_sizes, initial=0))
            block_sums = list(itertools.accumulate(cut_totals, initial=first_sum))
            pieces = max(1, offsets[-1] // self.CHUNK) if offsets[-1] >= 2 * self.CHUNK else 1
            first = 0
            for k in range(1, pieces + 1):
                last = len(cut_sizes) if k == pieces else bisect.bisect_left(offsets, k * offsets[-1] // pieces)
                if last <= first:
                    continue  # blocks larger than a chunk's share (only with a tiny CHUNK): no empty chunk
                origin = offsets[first]
                out_starts.append(new_begin + origin)
                out_blocks.append([o - origin for o in offsets[first:last]])
                out_sums.append(block_sums[first:last + 1])
                first = last
        return PackedItems(columns=(new_ts, joined), _chunks=(out_starts, out_blocks, out_sums))

    def _grow(self, chunk: int, begin: int, added: list[tuple[int, int]],
              old_sums: list[int]) -> tuple[list[int], list[int]]:
        """The sizes and id sums of ``chunk``'s blocks once ``added`` (old index, id value) joined them."""
        end = self._starts[chunk + 1] if chunk + 1 < len(self._starts) else self._size
        blocks = self._blocks[chunk] if self._starts else [0]
        if blocks is None:
            blocks = list(range(0, end - begin, self.STEP))
        if not blocks:
            blocks = [0]
        sizes = [b - a for a, b in zip(blocks, blocks[1:])] + [end - begin - blocks[-1]]
        totals = [b - a for a, b in zip(old_sums, old_sums[1:])]
        if len(totals) < len(sizes):  # an empty set: one empty block
            totals.append(0)
        for place, value in added:
            # the block that holds the item now at ``place`` (an item at the chunk's end joins its last block)
            block = min(_bisect_right(blocks, place - begin) - 1, len(sizes) - 1)
            sizes[block] += 1
            totals[block] += value
        return sizes, totals

    def state(self) -> tuple[int, int]:
        """The count and id sum of all the items (what :meth:`akrelay.store.recon.StoreView.state` reads)."""
        return self._size, self._sum_before(self._size) % _MOD

    def size(self) -> int:
        return self._size

    def item(self, index: int) -> Item:
        if not 0 <= index < self._size:
            raise IndexError(index)
        at = ID_SIZE * index
        return self._ts[index], self._ids[at:at + ID_SIZE]

    def lower_bound(self, first: int, last: int, bound: Bound) -> int:
        ts, prefix = bound
        if ts >= MAX_TIMESTAMP:
            return last  # the reserved timestamp: beyond every item
        times = self._ts
        lo = bisect.bisect_left(times, ts, first, last)
        if not prefix.strip(b"\0") or lo >= last or times[lo] != ts:
            return lo  # no id below the bound at its timestamp (or no item there)
        # the items at that timestamp whose ids are below the prefix (padded with zeros) come first
        hi = bisect.bisect_right(times, ts, lo, last)
        target, ids = prefix.ljust(ID_SIZE, b"\0"), self._ids
        while lo < hi:
            mid = (lo + hi) >> 1
            at = ID_SIZE * mid
            if ids[at:at + ID_SIZE] < target:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def boundary(self, index: int) -> Bound:
        """:func:`minimal_bound` of the items at ``index - 1`` and ``index`` (most differ in their timestamps)."""
        times = self._ts
        ts = times[index]
        if times[index - 1] != ts:
            return Bound(ts)
        return minimal_bound(self.item(index - 1), self.item(index))

    def _sum_before(self, index: int) -> int:
        starts = self._starts
        chunk = _bisect_right(starts, index) - 1
        if chunk < 0:
            return 0  # no items
        first = starts[chunk]
        sums, ids, blocks = self._sums[chunk], self._ids, self._blocks[chunk]
        if blocks is None:  # as built: a block every 8 items (STEP, inlined: this runs for every fingerprint)
            block, offset = divmod(index - first, 8)
            low = first + 8 * block
            back = offset > 4
            if back:  # the next stored sum is 8 items on, unless the chunk ends before
                high = low + 8
                back = high <= (starts[chunk + 1] if chunk + 1 < len(starts) else self._size)
        else:
            block = _bisect_right(blocks, index - first) - 1
            low = first + blocks[block]
            high = first + blocks[block + 1] if block + 1 < len(blocks) else (
                starts[chunk + 1] if chunk + 1 < len(starts) else self._size)
            back = 2 * (index - low) > high - low
        if back:  # nearer the next stored sum: back from it
            total = sums[block + 1]
            for at in range(ID_SIZE * index, ID_SIZE * high, ID_SIZE):
                total -= int.from_bytes(ids[at:at + ID_SIZE], "little")
            return total
        total = sums[block]
        for at in range(ID_SIZE * low, ID_SIZE * index, ID_SIZE):
            total += int.from_bytes(ids[at:at + ID_SIZE], "little")
        return total

    def fingerprint(self, begin: int, end: int) -> bytes:
        # the ends of the last range asked for: the next range starts where it ended, and a
        # range that differs is often asked for twice (read, then written)
        last_begin, sum_begin, last_end, sum_end = self._last
        low = sum_begin if begin == last_begin else sum_end if begin == last_end else self._sum_before(begin)
        high = sum_end if end == last_end else sum_begin if end == last_begin else self._sum_before(end)
        self._last = (begin, low, end, high)  # one tuple, swapped whole: safe for threads sharing the copy
        return fingerprint(high - low, end - begin)

    def ids(self, begin: int, end: int) -> Sequence[bytes]:
        ids = self._ids
        return [ids[at:at + ID_SIZE] for at in range(ID_SIZE * begin, ID_SIZE * max(begin, end), ID_SIZE)]


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
_bisect_right = bisect.bisect_right


def _range_key(entry: tuple[Bound, int]) -> tuple[int, bytes]:
    """The key of a recorded range's upper bound (its prefix padded: how bounds compare)."""
    return entry[0].key()


def _is_item(ts: object, ident: object) -> bool:
    """An item's timestamp and id: an int below the reserved timestamp, and ``ID_SIZE`` bytes."""
    return isinstance(ts, int) and 0 <= ts < MAX_TIMESTAMP and isinstance(ident, bytes) and len(ident) == ID_SIZE


def _first_bad(chunk: list[Item]) -> object:
    """The first of ``chunk`` that is not an item (for the error message)."""
    for entry in chunk:
        try:
            ts, ident = entry
        except (TypeError, ValueError):
            return entry
        if not _is_item(ts, ident):
            return entry
    return chunk[0]


# ---- wire format ------------------------------------------------------------------------------

class _Reader:
    __slots__ = ("data", "pos", "last_timestamp", "end")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.last_timestamp = 0
        self.end = len(data)

    def done(self) -> bool:
        return self.pos >= self.end

    def take(self, n: int) -> bytes:
        pos = self.pos
        if pos + n > self.end:
            raise _bad("truncated")
        self.pos = pos + n
        return self.data[pos:pos + n]

    def varint(self) -> int:
        pos = self.pos
        if pos < self.end and self.data[pos] < 0x80:  # one byte: modes, counts, prefix lengths
            self.pos = pos + 1
            return self.data[pos]
        value = 0
        for _ in range(10):
            if self.pos >= len(self.data):
                raise _bad("truncated varint")
            byte = self.data[self.pos]
            self.pos += 1
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                if value > MAX_TIMESTAMP:
                    raise _bad("varint beyond 64 bits")
                return value
        raise _bad("varint beyond 64 bits")

    def timestamp(self) -> int:
        encoded = self.varint()
        # saturating, as negentropy does: past the end of the range is infinity
        value = MAX_TIMESTAMP if encoded == 0 else min(self.last_timestamp + encoded - 1, MAX_TIMESTAMP)
        self.last_timestamp = value
        return value

    def bound(self) -> Bound:
        ts = self.timestamp()
        data, pos = self.data, self.pos
        if pos < self.end and data[pos] < 0x80:  # the prefix length, in one byte
            length = data[pos]
            pos += 1
        else:
            length = self.varint()
            pos = self.pos
        if length > ID_SIZE:
            raise _bad(f"id prefix of {length} bytes (at most {ID_SIZE})")
        if pos + length > self.end:
            raise _bad("truncated")
        self.pos = pos + length
        return Bound(ts, data[pos:pos + length])


class _Writer:
    __slots__ = ("parts", "size", "last_timestamp", "ranges", "record")

    def __init__(self, *, record: bool = True) -> None:
        self.parts: list[bytes] = [bytes([PROTOCOL_VERSION])]
        self.size = 1
        self.last_timestamp = 0
        #: the upper bound and mode of each range written, in order (what an initiator may resend);
        #: kept only with ``record`` (a responder resends nothing)
        self.ranges: list[tuple[Bound, int]] = []
        self.record = record

    def mark(self) -> tuple[int, int, int, int]:
        return len(self.parts), self.size, self.last_timestamp, len(self.ranges)

    def reset(self, mark: tuple[int, int, int, int]) -> None:
        del self.parts[mark[0]:]
        del self.ranges[mark[3]:]
        self.size, self.last_timestamp = mark[1], mark[2]

    def put(self, bound: Bound, mode: int, payload: bytes = b"") -> None:
        """Write one range: its upper bound, its mode and what the mode carries."""
        timestamp, prefix = bound
        if timestamp == MAX_TIMESTAMP:
            ts = b"\0"
        else:
            ts = encode_varint(timestamp - self.last_timestamp + 1)
        self.last_timestamp = timestamp
        # a prefix is at most ID_SIZE bytes: its length is one byte
        chunk = ts + _ONE_BYTE[len(prefix)] + prefix + _ONE_BYTE[mode] + payload
        self.parts.append(chunk)
        self.size += len(chunk)
        if self.record:
            self.ranges.append((bound, mode))

    def bytes(self) -> bytes:
        return b"".join(self.parts)


# ---- the protocol -----------------------------------------------------------------------------

@dataclass
class Outcome:
    """What one message taught the initiator, and what to send next (``None``: reconciled)."""

    message: bytes | None
    have: list[bytes] = field(default_factory=list)
    need: list[bytes] = field(default_factory=list)
    #: our items after the last range the message described, left to the fingerprint of the
    #: rest of a full frame: the part of the set the reconciliation still has ahead of it
    deferred: int = 0


class Reconciler:
    """One side of a reconciliation over ``storage``: the initiator or the stateless responder."""

    def __init__(self, storage: Storage, *, frame_limit: int = DEFAULT_FRAME_LIMIT,
                 buckets: int = DEFAULT_BUCKETS, max_rounds: int = MAX_ROUNDS,
                 list_below: int | None = None, aligned: bool = True) -> None:
        if frame_limit < MIN_FRAME_LIMIT:
            raise ValueError(f"frame_limit must be at least {MIN_FRAME_LIMIT}")
        if buckets < 2:
            raise ValueError("buckets must be at least 2")
        self.storage = storage
        self.frame_limit = frame_limit
        self.buckets = buckets
        #: split a differing range of more than :data:`ALIGN_ABOVE` items at bucket boundaries
        #: (:func:`aligned_splits`) where its items span enough buckets, else by counts
        self.aligned = aligned
        self.rounds = 0
        self.max_rounds = max_rounds
        #: a differing range with fewer items than this is listed rather than split
        self.list_below = 2 * buckets if list_below is None else max(2, list_below)  # 2: a split must make progress
        #: By default (``list_below`` not given) the initiator answers a differing range smaller
        #: than ``list_below`` with one fingerprint of the whole range instead of its ids: the
        #: responder, which lists what differs below ``list_below``, then lists it, and the
        #: initiator learns the difference from that list, in the same number of rounds. An id
        #: list from the initiator would cost its ids and the responder's answering list: about
        #: twice the bytes per difference when differences are many.
        self.initiator_asks = list_below is None
        #: ids the initiator has reported: a range learned from an id list can come back inside
        #: the fingerprint that stands for the rest of a full frame, and is then not reported twice
        self._reported: set[bytes] = set()
        #: the ranges of the initiator's last message (upper bound, mode): where the peer's answer
        #: stops short of them, the next message resumes them rather than splitting anew
        self._sent: list[tuple[Bound, int]] = []

    def initiate(self) -> bytes:
        """The first message: the whole set, split into buckets (or listed, if small)."""
        out = _Writer()
        self._split(out, 0, self.storage.size(), ZERO, INFINITY)
        self._sent = out.ranges
        return out.bytes()

    def respond(self, message: bytes) -> bytes:
        """The responder's answer to one message; it keeps nothing between rounds."""
        if not message:
            raise _bad("empty")
        if not 0x60 <= message[0] <= 0x6F:
            raise _bad(f"0x{message[0]:02x} is not a protocol version byte")
        if message[0] != PROTOCOL_VERSION:
            # negentropy's downgrade: answer with the one version we speak
            return bytes([PROTOCOL_VERSION])
        return self._reconcile(message, initiator=False).message or bytes([PROTOCOL_VERSION])

    def reconcile(self, message: bytes) -> Outcome:
        """The initiator's step: the ids learned from the responder's ``message`` and what to send next."""
        if not message:
            raise _bad("empty")
        if message[0] != PROTOCOL_VERSION:
            raise _bad(f"the peer speaks protocol version 0x{message[0]:02x}, not 0x{PROTOCOL_VERSION:02x}")
        self.rounds += 1
        if self.rounds > self.max_rounds:
            raise _bad(f"not reconciled after {self.max_rounds} rounds")
        return self._reconcile(message, initiator=True)

    # ---- internals ----------------------------------------------------------------------------

    def _reconcile(self, message: bytes, *, initiator: bool) -> Outcome:
        if len(message) > MAX_MESSAGE:
            raise _bad(f"{len(message)} bytes (at most {MAX_MESSAGE})")
        storage = self.storage
        size = storage.size()
        reader = _Reader(message)
        reader.take(1)
        out = _Writer(record=initiator)
        outcome = Outcome(None)
        limit = self.frame_limit - 200
        # ranges written, counting the version byte's part: at most MAX_RANGES in all after the
        # skip and the fingerprint of the rest that may follow a reset (a peer accepts no more)
        range_limit = MAX_RANGES - 1
        prev_bound, prev_index = ZERO, 0
        # the last bound written, and the index it stands for on our side: a range that
        # follows starts there on both sides
        written_bound, written_index = ZERO, 0
        skipping = False
        ranges = 0
        prev_key = ZERO.key()
        #: the cuts of our last message that a resume left unsent
        leftover: list[tuple[Bound, int]] = []

        while not reader.done():
            ranges += 1
            if ranges > MAX_RANGES:
                raise _bad(f"more than {MAX_RANGES} ranges")
            upper_bound = reader.bound()
            key = upper_bound.key()
            if ranges > 1 and key <= prev_key:
                raise _bad("range bounds are not ascending")
            prev_key = key
            mode = reader.varint()
            lower = prev_index
            upper = storage.lower_bound(prev_index, size, upper_bound)
            mark = out.mark()
            mark_written = written_bound, written_index
            mark_skipping = skipping
            covered = upper
            if mode == SKIP:
                skipping = True
            elif mode == FINGERPRINT:
                theirs = reader.take(FINGERPRINT_SIZE)
                if theirs == storage.fingerprint(lower, upper):
                    skipping = True
                else:
                    if skipping:
                        out.put(prev_bound, SKIP)
                        skipping = False
                    resumed = None
                    if initiator and upper_bound.timestamp == MAX_TIMESTAMP:
                        resumed = self._resume(out, lower, prev_bound, limit, range_limit)
                    if resumed is not None:  # our last message again, from where the peer stopped
                        emitted, leftover = resumed
                        outcome.deferred = size - emitted
                    elif initiator and self.initiator_asks and upper - lower < self.list_below:
                        out.put(upper_bound, FINGERPRINT, storage.fingerprint(lower, upper))
                    else:
                        self._split(out, lower, upper, prev_bound, upper_bound)
                    written_bound, written_index = upper_bound, upper
            elif mode == IDLIST:
                count = reader.varint()
                if count * ID_SIZE > len(message) - reader.pos:
                    raise _bad("id list longer than the message")
                their_ids = {reader.take(ID_SIZE) for _ in range(count)}
                if initiator:
                    skipping = True
                    ours = storage.ids(lower, upper)
                    mine = set(ours)
                    reported = self._reported
                    for i in ours:
                        if i not in their_ids and i not in reported:
                            reported.add(i)
                            outcome.have.append(i)
                    for i in sorted(their_ids):
                        if i not in mine and i not in reported:
                            reported.add(i)
                            outcome.need.append(i)
                else:
                    if skipping:
                        out.put(prev_bound, SKIP)
                        skipping = False
                    covered, bound = self._list(out, lower, upper, upper_bound, limit)
                    written_bound, written_index = bound, covered
            else:
                raise _bad(f"unknown range mode {mode}")
            full = out.size > limit or len(out.parts) > range_limit
            if full or covered < upper:
                if full:  # this range's output does not fit: describe it with the rest
                    out.reset(mark)
                    written_bound, written_index = mark_written
                    if mark_skipping and written_index < prev_index:
                        # what was skipped before it (matched, or an id list the initiator has
                        # already learned from) stays out of the rest: never reconciled twice
                        out.put(prev_bound, SKIP)
                        written_bound, written_index = prev_bound, prev_index
                if written_bound != INFINITY:
                    # one fingerprint for everything not yet described, which the other side
                    # splits in its next message
                    out.put(INFINITY, FINGERPRINT, storage.fingerprint(written_index, size))
                    outcome.deferred = size - written_index
                break
            prev_bound, prev_index = upper_bound, upper
        if initiator:
            # what we sent, and the cuts of our last message that a resume left unsent: the
            # next resume goes on from there (ahead of the rest's fingerprint, in order)
            plan = out.ranges
            if leftover and plan and plan[-1][0] == INFINITY:
                # at most twice a message's ranges kept, whatever a peer makes us resume
                plan = plan[:-1] + leftover[:max(0, 2 * MAX_RANGES - len(plan))]
            self._sent = plan
            if out.size == 1:
                return outcome  # nothing left to ask: reconciled
        outcome.message = out.bytes()
        return outcome

    def _resume(self, out: _Writer, lower: int, low: Bound, limit: int,
                range_limit: int) -> tuple[int, list[tuple[Bound, int]]] | None:
        """Describe the rest of the set, from ``low`` on, with our last message's own ranges there.

        Why: a peer whose answer fills its frame describes everything after it with one
        fingerprint. Split anew, that rest would be descended from the top again, two rounds
        and thousands of ranges before the peer splits anything, while our last message had
        already cut it fine. So the ranges of that message that the peer did not reach are
        sent again (each with its fingerprint now), as many as twice the ranges the peer did
        reach (it will reach about as many again), then one fingerprint for all that follows.
        ``None`` (split as usual) when the peer reached none of them, or when fewer than two
        are left. Returns the index where that last fingerprint starts, and the ranges of our
        last message left unsent (the next resume goes on with them).
        """
        sent = self._sent
        start = bisect.bisect_right(sent, low.key(), key=_range_key)  # the first range the peer did not reach
        reached = sum(1 for _, mode in sent[:start] if mode != SKIP)
        ahead = sent[start:]
        if not reached or sum(1 for bound, mode in ahead if mode != SKIP and bound != INFINITY) < 2:
            return None
        storage, size = self.storage, self.storage.size()
        cap = 2 * reached
        current = emitted = lower
        pending: Bound | None = None
        rest = len(ahead)  # the first of ``ahead`` not written
        for j, (bound, mode) in enumerate(ahead):
            if bound.timestamp == MAX_TIMESTAMP or not cap:
                rest = j
                break
            if mode != SKIP and (out.size + 3 * 60 > limit or len(out.parts) + 3 > range_limit):
                rest = j  # room for this range, a skip before it and the fingerprint of the rest after it
                break
            end = storage.lower_bound(current, size, bound)
            if mode == SKIP:
                pending = bound
            else:
                if pending is not None:
                    out.put(pending, SKIP)
                    pending = None
                out.put(bound, FINGERPRINT, storage.fingerprint(emitted, end))
                emitted = end
                cap -= 1
                rest = j + 1
            current = end
        out.put(INFINITY, FINGERPRINT, storage.fingerprint(emitted, size))
        return emitted, ahead[rest:]

    def _split(self, out: _Writer, lower: int, upper: int, lower_bound: Bound, upper_bound: Bound) -> None:
        """Describe ``[lower, upper)``: its ids when few, else fingerprints of its buckets (or of ``buckets`` parts)."""
        storage = self.storage
        count = upper - lower
        prefetch = getattr(storage, "prefetch", None)
        if count < self.list_below:
            if prefetch is not None:  # an optional hint: a store-backed view reads a small range in one go
                prefetch(lower, upper)
            ids = storage.ids(lower, upper)
            out.put(upper_bound, IDLIST, encode_varint(len(ids)) + b"".join(ids))
            return
        if self.aligned and count > ALIGN_ABOVE:
            method = getattr(storage, "aligned_splits", None)
            splits = (method(lower, upper, lower_bound, upper_bound, self.buckets) if method is not None
                      else aligned_splits(storage, lower, upper, self.buckets))
            if splits:
                current = lower
                for bound, end in splits:
                    out.put(bound, FINGERPRINT, storage.fingerprint(current, end))
                    current = end
                out.put(upper_bound, FINGERPRINT, storage.fingerprint(current, upper))
                return
        if prefetch is not None:
            prefetch(lower, upper)
        buckets = min(self.buckets, count)
        per, extra = divmod(count, buckets)
        current = lower
        boundary = getattr(storage, "boundary", None)
        for i in range(buckets):
            end = current + per + (1 if i < extra else 0)
            if end == upper:
                bound = upper_bound
            elif boundary is not None:
                bound = boundary(end)
            else:
                bound = minimal_bound(storage.item(end - 1), storage.item(end))
            out.put(bound, FINGERPRINT, storage.fingerprint(current, end))
            current = end

    def _list(self, out: _Writer, lower: int, upper: int, upper_bound: Bound, limit: int) -> tuple[int, Bound]:
        """List the ids of ``[lower, upper)`` as far as ``limit`` allows: the index and bound reached."""
        room = max(1, (limit - out.size - 64) // ID_SIZE)
        end, bound = upper, upper_bound
        if upper - lower > room:
            end = lower + room
            item = self.storage.item(end)
            bound = Bound(item[0], item[1])  # the first item not listed starts the rest
        ids = self.storage.ids(lower, end)
        out.put(bound, IDLIST, encode_varint(len(ids)) + b"".join(ids))
        return end, bound
