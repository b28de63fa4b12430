"""Unsigned read-request bodies: batch (§9.4) and ranked search (§9.5).

Read bodies are parsed strictly under Identity's I-JSON rules and are closed;
every defect is ``invalid_request``, except an unknown or unadvertised search
mode, which is ``unsupported_search_mode`` and is checked first so that a
service never silently substitutes a mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from akrelay.jsontypes import JSON
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.ijson import parse_strict
from akrelay.protocol.payload import is_canonical_id
from akrelay.protocol.query import (
    FILTER_NAMES, QueryFields, QueryRequest, check_string_filter, check_time_filter, check_time_range, is_filter_name,
)
from akrelay.protocol.text import distinct_terms

SEARCH_MODES = ("lexical", "semantic", "hybrid")
MAX_BATCH = 100
DEFAULT_SEARCH_LIMIT = 20
MAX_SEARCH_LIMIT = 100
_SEARCH_KEYS = frozenset(("text", "mode", "filters", "limit"))
_FILTER_KEYS = frozenset(FILTER_NAMES)


def _bad(message: str) -> ProtocolError:
    return ProtocolError("invalid_request", message)


def parse_read_json(raw: bytes | str) -> JSON:
    """Strict I-JSON for read bodies; any defect is ``invalid_request``."""
    return parse_strict(raw, code="invalid_request")


def parse_batch_request(value: object) -> list[str]:
    """The requested IDs of a closed ``{"hashes": [...]}`` body, in caller order."""
    if type(value) is not dict:
        raise _bad("batch request must be an object")
    if set(value) != {"hashes"}:
        raise _bad("batch request must have exactly the member 'hashes'")
    hashes = value["hashes"]
    if type(hashes) is not list or not 1 <= len(hashes) <= MAX_BATCH:
        raise _bad(f"hashes must be an array of 1 through {MAX_BATCH} event IDs")
    for event_id in hashes:
        if not is_canonical_id(event_id):
            raise _bad("hashes must contain canonical event IDs")
    if len(set(hashes)) != len(hashes):
        raise _bad("hashes must be distinct")
    return list(hashes)


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """A validated search request; ``filters`` reuses the exact query predicate (``q`` unset)."""

    text: str
    mode: str
    terms: tuple[str, ...]
    filters: QueryRequest = field(default_factory=QueryRequest)
    limit: int = DEFAULT_SEARCH_LIMIT


def _json_integer(value: object) -> int | None:
    """A JSON integer: ``int`` (not ``bool``) or an integral float such as ``1.0``."""
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    return None


def parse_search_filters(value: object) -> QueryRequest:
    if type(value) is not dict:
        raise _bad("filters must be an object")
    fields: QueryFields = {}
    for name, item in value.items():
        if not is_filter_name(name):
            raise _bad(f"unknown search filter {name!r}")
        if name == "created_from" or name == "created_before":
            number = _json_integer(item)
            if number is None:
                raise _bad(f"{name} must be a JSON integer")
            fields[name] = check_time_filter(name, number)
        else:
            fields[name] = check_string_filter(name, item)
    check_time_range(fields.get("created_from"), fields.get("created_before"))
    return QueryRequest(**fields)


def parse_search_request(value: object, modes: Iterable[str] = SEARCH_MODES) -> SearchRequest:
    """Validate a ranked-search body against the service's advertised ``modes``."""
    if type(value) is not dict:
        raise _bad("search request must be an object")
    mode = value.get("mode")
    if type(mode) is str and (mode not in SEARCH_MODES or mode not in tuple(modes)):
        raise ProtocolError(
            "unsupported_search_mode", f"search mode {mode!r} is not advertised here; no fallback was performed",
            {"modes": [m for m in modes if m in SEARCH_MODES]},
        )
    for key in value:
        if key not in _SEARCH_KEYS:
            raise _bad(f"unknown search request member {key!r}")
    if "text" not in value or "mode" not in value:
        raise _bad("search request requires text and mode")
    if type(mode) is not str:
        raise _bad("mode must be a string")
    terms = distinct_terms(value["text"], lexical=mode == "lexical")
    filters = parse_search_filters(value["filters"]) if "filters" in value else QueryRequest()
    limit = DEFAULT_SEARCH_LIMIT
    if "limit" in value:
        number = _json_integer(value["limit"])
        if number is None or not 1 <= number <= MAX_SEARCH_LIMIT:
            raise _bad(f"limit must be an integer from 1 through {MAX_SEARCH_LIMIT}")
        limit = number
    return SearchRequest(value["text"], mode, terms, filters, limit)
