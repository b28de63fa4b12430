"""Acceptance records and client-side checks of read responses (§8.3, §9.3–§9.5).

Response metadata is unsigned, so a client verifies every returned envelope
and every promise the service makes (scope, order, filters, partitions,
coverage). A broken promise is the local diagnosis ``invalid_response``, not a
wire error.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Iterable, Mapping, cast

from akrelay.protocol.discovery import is_canonical_origin
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.options import DEFAULT_OPTIONS, ValidationOptions
from akrelay.protocol.payload import check_payload_rules, is_hash_shape, is_nonempty_text
from akrelay.protocol.query import MAX_LIMIT, QueryRequest, query_matches
from akrelay.protocol.reads import SEARCH_MODES, SearchRequest
from akrelay.protocol.text import text_matches

if TYPE_CHECKING:
    from akrelay.protocol.documents import AcceptanceRecord, RecordShape
    from akrelay.protocol.envelope import Envelope
    from akrelay.protocol.query import FilterValue

MAX_SAFE = 2**53 - 1
COVERAGE_REASONS = frozenset(("candidate_limit", "index_lag", "approximate", "timeout"))


def _bad(message: str) -> ProtocolError:
    return ProtocolError("invalid_response", message)


def _safe_int(value: object, minimum: int) -> bool:
    return type(value) is int and minimum <= value <= MAX_SAFE


def make_record(envelope: Envelope, accepted_at: int, seq: int) -> AcceptanceRecord:
    """The wire form of an acceptance record."""
    return {"envelope": envelope.to_dict(), "accepted_at": accepted_at, "seq": seq}


def check_record_shape(record: object) -> dict[str, object]:
    """An acceptance record's shape, without verifying its envelope; returns the envelope object.

    Shared by clients that verify envelopes here (:func:`validate_record`) and by
    sync, which leaves verification to the relay's acceptance pipeline.
    """
    if type(record) is not dict or not {"envelope", "accepted_at", "seq"} <= record.keys():
        raise _bad("acceptance record must have envelope, accepted_at and seq")
    if not _safe_int(record["accepted_at"], 0):
        raise _bad("accepted_at must be a non-negative safe integer")
    if not _safe_int(record["seq"], 1):
        raise _bad("seq must be a positive safe integer")
    if type(record["envelope"]) is not dict:
        raise _bad("record envelope must be an object")
    return record["envelope"]


def validate_record(record: object, expected_id: str | None = None, *, options: ValidationOptions = DEFAULT_OPTIONS) -> Envelope:
    """Check one acceptance record and verify its envelope; returns the ``Envelope``."""
    from akrelay.protocol import envelope as envelope_module  # the identity half's step-1 verifier

    item = check_record_shape(record)
    try:
        raw = json.dumps(item, ensure_ascii=False, allow_nan=False).encode("utf-8")
        verified = envelope_module.verify_envelope(raw, options=options)
        check_payload_rules(verified, options)
    except ProtocolError as exc:
        raise _bad(f"returned envelope does not verify ({exc.code}: {exc.message})") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise _bad(f"returned envelope is not serializable JSON: {type(exc).__name__}") from None
    if expected_id is not None and verified.id != expected_id:
        raise _bad(f"asked for {expected_id} but received {verified.id}")
    return verified


def check_list_shape(response: object, service: str, *, max_items: int, hits: bool = False) -> list[RecordShape]:
    """Scope and shape of a list response (§9.3.2); returns its acceptance records, not yet verified.

    ``service`` must be the origin that was asked; every record has a valid shape
    and ``seq <= checkpoint``. With ``hits`` the items are search hits holding a record.
    """
    if type(response) is not dict:
        raise _bad("response must be an object")
    for key in ("result", "service", "checkpoint", "as_of"):
        if key not in response:
            raise _bad(f"response is missing {key!r}")
    if not is_canonical_origin(response["service"]):
        raise _bad("response service is not a canonical origin")
    if response["service"] != service:
        raise _bad(f"response service {response['service']!r} differs from the requested origin {service!r}")
    if not _safe_int(response["checkpoint"], 0):
        raise _bad("checkpoint must be a non-negative safe integer")
    if not _safe_int(response["as_of"], 0):
        raise _bad("as_of must be a non-negative safe integer")
    result = response["result"]
    if type(result) is not list or len(result) > max_items:
        raise _bad(f"result must be an array of at most {max_items} items")
    records: list[dict[str, object]] = []
    for item in result:
        if hits:
            if type(item) is not dict or "record" not in item:
                raise _bad("search hits must be objects with a record")
            if "explanation" in item and not is_nonempty_text(item["explanation"]):
                raise _bad("a search explanation must be non-empty text")
            item = item["record"]
        check_record_shape(item)
        if item["seq"] > response["checkpoint"]:
            raise _bad(f"record seq {item['seq']} is beyond the checkpoint")
        records.append(item)
    return cast("list[RecordShape]", records)  # each one checked by check_record_shape


def _scoped_records(response: object, service: str, *, hits: bool, max_items: int) -> list[tuple[RecordShape, Envelope]]:
    """:func:`check_list_shape`, then every envelope verified; returns (record, verified envelope) pairs."""
    return _verified(check_list_shape(response, service, max_items=max_items, hits=hits))


def _verified(records: list[RecordShape]) -> list[tuple[RecordShape, Envelope]]:
    out = []
    seen = set()
    for record in records:
        verified = validate_record(record)
        if verified.id in seen:
            raise _bad(f"event {verified.id} is repeated")
        seen.add(verified.id)
        out.append((record, verified))
    return out


def check_query_shape(response: object, service: str, *, after_seq: int, limit: int) -> tuple[list[RecordShape], str | None]:
    """One query page's shape: at most ``limit`` records in ascending ``seq`` after ``after_seq``.

    Returns the records (not verified) and ``next_cursor`` (``None`` on the last page).
    """
    records = check_list_shape(response, service, hits=False, max_items=MAX_LIMIT)
    if type(response) is not dict:
        raise _bad("response must be an object")
    cursor = response.get("next_cursor")
    if "next_cursor" in response and not is_nonempty_text(cursor):
        raise _bad("next_cursor must be a non-empty string")
    if len(records) > limit:
        raise _bad(f"query page holds {len(records)} records, more than limit {limit}")
    previous = after_seq
    for record in records:
        if record["seq"] <= previous:
            raise _bad(f"query results are out of order: seq {record['seq']} does not follow {previous}")
        previous = record["seq"]
    return records, cursor


def check_same_scope(scope: tuple[int, int] | None, response: Mapping[str, object]) -> tuple[int, int]:
    """Pages of one enumeration keep the first page's ``(checkpoint, as_of)`` (§9.3.2); returns it.

    ``scope`` is ``None`` for the first page; ``response`` has passed :func:`check_list_shape`.
    """
    checkpoint, as_of = response["checkpoint"], response["as_of"]
    if type(checkpoint) is not int or type(as_of) is not int:  # check_list_shape made them safe integers
        raise _bad("checkpoint and as_of must be integers")
    current = (checkpoint, as_of)
    if scope is not None and current != scope:
        raise _bad("checkpoint or as_of changed between pages of one enumeration")
    return current


def validate_query_response(response: object, request: QueryRequest, service: str) -> list[Envelope]:
    """One query page: ascending ``seq`` after ``after_seq``, at most ``limit``, every record matching."""
    records, _ = check_query_shape(response, service, after_seq=request.after_seq, limit=request.limit)
    pairs = _verified(records)
    for _, verified in pairs:
        if not query_matches(verified, request):
            raise _bad(f"record {verified.id} does not match the exact filters")
    return [verified for _, verified in pairs]


def check_batch_shape(response: object, requested: Iterable[str], service: str) -> tuple[list[RecordShape], list[str]]:
    """A batch answer's shape (§9.4): ``result`` and ``missing`` partition the requested IDs,
    each in request order, by the hashes the returned envelopes claim (not yet verified).

    Returns the records and the missing IDs.
    """
    records = check_list_shape(response, service, hits=False, max_items=100)
    if type(response) is not dict:
        raise _bad("response must be an object")
    if "next_cursor" in response:
        raise _bad("a batch response has no next_cursor")
    missing = response.get("missing")
    if type(missing) is not list or not all(is_hash_shape(m) for m in missing) or len(set(missing)) != len(missing):
        raise _bad("missing must be an array of distinct event IDs")
    ids = [record["envelope"].get("hash") for record in records]
    if not all(is_hash_shape(i) for i in ids):
        raise _bad("a returned envelope lacks a valid hash")
    requested = list(requested)
    wanted, present, absent = set(requested), set(ids), set(missing)
    if not present <= wanted or not absent <= wanted:
        raise _bad("batch result or missing names an ID that was not requested")
    if len(present) != len(ids) or present & absent or present | absent != wanted:
        raise _bad("batch result and missing must account for every requested ID exactly once")
    if ids != [i for i in requested if i in present] or missing != [i for i in requested if i in absent]:
        raise _bad("batch result and missing must each keep the order of the request")
    return records, missing


def validate_batch_response(response: object, requested: Iterable[str], service: str) -> list[Envelope]:
    """A batch is an ordered, complete, disjoint partition of the requested IDs, every envelope verified."""
    records, _ = check_batch_shape(response, requested, service)
    # check_batch_shape checked that each claimed hash is a string (str() of a str is the string itself)
    return [validate_record(record, str(record["envelope"]["hash"])) for record in records]


def validate_search_response(response: object, request: SearchRequest, service: str) -> list[Envelope]:
    """A single ranked page honouring the mode, exact filters, lexical text and coverage rules."""
    pairs = _scoped_records(response, service, hits=True, max_items=100)
    if type(response) is not dict:
        raise _bad("response must be an object")
    if "next_cursor" in response:
        raise _bad("search returns a single page (no next_cursor)")
    ranking, coverage = response.get("ranking"), response.get("coverage")
    if type(ranking) is not dict or ranking.get("mode") not in SEARCH_MODES or not is_nonempty_text(ranking.get("id")):
        raise _bad("ranking must have a defined mode and a non-empty id")
    if ranking["mode"] != request.mode:
        raise _bad("search substituted another mode")
    if type(coverage) is not dict or type(coverage.get("exhaustive")) is not bool:
        raise _bad("coverage must have a boolean exhaustive")
    reasons = coverage.get("reasons")
    if type(reasons) is not list or len(set(map(str, reasons))) != len(reasons) or not all(
        type(r) is str and r in COVERAGE_REASONS for r in reasons
    ):
        raise _bad("coverage.reasons must be distinct defined reasons")
    if coverage["exhaustive"] and reasons:
        raise _bad("exhaustive coverage cannot list reasons")
    if not coverage["exhaustive"] and not reasons:
        raise _bad("non-exhaustive coverage must give at least one reason")
    if request.mode != "lexical" and (coverage["exhaustive"] or "approximate" not in reasons):
        raise _bad(f"{request.mode} search must report non-exhaustive, approximate coverage")
    if len(pairs) > request.limit:
        raise _bad("search result exceeds the requested limit")
    for _, verified in pairs:
        if not query_matches(verified, request.filters):
            raise _bad(f"hit {verified.id} ignores the exact filters")
        if request.mode == "lexical" and not text_matches(verified, request.terms):
            raise _bad(f"lexical hit {verified.id} does not match the text")
    return [verified for _, verified in pairs]


def check_search_candidates(
    candidates: list[str], eligible: set[str], limit: int, coverage: Mapping[str, object]
) -> None:
    """Service-side guard: ranked candidates are distinct eligible records, and
    ``exhaustive`` is claimed only when the page holds every eligible record."""
    if len(set(candidates)) != len(candidates) or not set(candidates) <= eligible:
        raise _bad("candidates repeat an event or violate the exact filters or text")
    if coverage.get("exhaustive") and (set(candidates) != eligible or len(candidates) > limit):
        raise _bad("exhaustive coverage claimed for an incomplete or truncated page")


class PageTracker:
    """Checks that consecutive query pages form one complete, consistent enumeration."""

    def __init__(self, service: str) -> None:
        if not is_canonical_origin(service):
            raise ValueError("service must be a canonical HTTPS origin")
        self.service = service
        self._binding: dict[str, FilterValue] | None = None
        self._scope: tuple[str, int, int] | None = None
        self._seen: set[str] = set()
        self._last = 0
        self._next: str | None = None

    def accept(self, request: QueryRequest, response: object) -> list[Envelope]:
        envelopes = validate_query_response(response, request, self.service)
        if type(response) is not dict:
            raise _bad("response must be an object")
        binding = request.binding()
        scope = (response["service"], response["checkpoint"], response["as_of"])
        if self._binding is None:
            if request.cursor is not None:
                raise _bad("a traversal must start without a cursor")
            self._last = request.after_seq
        elif self._next is None or request.cursor != self._next:
            raise _bad("the request does not follow the previous page's next_cursor")
        elif binding != self._binding:
            raise _bad("pagination parameters changed between pages")
        else:
            check_same_scope(self._scope[1:] if self._scope else None, response)
        seqs = [r["seq"] for r in response["result"]]
        if any(e.id in self._seen for e in envelopes) or (seqs and seqs[0] <= self._last):
            raise _bad("pagination repeated an event or moved backwards")
        self._binding, self._scope = binding, scope
        self._seen.update(e.id for e in envelopes)
        if seqs:
            self._last = seqs[-1]
        self._next = response.get("next_cursor")
        return envelopes

    @property
    def complete(self) -> bool:
        return self._binding is not None and self._next is None

    @property
    def checkpoint(self) -> int | None:
        """The ``after_seq`` to persist for the next poll, only once every page was consumed."""
        return self._scope[1] if self.complete and self._scope is not None else None
