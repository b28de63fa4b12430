"""What every backend shares to keep the Merkle log of acceptances (issue 23).

The hashing is :mod:`akrelay.protocol.merkle`'s; here are only the rows a
backend writes for a new record and the leaf of a stored entry, so that the
embedded, in-memory and Redis stores lay out the same tree.
"""

from __future__ import annotations

from typing import Iterable

from akrelay.protocol.merkle import Frontier, entry_bytes, leaf_hash


def leaf_of(seq: int, event_hash: bytes) -> bytes:
    """The RFC 9162 leaf hash of the entry of record ``seq``."""
    return leaf_hash(entry_bytes(seq, event_hash))


def append_entries(frontier: Frontier, entries: Iterable[tuple[int, bytes]]) -> list[tuple[int, int, bytes]]:
    """Extend ``frontier`` by ``(seq, event_hash)`` entries; the interior nodes (level >= 1) to store.

    Level 0 (the leaf hashes) is not returned: a backend derives it from the
    stored entry, which it keeps anyway for ``/v1/knowledge/log``.
    """
    return frontier.extend_entries(list(entries))
