"""The §9.5 search response: one page of ranked hits with ranking and coverage.

Serialization splices each record's stored canonical bytes (as query pages
do), so a hit's envelope reaches the client byte for byte as it was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from akrelay.jsontypes import JSON, JSONObject

import msgspec

from akrelay.store.base import Record

_json = msgspec.json.encode

#: The coverage reasons §9.5 defines, in the order we report them.
REASONS = ("candidate_limit", "index_lag", "approximate", "timeout")


@dataclass(frozen=True, slots=True)
class SearchHit:
    record: Record
    score: float
    explanation: str

    def to_dict(self) -> dict[str, JSON]:
        return {"record": cast("JSONObject", self.record.to_dict()), "explanation": self.explanation}

    def to_json(self) -> bytes:
        return b'{"explanation":%b,"record":%b}' % (_json(self.explanation), self.record.to_json())


@dataclass(frozen=True, slots=True)
class SearchPage:
    """A single page: hits in descending relevance, never a cursor.

    ``index_seq`` is the acceptance-log position the index snapshot covered;
    with ``checkpoint`` it tells a client how far behind the index was.
    """

    hits: list[SearchHit]
    service: str
    checkpoint: int
    as_of: int
    mode: str
    ranking_id: str
    reasons: tuple[str, ...]
    index_seq: int

    @property
    def exhaustive(self) -> bool:
        return not self.reasons

    def ranking(self) -> dict[str, JSON]:
        return {"mode": self.mode, "id": self.ranking_id}

    def coverage(self) -> dict[str, JSON]:
        return {"exhaustive": self.exhaustive, "reasons": list(self.reasons)}

    def to_dict(self) -> dict[str, JSON]:
        return {
            "result": [hit.to_dict() for hit in self.hits],
            "service": self.service,
            "checkpoint": self.checkpoint,
            "as_of": self.as_of,
            "ranking": self.ranking(),
            "coverage": self.coverage(),
            "index_seq": self.index_seq,
        }

    def to_json(self) -> bytes:
        result = b"[" + b",".join(hit.to_json() for hit in self.hits) + b"]"
        return b'{"as_of":%d,"checkpoint":%d,"coverage":%b,"index_seq":%d,"ranking":%b,"result":%b,"service":%b}' % (
            self.as_of, self.checkpoint, _json(self.coverage()), self.index_seq, _json(self.ranking()), result,
            _json(self.service),
        )
