"""In-process store for tests and tools.

It is the simplest correct backend: a list in ``seq`` order and brute-force
filtering over the same indexed facts as every other backend, so it doubles as
a readable statement of what :meth:`Store.query` means.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from typing import Iterable, Sequence

from akrelay.protocol.envelope import Envelope
from akrelay.store.base import Record, indexed_facts, term_key


class _Row:
    __slots__ = ("record", "terms", "text")

    def __init__(self, record: Record, terms: frozenset[str], text: str) -> None:
        self.record = record
        self.terms = terms
        self.text = text


class MemoryStore:
    """Acceptance log held in memory; thread-safe, not durable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, _Row] = {}
        self._seqs: list[int] = []  # ascending, parallel to _rows
        self._rows: list[_Row] = []
        self._hwm = 0
        self._meta: dict[str, bytes] = {}

    # -- reads -------------------------------------------------------------
    def get(self, event_id: str) -> Record | None:
        row = self._by_id.get(event_id)
        return row.record if row else None

    def get_many(self, event_ids: Sequence[str]) -> dict[str, Record]:
        out = {}
        for event_id in event_ids:
            row = self._by_id.get(event_id)
            if row is not None:
                out[event_id] = row.record
        return out

    def checkpoint(self) -> int:
        return self._hwm

    def iter_records(self, after_seq: int, limit: int) -> list[Record]:
        with self._lock:
            start = bisect_right(self._seqs, after_seq)
            return [row.record for row in self._rows[start : start + limit]]

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
        needed = frozenset(term_key(t) for t in request_terms)
        texts = tuple(text_terms)
        upper = self._hwm if upto_seq is None else upto_seq
        out: list[Record] = []
        if limit <= 0:
            return out
        with self._lock:
            start = bisect_right(self._seqs, after_seq)
            rows = self._rows[start:]
        for row in rows:
            rec = row.record
            if rec.seq > upper:
                break
            if rec.withheld and not include_withheld:
                continue
            if not needed <= row.terms:
                continue
            created = rec.envelope.created_at
            if created_from is not None and created < created_from:
                continue
            if created_before is not None and created >= created_before:
                continue
            if any(term not in row.text for term in texts):
                continue
            out.append(rec)
            if len(out) >= limit:
                break
        return out

    # -- writes ------------------------------------------------------------
    def commit(self, envelope: Envelope, accepted_at: int) -> tuple[Record, bool]:
        terms, text = indexed_facts(envelope)
        with self._lock:
            existing = self._by_id.get(envelope.id)
            if existing is not None:
                return existing.record, False
            self._hwm += 1
            record = Record(seq=self._hwm, accepted_at=accepted_at, envelope=envelope)
            row = _Row(record, terms, text)
            self._by_id[envelope.id] = row
            self._seqs.append(record.seq)
            self._rows.append(row)
            return record, True

    def commit_many(self, items: Iterable[tuple[Envelope, int]]) -> list[tuple[Record, bool]]:
        """Commit several envelopes in order (the memory store has no transactions to save)."""
        return [self.commit(env, accepted_at) for env, accepted_at in items]

    def try_commit_many(self, items: Sequence[tuple[Envelope, int]]) -> list[tuple[Record, bool]] | None:
        """Memory commits never wait on I/O or another process: always done at once."""
        return self.commit_many(items)

    def set_withheld(self, event_id: str, withheld: bool) -> bool:
        with self._lock:
            row = self._by_id.get(event_id)
            if row is None:
                return False
            rec = row.record
            row.record = rec.replace(withheld=withheld)
            return True

    def remove(self, event_id: str) -> bool:
        with self._lock:
            row = self._by_id.pop(event_id, None)
            if row is None:
                return False
            index = bisect_right(self._seqs, row.record.seq) - 1
            del self._seqs[index]
            del self._rows[index]
            return True

    # -- metadata ------------------------------------------------------------
    def meta_get(self, key: str) -> bytes | None:
        return self._meta.get(key)

    def meta_set(self, key: str, value: bytes) -> None:
        with self._lock:
            self._meta[key] = bytes(value)

    def meta_setdefault(self, key: str, value: bytes) -> bytes:
        with self._lock:
            return self._meta.setdefault(key, bytes(value))

    def ping(self) -> None:
        """Always reachable: it is this process's memory."""

    def close(self) -> None:
        pass
