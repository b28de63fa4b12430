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
from akrelay.protocol.merkle import Frontier
from akrelay.store.base import LogEntry, Queryable, QueryParams, Record, event_hash_bytes, indexed_facts
from akrelay.store.recon import MemoryReconIndex
from akrelay.store.tlog import Run, append_entries, leaf_of, read_nodes


class _Row:
    __slots__ = ("record", "terms", "text")

    def __init__(self, record: Record, terms: frozenset[str], text: str) -> None:
        self.record = record
        self.terms = terms
        self.text = text


class MemoryStore(Queryable):
    """Acceptance log held in memory; thread-safe, not durable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, _Row] = {}
        self._seqs: list[int] = []  # ascending, parallel to _rows
        self._rows: list[_Row] = []
        self._hwm = 0
        self._meta: dict[str, bytes] = {}
        #: the Merkle log: (seq, event hash) per index, interior nodes, the frontier
        self._log: list[tuple[int, bytes]] = []
        self._log_index: dict[int, int] = {}
        self._nodes: dict[tuple[int, int], bytes] = {}
        self._frontier = Frontier()
        #: the reconciliation index (issue 26): the fetchable records as (created_at, hash)
        self.recon = MemoryReconIndex()

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

    def select(self, params: QueryParams) -> list[Record]:
        needed = frozenset(params.terms)
        texts = params.texts
        created_from, created_before = params.created_from, params.created_before
        after_seq, upto_seq, limit, include_withheld = params.after_seq, params.upto_seq, params.limit, params.include_withheld
        upper = self._hwm if upto_seq is None else upto_seq
        out: list[Record] = []
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
            event_hash = event_hash_bytes(envelope.id)
            self._log_index[record.seq] = record.log_index = len(self._log)
            self._log.append((record.seq, event_hash))
            for level, index, value in append_entries(self._frontier, [(record.seq, event_hash)]):
                self._nodes[(level, index)] = value
            self.recon.add([(envelope.created_at, event_hash)])
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
            item = (rec.envelope.created_at, event_hash_bytes(event_id))
            (self.recon.discard if withheld else self.recon.add)([item])
            return True

    def remove(self, event_id: str) -> bool:
        with self._lock:
            row = self._by_id.pop(event_id, None)
            if row is None:
                return False
            index = bisect_right(self._seqs, row.record.seq) - 1
            del self._seqs[index]
            del self._rows[index]
            self.recon.discard([(row.record.envelope.created_at, event_hash_bytes(event_id))])
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

    def meta_replace(self, key: str, expected: bytes | None, value: bytes) -> bool:
        with self._lock:
            if self._meta.get(key) != expected:
                return False
            self._meta[key] = bytes(value)
            return True

    # -- the Merkle log ------------------------------------------------------------
    def log_size(self) -> int:
        return len(self._log)

    def log_entries(self, start: int, limit: int) -> list[LogEntry]:
        out = []
        for index in range(max(0, start), min(len(self._log), start + max(0, limit))):
            seq, event_hash = self._log[index]
            row = self._row_at(seq)
            out.append(LogEntry(index, seq, event_hash, None if row is None else row.record.withheld))
        return out

    def _row_at(self, seq: int) -> _Row | None:
        with self._lock:
            at = bisect_right(self._seqs, seq) - 1
            return self._rows[at] if at >= 0 and self._seqs[at] == seq else None

    def log_index(self, seq: int) -> int | None:
        return self._log_index.get(seq)

    def log_nodes(self, keys: Sequence[tuple[int, int]]) -> list[bytes]:
        def fetch(runs: Sequence[Run]) -> list[list[bytes]]:
            out: list[list[bytes]] = []
            for level, lo, hi in runs:
                if level == 0:
                    out.append([leaf_of(*entry) for entry in self._log[lo:hi]])
                else:
                    values = [self._nodes.get((level, index)) for index in range(lo, hi)]
                    out.append([v for v in values if v is not None])
            return out

        return read_nodes(keys, fetch)

    def ping(self) -> None:
        """Always reachable: it is this process's memory."""

    def close(self) -> None:
        pass
