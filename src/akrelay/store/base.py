"""The one storage interface.

Handlers and the sync loop never see a backend; the service layer talks to this
interface only, and ``tests/store_contract.py`` holds every backend to it. Keep
it free of SQL-isms: a Redis backend implements the same methods.

Every backend indexes the same facts, computed here from the envelope (the
``protocol.query`` index terms and the ``protocol.text`` search text), so that
filtering is the same set intersection everywhere and exactness never depends
on which backend answers.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence, runtime_checkable

from akrelay.protocol.documents import AcceptanceRecord
from akrelay.protocol.envelope import Envelope


class Record:
    """An acceptance record as stored: the envelope plus local service assertions.

    A backend may build it from the stored canonical envelope bytes
    (``body=...``) instead of an :class:`Envelope`: the envelope is then parsed
    only when someone looks at it, and :meth:`to_json` splices the bytes
    unchanged, so a query page costs no JSON decoding at all. Treat as immutable.
    """

    __slots__ = ("seq", "accepted_at", "withheld", "_envelope", "_body", "log_index")

    def __init__(
        self,
        seq: int,
        accepted_at: int,
        envelope: Envelope | None = None,
        withheld: bool = False,
        *,
        body: bytes | None = None,
    ) -> None:
        if envelope is None and body is None:
            raise TypeError("a Record needs an envelope or its canonical bytes")
        self.seq = seq
        self.accepted_at = accepted_at
        self.withheld = withheld
        self._envelope = envelope
        self._body = body
        #: the record's leaf index in the Merkle log, set by the commit that created it (else ``None``)
        self.log_index: int | None = None

    @property
    def envelope(self) -> Envelope:
        if self._envelope is None:
            self._envelope = Envelope.from_trusted(self._body)  # type: ignore[arg-type]
        return self._envelope

    @property
    def id(self) -> str:
        if self._envelope is None:
            return self._body[-146:-103].decode("ascii")  # type: ignore[index]
        return self._envelope.id

    def canonical_bytes(self) -> bytes:
        """The stored JCS of the whole envelope."""
        if self._body is None:
            self._body = self._envelope.canonical_bytes()  # type: ignore[union-attr]
        return self._body

    def replace(self, *, withheld: bool) -> "Record":
        return Record(self.seq, self.accepted_at, self._envelope, withheld, body=self._body)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (self.seq, self.accepted_at, self.withheld, self.canonical_bytes()) == (
            other.seq, other.accepted_at, other.withheld, other.canonical_bytes()
        )

    def __hash__(self) -> int:
        return hash((self.seq, self.accepted_at, self.withheld, self.canonical_bytes()))

    def __repr__(self) -> str:
        return f"Record(seq={self.seq}, accepted_at={self.accepted_at}, id={self.id!r}, withheld={self.withheld})"

    def to_dict(self) -> AcceptanceRecord:
        """The Knowledge §8.3 acceptance record as plain JSON values."""
        return {"envelope": self.envelope.to_dict(), "accepted_at": self.accepted_at, "seq": self.seq}

    def to_json(self) -> bytes:
        """Wire JSON, splicing the stored canonical envelope bytes (no re-encoding)."""
        return b'{"accepted_at":%d,"envelope":%b,"seq":%d}' % (self.accepted_at, self.canonical_bytes(), self.seq)


def term_key(term: str | tuple[str, str]) -> str:
    """One index term as a flat string: ``("tag", "x")`` becomes ``"tag=x"``.

    Term names are fixed identifiers without ``=``, so the key is unambiguous.
    """
    if isinstance(term, str):
        return term
    name, value = term
    return f"{name}={value}"


def indexed_facts(envelope: Envelope) -> tuple[frozenset[str], str]:
    """The facts every backend keeps for filtering: index terms and folded search text.

    ``search_text`` joins the ASCII-folded eligible fields with newlines; a ``q``
    term never contains ASCII whitespace, so a substring test on the joined text
    is exactly "the term occurs inside one field".
    """
    from akrelay.protocol.query import index_terms
    from akrelay.protocol.text import search_text

    return frozenset(term_key(t) for t in index_terms(envelope)), search_text(envelope)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry of the acceptance log's Merkle tree (issue 23) and what the store knows of its record.

    ``withheld`` is the record's flag, or ``None`` when the record is no longer
    retained (pruned, or deleted behind the store's back: an auditor tells which).
    """

    index: int
    seq: int
    hash: bytes  # the 32 raw bytes of the event hash
    withheld: bool | None


_TO_STD = bytes.maketrans(b"-_", b"+/")


def event_hash_bytes(event_id: str) -> bytes:
    """The 32 raw bytes of a stored (already verified) envelope's ``hash``: 43 base64url characters."""
    return binascii.a2b_base64((event_id + "=").encode("ascii").translate(_TO_STD))


class StoreUnavailable(Exception):
    """The store cannot be reached now (a shared store's server is down or slow).

    Not a bug and not bad input: the HTTP layer answers 503 ``service_unavailable``
    with ``Retry-After: retry_after`` and the node keeps serving what it can.
    An embedded store never raises it.
    """

    def __init__(self, message: str, retry_after: int = 2) -> None:
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))


class StoreRefused(RuntimeError):
    """The store answers but must not be used as configured (e.g. Redis persistence too weak); say why and stop."""


