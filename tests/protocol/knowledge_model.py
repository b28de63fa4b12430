"""A tiny in-memory service model used only by the knowledge-layer tests.

It composes the pure core (query predicate, cursors, response builders) the way
a store does, so the batch, search and pagination vectors can exercise request
parsing, cursor binding and client-side response checks without a real store.
The real stores are held to the same vectors by store-service's suite.
"""

from __future__ import annotations

from typing import Any

from akrelay.protocol.cursor import CursorCodec, CursorState
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.query import QueryRequest, query_matches
from akrelay.protocol.reads import SearchRequest
from akrelay.protocol.records import check_search_candidates, make_record
from akrelay.protocol.text import text_matches
from knowledge_vectors import NOW, SERVICE, envelope, hash_of


class FixtureService:
    def __init__(self, accepted=(), hidden=(), secret=b"k" * 32):
        self.clock = NOW
        self.records: dict[str, dict[str, Any]] = {}
        self.envelopes: dict[str, Any] = {}
        self.hidden: set[str] = set()
        self.seq = 0
        self.codec = CursorCodec(secret)
        for name in accepted:
            self.add(name)
        for name in hidden:
            self.hide(name)

    def add(self, name):
        item = envelope(name)
        if item.id not in self.records:
            self.seq += 1
            self.records[item.id] = make_record(item, self.clock, self.seq)
            self.envelopes[item.id] = item

    def hide(self, name):
        self.hidden.add(hash_of(name))

    def state(self):
        return self.seq, sorted(self.records), sorted(self.hidden)

    def _visible(self):
        return [(i, r) for i, r in self.records.items() if i not in self.hidden]

    def _scope(self, checkpoint, as_of):
        return {"service": SERVICE, "checkpoint": checkpoint, "as_of": as_of}

    def batch(self, hashes):
        result, missing = [], []
        for event_id in hashes:
            if event_id in self.records and event_id not in self.hidden:
                result.append(self.records[event_id])
            else:
                missing.append(event_id)
        return {"result": result, "missing": missing, **self._scope(self.seq, self.clock)}

    def search(self, request: SearchRequest, candidates, ranking, coverage):
        eligible = {
            i for i, _ in self._visible()
            if query_matches(self.envelopes[i], request.filters)
            and (request.mode != "lexical" or text_matches(self.envelopes[i], request.terms))
        }
        check_search_candidates(candidates, eligible, request.limit, coverage)
        return {
            "result": [{"record": self.records[i]} for i in candidates[: request.limit]],
            **self._scope(self.seq, self.clock),
            "ranking": dict(ranking),
            "coverage": dict(coverage),
        }

    def query(self, request: QueryRequest):
        binding = request.binding()
        if request.cursor is not None:
            state = self.codec.decode(request.cursor, binding, current_checkpoint=self.seq)
            checkpoint, as_of, last = state.checkpoint, state.as_of, state.last_seq
        else:
            if request.after_seq > self.seq:
                raise ProtocolError("invalid_request", "after_seq is greater than the current checkpoint")
            checkpoint, as_of, last = self.seq, self.clock, request.after_seq
        result, more = [], False
        for event_id, record in sorted(self._visible(), key=lambda p: p[1]["seq"]):
            if not last < record["seq"] <= checkpoint or not query_matches(self.envelopes[event_id], request):
                continue
            if len(result) == request.limit:
                more = True
                break
            result.append(record)
        response = {"result": result, **self._scope(checkpoint, as_of)}
        if more:
            response["next_cursor"] = self.codec.encode(binding, CursorState(checkpoint, as_of, result[-1]["seq"]))
        return response
