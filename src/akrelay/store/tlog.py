"""What every backend shares to keep the Merkle log of acceptances (issue 23).

The hashing is :mod:`akrelay.protocol.merkle`'s; here are only the rows a
backend writes for a new record, the leaf of a stored entry, and how a node is
read back from what is stored, so that the embedded and in-memory stores lay
out the same tree.

**Stored levels.** A store keeps the entries (level 0: the leaves are hashed
from them) and the complete nodes at the levels that are positive multiples of
:data:`STRIDE` only. Any other complete node ``(level, index)`` is folded on
demand from the run of stored nodes below it at ``level - level % STRIDE``: at
most ``2**(STRIDE - 1)`` of them, so a proof reads O(log n) short runs. This
is the idea of C2SP ``tlog-tiles`` (keep a few levels, recompute the rest) with
a smaller step: it writes about one node row per ``2**STRIDE - 1`` records
instead of one per record, which is what a back-fill spends most of its time on.
The Redis store still keeps every level (:func:`append_all_levels`), so that
nodes of different versions on one Redis read each other's tree.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable, Sequence

from akrelay.protocol.merkle import Frontier, NodeKey, entry_bytes, leaf_hash

#: Interior levels a store keeps: 2, 4, 6, … (levels 1, 3, 5, … are folded from the pair below them).
STRIDE = 2

#: ``(stored level, first index, end index)``: the stored nodes (entries at level 0) one node is folded from.
Run = tuple[int, int, int]
#: ``fetch(runs) -> [[hash, ...], ...]``: the stored hashes of each run in index order (leaf hashes at level 0),
#: shorter than the run where one is missing.
RunFetcher = Callable[[Sequence[Run]], Sequence[Sequence[bytes]]]

_sha256 = hashlib.sha256


def leaf_of(seq: int, event_hash: bytes) -> bytes:
    """The RFC 9162 leaf hash of the entry of record ``seq``."""
    return leaf_hash(entry_bytes(seq, event_hash))


def leaves_of(entries: Iterable[tuple[int, bytes]]) -> list[bytes]:
    """:func:`leaf_of` for many ``(seq, event_hash)`` entries (event hashes already 32 bytes: decoded IDs)."""
    sha = _sha256
    return [sha(b"\x00" + seq.to_bytes(8, "big") + event_hash).digest() for seq, event_hash in entries]


def append_entries(frontier: Frontier, entries: Iterable[tuple[int, bytes]]) -> list[tuple[int, int, bytes]]:
    """Extend ``frontier`` by ``(seq, event_hash)`` entries; the nodes to store (levels ``STRIDE``, ``2*STRIDE``, …).

    Level 0 (the leaf hashes) is not returned: a backend derives it from the
    stored entry, which it keeps anyway for ``/v1/knowledge/log``.
    """
    return frontier.extend_leaves(leaves_of(entries), STRIDE)


def append_all_levels(frontier: Frontier, entries: Iterable[tuple[int, bytes]]) -> list[tuple[int, int, bytes]]:
    """Like :func:`append_entries`, but every interior level (the Redis layout, read without folding)."""
    return frontier.extend_leaves(leaves_of(entries), 1)


def runs_of(keys: Sequence[NodeKey]) -> list[Run]:
    """The stored run each complete node ``(level, index)`` is folded from (itself, for a stored level)."""
    runs: list[Run] = []
    for level, index in keys:
        base = level - level % STRIDE
        shift = level - base
        runs.append((base, index << shift, (index + 1) << shift))
    return runs


def merged_runs(runs: Sequence[Run], span: int = 1 << STRIDE) -> tuple[list[Run], list[int]]:
    """Runs of one level that lie close together, merged into one read each; and which read holds each run.

    The runs of an inclusion path at a stored level all lie in one subtree
    ``STRIDE`` levels up, so a proof reads about one range per stored level (a
    read is at most ``span`` long, or one run). Stored indices are contiguous,
    so a merged range has no holes where its runs have none.
    """
    reads: list[Run] = []
    owner = [0] * len(runs)
    for at in sorted(range(len(runs)), key=runs.__getitem__):
        level, lo, hi = runs[at]
        if reads and reads[-1][0] == level and max(hi, reads[-1][2]) - reads[-1][1] <= span:
            reads[-1] = (level, reads[-1][1], max(hi, reads[-1][2]))
        else:
            reads.append((level, lo, hi))
        owner[at] = len(reads) - 1
    return reads, owner


def _fold_perfect(values: Sequence[bytes]) -> bytes:
    """MTH of a perfect run (a power-of-two count of sibling subtrees, left to right)."""
    sha = _sha256
    if len(values) == 2:
        return sha(b"\x01" + values[0] + values[1]).digest()
    layer = list(values)
    while len(layer) > 1:
        layer = [sha(b"\x01" + a + b).digest() for a, b in zip(layer[0::2], layer[1::2])]
    return layer[0]


def read_nodes(keys: Sequence[NodeKey], fetch: RunFetcher) -> list[bytes]:
    """A :data:`~akrelay.protocol.merkle.NodeProvider` over a store of stored levels: one ``fetch`` per call.

    Raises ``KeyError(key)`` for a node whose run is not all stored (a damaged
    or truncated log), as the provider contract says.
    """
    runs = runs_of(keys)
    got = fetch(runs) if runs else []
    out: list[bytes] = []
    for key, (_, lo, hi), values in zip(keys, runs, got):
        if len(values) != hi - lo:
            raise KeyError(key)
        out.append(values[0] if hi - lo == 1 else _fold_perfect(values))
    return out