@dataclass(frozen=True, slots=True)
class QueryParams:
    """One query page as every backend receives it (:meth:`Queryable.select`): normalized once, here.

    ``terms`` are distinct :func:`term_key` strings, sorted; ``texts`` distinct
    ASCII-folded substrings in first-seen order; ``limit`` is positive.
    """

    terms: tuple[str, ...] = ()
    texts: tuple[str, ...] = ()
    created_from: int | None = None
    created_before: int | None = None
    after_seq: int = 0
    upto_seq: int | None = None
    limit: int = 100
    include_withheld: bool = False


class Queryable(Protocol):
    """Exact filtered enumeration: the one signature of ``query``, for every backend.

    A backend subclasses this and implements :meth:`select` only.
    """

    def query(
        self,
        request_terms: Iterable[str | tuple[str, str]] = (),
        created_from: int | None = None,
        created_before: int | None = None,
        text_terms: Iterable[str] = (),
        *,
        after_seq: int = 0,
        upto_seq: int | None = None,
        limit: int = 100,
        include_withheld: bool = False,
    ) -> list[Record]:
        """Exact filtered enumeration in ascending ``seq``; complete, never top-k.

        A record matches when its index terms (``protocol.query.index_terms``, as
        ``(name, value)`` pairs or :func:`term_key` strings) contain every ``request_terms`` item,
        ``created_from <= created_at < created_before`` (each bound optional),
        every ``text_terms`` item (already ASCII-folded) is a substring of its
        search text, and ``after_seq < seq <= upto_seq``. Returns at most ``limit``.
        """
        if limit <= 0:
            return []
        return self.select(QueryParams(
            terms=tuple(sorted({term_key(t) for t in request_terms})), texts=tuple(dict.fromkeys(text_terms)),
            created_from=created_from, created_before=created_before, after_seq=after_seq, upto_seq=upto_seq,
            limit=limit, include_withheld=include_withheld))

    def select(self, params: QueryParams) -> list[Record]:
        """The records :meth:`query` describes, for ``params`` as normalized there."""
        ...


class Store(Queryable, Protocol):
    """Durable acceptance log with exact filtered enumeration (:class:`Queryable`)."""

    def get(self, event_id: str) -> Record | None:
        """The record for ``event_id``, withheld or not; ``None`` if not retained."""

    def get_many(self, event_ids: Sequence[str]) -> dict[str, Record]:
        """Records for the retained IDs among ``event_ids`` (withheld included)."""

    def commit(self, envelope: Envelope, accepted_at: int) -> tuple[Record, bool]:
        """Atomically store ``envelope`` and allocate the next ``seq``.

        If the ID is already retained, return its existing record and ``False``:
        the check and the insert happen at one serialized commit point. When this
        returns, the record is durable and covered by :meth:`checkpoint`.
        """

    def commit_many(self, items: Iterable[tuple[Envelope, int]]) -> list[tuple[Record, bool]]:
        """:meth:`commit` for several ``(envelope, accepted_at)`` pairs, in order, as one unit where possible."""

    def try_commit_many(self, items: Sequence[tuple[Envelope, int]]) -> list[tuple[Record, bool]] | None:
        """:meth:`commit_many` only if it would not wait for another writer; ``None`` (nothing done) otherwise.

        An event loop commits on its own thread when the commit point is free and
        hands the group to a worker thread only when it would block.
        """

    def checkpoint(self) -> int:
        """The committed sequence high-water mark (never decreases, survives removal)."""

    def iter_records(self, after_seq: int, limit: int) -> list[Record]:
        """Records with ``seq > after_seq`` in ascending ``seq``, withheld included."""

    def set_withheld(self, event_id: str, withheld: bool) -> bool:
        """Hide or show a retained record; ``False`` if it is not retained."""

    def remove(self, event_id: str) -> bool:
        """Prune a record (retention policy); the high-water mark is kept."""

    def meta_get(self, key: str) -> bytes | None:
        """A value from the small metadata area (cursor secret, follower positions)."""

    def meta_set(self, key: str, value: bytes) -> None: ...

    def meta_setdefault(self, key: str, value: bytes) -> bytes:
        """Set ``key`` if absent, atomically across processes; return the stored value."""

    def meta_replace(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """Set ``key`` to ``value`` only if it holds ``expected`` now (``None``: absent), atomically across processes."""

    # -- the Merkle log of every acceptance (issue 23; hashing in akrelay.protocol.merkle) ------------
    def log_size(self) -> int:
        """How many entries the log's tree has (every record ever committed, in ``seq`` order)."""

    def log_entries(self, start: int, limit: int) -> list[LogEntry]:
        """The entries at indices ``[start, start + limit)`` in order."""

    def log_index(self, seq: int) -> int | None:
        """The leaf index of the record ``seq``; ``None`` if the log has no such entry."""

    def log_nodes(self, keys: Sequence[tuple[int, int]]) -> list[bytes]:
        """Stored hashes of complete subtrees ``(level, index)`` (level 0: leaf hashes); ``KeyError`` if one is absent."""

    def ping(self) -> None:
        """Check that the store answers now (``/readyz``); raise :class:`StoreUnavailable` if not."""

    def close(self) -> None: ...


@runtime_checkable
class BackgroundStore(Protocol):
    """A store with background work of its own (SQLite: trigram indexer, WAL checkpointer; Redis: trigram
    indexer). Opening it starts nothing; the node's store component calls :meth:`start` first in start order."""

    def start(self) -> None:
        """Start the background work; idempotent."""
        ...

    def stop(self) -> None:
        """Stop it (joining its threads); the store stays open. Idempotent."""
        ...
