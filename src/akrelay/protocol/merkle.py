"""The acceptance log's Merkle tree (RFC 9162 §2.1, SHA-256), sans-I/O.

Entries are records in ``seq`` order; an entry's bytes are its ``seq`` as 8
big-endian bytes followed by the 32 raw bytes of the event hash (issue 23), so
any RFC 9162 verifier can check the log.

A store keeps the hash of every *complete* subtree: node ``(level, index)``
covers leaves ``[index * 2**level, (index + 1) * 2**level)`` (level 0 holds the
leaf hashes). Such a node never changes once the log has grown past it, so
appending writes only new nodes, and every proof is O(log n) stored nodes plus
the right edge of the tree folded from them: nothing is recomputed from leaves.
Functions here take a *node provider* ``nodes(keys) -> hashes`` (one batch per
proof, so a database answers in one round trip) and never touch storage.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Callable, Sequence

#: MTH of the empty tree: SHA-256 of the empty string (RFC 9162 §2.1.1).
EMPTY_ROOT = hashlib.sha256(b"").digest()
HASH_SIZE = 32

NodeKey = tuple[int, int]
#: ``nodes([(level, index), ...]) -> [hash, ...]`` in the same order; raises ``KeyError`` if one is missing.
NodeProvider = Callable[[Sequence[NodeKey]], Sequence[bytes]]

_sha256 = hashlib.sha256


class ProofError(ValueError):
    """A proof request or a proof that does not fit the tree (bad sizes, wrong length, wrong root)."""


def entry_bytes(seq: int, event_hash: bytes) -> bytes:
    """The entry of one record: ``seq`` as uint64 big-endian, then the 32-byte event hash."""
    if len(event_hash) != HASH_SIZE:
        raise ValueError("an event hash is 32 bytes")
    return struct.pack(">Q", seq) + event_hash


def leaf_hash(entry: bytes) -> bytes:
    return _sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return _sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


class Frontier:
    """The compact range ``[0, size)``: one hash per set bit of ``size``, O(log n) memory.

    :meth:`append` returns the complete nodes the new leaf finishes, which is
    what a store writes; :meth:`root` folds the frontier into the tree head.
    """

    __slots__ = ("size", "hashes")

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        if len(hashes) != bin(size).count("1"):
            raise ValueError("a frontier has one hash per set bit of its size")
        self.size = size
        #: the perfect subtrees covering [0, size), largest (leftmost) first
        self.hashes = list(hashes)

    @staticmethod
    def keys(size: int) -> list[NodeKey]:
        """The node keys of the frontier of a tree of ``size`` leaves, leftmost first."""
        keys: list[NodeKey] = []
        start = 0
        for level in range(size.bit_length() - 1, -1, -1):
            if size >> level & 1:
                keys.append((level, start >> level))
                start += 1 << level
        return keys

    @classmethod
    def load(cls, size: int, nodes: NodeProvider) -> "Frontier":
        return cls(size, list(nodes(cls.keys(size))) if size else [])

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add one leaf hash; return ``(level, index, hash)`` of every node it completes (the leaf first)."""
        index = self.size
        made = [(0, index, leaf)]
        value, level = leaf, 0
        while index >> level & 1:
            value = node_hash(self.hashes.pop(), value)
            level += 1
            made.append((level, index >> level, value))
        self.hashes.append(value)
        self.size += 1
        return made

    def extend_entries(self, entries: Sequence[tuple[int, bytes]]) -> list[tuple[int, int, bytes]]:
        """Append the leaves of ``(seq, event_hash)`` entries; the interior nodes (level >= 1) they complete.

        :meth:`append` unrolled for bulk work (commit groups, back-fill): same hashes, about half the time.
        """
        sha = _sha256
        hashes = self.hashes
        size = self.size
        made: list[tuple[int, int, bytes]] = []
        for seq, event_hash in entries:
            value = sha(b"\x00" + seq.to_bytes(8, "big") + event_hash).digest()
            level = 0
            while size >> level & 1:
                value = sha(b"\x01" + hashes.pop() + value).digest()
                level += 1
                made.append((level, size >> level, value))
            hashes.append(value)
            size += 1
        self.size = size
        return made

    def extend_leaves(self, leaves: Sequence[bytes], stride: int = 1) -> list[tuple[int, int, bytes]]:
        """Append leaf hashes a level at a time; the completed nodes at levels that are positive multiples of ``stride``.

        Same tree as :meth:`append`, but each level is one pass over pairs (no
        per-leaf stack work), and only the levels a store keeps are returned, level
        by level (lowest first). With ``stride`` 1 that is every interior node.
        """
        if not leaves:
            return []
        sha = _sha256
        size, new = self.size, self.size + len(leaves)
        old = {level: value for (level, _), value in zip(self.keys(size), self.hashes)}
        edge: dict[int, bytes] = {}  # the new frontier's hash at each level this batch reaches
        made: list[tuple[int, int, bytes]] = []
        cur, level = list(leaves), 0  # cur: the nodes at ``level`` from index size >> level on
        while cur:
            lo = size >> level
            if new >> level & 1:
                last = (new >> level) - 1
                edge[level] = cur[last - lo] if last >= lo else old[level]
            if lo & 1:  # the left sibling of the first new node is the old frontier's node here
                cur.insert(0, old[level])
                lo -= 1
            cur = [sha(b"\x01" + a + b).digest() for a, b in zip(cur[0::2], cur[1::2])]
            level += 1
            if cur and level % stride == 0:
                base = lo >> 1
                made.extend([(level, base + i, value) for i, value in enumerate(cur)])
        self.hashes = [edge[lv] if lv in edge else old[lv] for lv, _ in self.keys(new)]
        self.size = new
        return made

    def root(self) -> bytes:
        if not self.hashes:
            return EMPTY_ROOT
        value = self.hashes[-1]
        for left in reversed(self.hashes[:-1]):
            value = node_hash(left, value)
        return value

    def copy(self) -> "Frontier":
        return Frontier(self.size, self.hashes)


