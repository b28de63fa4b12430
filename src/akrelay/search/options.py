"""``akrelay serve`` options of the ranked-search service (one ``option`` call each)."""

from __future__ import annotations

from dataclasses import dataclass

from akrelay.optionkit import _positive_int, option, setting

option("search_candidates", _positive_int, 1000,
       "most search candidates verified per request; beyond it coverage reports candidate_limit", metavar="N",
       serve_only=True)
option("search_timeout_ms", _positive_int, 500,
       "time per search request for verifying candidates; beyond it coverage reports timeout", metavar="MS", serve_only=True)
option("search_writer_threads", _positive_int, 1,
       "Tantivy indexing threads in the worker elected as the search indexer", metavar="N", serve_only=True)


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """The ranked-search service's settings (``settings.search``)."""

    candidates: int = setting("search_candidates")
    timeout_ms: int = setting("search_timeout_ms")
    writer_threads: int = setting("search_writer_threads")