# -- subtree hashes from stored nodes ---------------------------------------------------------------------
def _range_keys(start: int, end: int) -> list[NodeKey]:
    """The perfect aligned subtrees that make up ``MTH(D[start:end])`` of a proof (largest first).

    ``start`` is always aligned to the largest of them in RFC 9162's recursion, so
    ``MTH(D[start:end])`` is their right fold.
    """
    keys: list[NodeKey] = []
    while start < end:
        size = end - start
        level = size.bit_length() - 1
        if size != 1 << level:
            level = _split(size).bit_length() - 1
        keys.append((level, start >> level))
        start += 1 << level
    return keys


def _fold(hashes: Sequence[bytes]) -> bytes:
    value = hashes[-1]
    for left in reversed(hashes[:-1]):
        value = node_hash(left, value)
    return value


def _resolve(ranges: list[tuple[int, int]], nodes: NodeProvider) -> list[bytes]:
    """``MTH(D[a:b])`` for each range, fetching every stored node in one call."""
    parts = [_range_keys(a, b) for a, b in ranges]
    flat = [key for keys in parts for key in keys]
    got = list(nodes(flat)) if flat else []
    out: list[bytes] = []
    at = 0
    for keys in parts:
        out.append(_fold(got[at : at + len(keys)]))
        at += len(keys)
    return out


def root_hash(size: int, nodes: NodeProvider) -> bytes:
    """``MTH(D[0:size])`` from stored nodes."""
    if size == 0:
        return EMPTY_ROOT
    return _resolve([(0, size)], nodes)[0]


def _check_sizes(index: int, size: int, what: str) -> None:
    if index < 0 or size < 0:
        raise ProofError(f"{what}: sizes and indices are non-negative")


def inclusion_proof(index: int, size: int, nodes: NodeProvider) -> list[bytes]:
    """RFC 9162 §2.1.3.1 ``PATH(index, D[0:size])``, from stored nodes."""
    _check_sizes(index, size, "inclusion proof")
    if index >= size:
        raise ProofError(f"leaf index {index} is not in a tree of size {size}")
    ranges: list[tuple[int, int]] = []
    start, end = 0, size
    while end - start > 1:
        k = _split(end - start)
        if index < start + k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
    ranges.reverse()  # PATH lists the deepest sibling first
    return _resolve(ranges, nodes)


def consistency_proof(first: int, second: int, nodes: NodeProvider) -> list[bytes]:
    """RFC 9162 §2.1.4.1 ``PROOF(first, D[0:second])``, from stored nodes (empty for ``first`` 0 or equal sizes)."""
    _check_sizes(first, second, "consistency proof")
    if first > second:
        raise ProofError(f"the first tree size {first} is larger than the second {second}")
    if first == 0 or first == second:
        return []
    ranges: list[tuple[int, int]] = []
    start, end, m, whole = 0, second, first, True
    while True:
        n = end - start
        if m == n:
            if not whole:
                ranges.append((start, end))
            break
        k = _split(n)
        if m <= k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
            m -= k
            whole = False
    ranges.reverse()
    return _resolve(ranges, nodes)


# -- verification (RFC 9162 §2.1.3.2 and §2.1.4.2) -------------------------------------------------------
def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` implies for ``leaf`` at ``index``; :class:`ProofError` if the shape is wrong."""
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is not in a tree of size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if len(p) != HASH_SIZE:
            raise ProofError("a proof hash is 32 bytes")
        if sn == 0:
            raise ProofError("the inclusion proof is too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the inclusion proof is too short")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> bool:
    try:
        return root_from_inclusion(index, size, leaf, proof) == root
    except ProofError:
        return False


def verify_consistency(first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]) -> bool:
    """RFC 9162 §2.1.4.2: is the tree of ``second_root`` an append-only extension of ``first_root``'s?"""
    if first < 0 or second < first:
        return False
    if first == second:
        return not proof and first_root == second_root
    if first == 0:
        return not proof  # every tree extends the empty one
    if not proof or any(len(p) != HASH_SIZE for p in proof):
        return False
    path = list(proof)
    if first & (first - 1) == 0:  # an exact power of two: the old root is a node of the new tree
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == first_root and sr == second_root and sn == 0


def root_of_leaves(leaves: Sequence[bytes]) -> bytes:
    """MTH of a list of leaf hashes via a :class:`Frontier` (what an auditor does with ``/log``)."""
    frontier = Frontier()
    for leaf in leaves:
        frontier.append(leaf)
    return frontier.root()
