"""Exact query requests and matching (Agent Knowledge §9.3).

:func:`parse_query` turns decoded HTTP pairs into a frozen
:class:`QueryRequest`; :func:`query_matches` is the §9.3 predicate. So that a
store can answer every filter but ``q`` and the time range by exact lookup,
:func:`index_terms` lists the facts an event offers and
:func:`request_terms` the facts a request requires:
``query_matches(e, r)`` ⇔ ``set(request_terms(r)) <= set(index_terms(e))``
and the time range and text match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Literal, TypedDict, TypeGuard

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import (
    ASSESS, EVENT_TYPES, KINDS, PUBLISH, RELATIONS, VERDICTS,
    is_canonical_agent_id, is_canonical_id, is_language, is_tag,
)
from akrelay.protocol.text import ascii_fold, distinct_terms, text_matches

if TYPE_CHECKING:
    from akrelay.protocol.documents import Payload, Relation
    from akrelay.protocol.envelope import Envelope

MAX_SAFE_INTEGER = 2**53 - 1
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: The exact filters shared by ``query`` and ``search`` (§9.3, §9.5).
FILTER_NAMES = (
    "actor", "type", "kind", "target", "relation", "tag", "profile", "language", "verdict",
    "created_from", "created_before",
)
PARAMETER_NAMES = frozenset((*FILTER_NAMES, "q", "after_seq", "cursor", "limit"))
StringFilter = Literal["actor", "type", "kind", "target", "relation", "tag", "profile", "language", "verdict"]
TimeFilter = Literal["created_from", "created_before"]
FilterName = StringFilter | TimeFilter
_TIME_FILTERS: tuple[TimeFilter, ...] = ("created_from", "created_before")
_STRING_FILTERS: tuple[StringFilter, ...] = (
    "actor", "type", "kind", "target", "relation", "tag", "profile", "language", "verdict",
)
_FILTER_SET = frozenset(FILTER_NAMES)
assert FILTER_NAMES == (*_STRING_FILTERS, *_TIME_FILTERS)
_DIGITS_RE = re.compile(r"[0-9]+")
_INTEGER_PARAMETERS = frozenset(("created_from", "created_before", "after_seq", "limit"))


class QueryFields(TypedDict, total=False):
    """The keyword arguments of :class:`QueryRequest`, as a parser collects them."""

    actor: str
    type: str
    kind: str
    target: str
    relation: str
    tag: str
    profile: str
    language: str
    verdict: str
    created_from: int
    created_before: int
    q: tuple[str, ...]
    q_text: str
    after_seq: int
    cursor: str
    limit: int


#: A filter's decoded value: an integer for the time range, a string for the others.
FilterValue = str | int


def is_filter_name(name: object) -> TypeGuard[FilterName]:
    return name in _FILTER_SET


@dataclass(frozen=True, slots=True)
class QueryRequest:
    """A validated query. ``q`` holds the distinct folded terms; ``q_text`` the raw text."""

    actor: str | None = None
    type: str | None = None
    kind: str | None = None
    target: str | None = None
    relation: str | None = None
    tag: str | None = None
    profile: str | None = None
    language: str | None = None
    verdict: str | None = None
    created_from: int | None = None
    created_before: int | None = None
    q: tuple[str, ...] | None = None
    q_text: str | None = None
    after_seq: int = 0
    cursor: str | None = None
    limit: int = DEFAULT_LIMIT

    def filters(self) -> dict[str, FilterValue]:
        """The decoded filters that are set (``q`` as its raw text), for cursor binding and logs."""
        out: dict[str, FilterValue] = {}
        for name in FILTER_NAMES:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.q_text is not None:
            out["q"] = self.q_text
        return out

    def binding(self) -> dict[str, FilterValue]:
        """What a cursor binds: the filters plus the effective ``limit`` and ``after_seq``."""
        return {**self.filters(), "limit": self.limit, "after_seq": self.after_seq}


def _bad(message: str) -> ProtocolError:
    return ProtocolError("invalid_request", message)


def _http_integer(name: str, value: str) -> int:
    if type(value) is not str or _DIGITS_RE.fullmatch(value) is None:
        raise _bad(f"{name} must be written with ASCII decimal digits only")
    digits = value.lstrip("0") or "0"
    if len(digits) > 16 or int(digits) > MAX_SAFE_INTEGER:
        raise _bad(f"{name} exceeds 2^53-1")
    return int(digits)


def check_filter(name: str, value: object) -> FilterValue:
    """Validate one exact filter value (already decoded to its JSON type); ``invalid_request``."""
    if name in _TIME_FILTERS:
        return check_time_filter(name, value)
    return check_string_filter(name, value)


def check_time_filter(name: str, value: object) -> int:
    """``created_from`` or ``created_before``: a JSON integer in 0..2^53-1; ``invalid_request``."""
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
        raise _bad(f"malformed {name} filter")
    return value


def check_string_filter(name: str, value: object) -> str:
    """Validate one exact filter value other than the time range; ``invalid_request``."""
    if name == "actor":
        ok = is_canonical_agent_id(value)
    elif name in ("target", "profile"):
        ok = is_canonical_id(value)
    elif name == "type":
        ok = type(value) is str and value in EVENT_TYPES
    elif name == "kind":
        ok = type(value) is str and value in KINDS
    elif name == "relation":
        ok = type(value) is str and value in RELATIONS
    elif name == "verdict":
        ok = type(value) is str and value in VERDICTS
    elif name == "tag":
        ok = is_tag(value)
    elif name == "language":
        ok = is_language(value)
    else:
        raise _bad(f"unknown filter {name!r}")
    if not ok or type(value) is not str:  # each check above accepts strings only
        raise _bad(f"malformed {name} filter")
    return value


def check_time_range(created_from: int | None, created_before: int | None) -> None:
    if created_from is not None and created_before is not None and not created_from < created_before:
        raise _bad("created_from must be less than created_before")


def parse_query(pairs: Iterable[tuple[str, str]]) -> QueryRequest:
    """Strictly parse decoded ``application/x-www-form-urlencoded`` pairs.

    Unknown, repeated or malformed parameters are ``invalid_request``.
    """
    texts: dict[str, str] = {}
    numbers: dict[str, int] = {}
    for name, value in pairs:
        if name not in PARAMETER_NAMES:
            raise _bad(f"unknown query parameter {name!r}")
        if name in texts or name in numbers:
            raise _bad(f"query parameter {name!r} is repeated")
        if type(value) is not str:
            raise _bad(f"query parameter {name!r} must be a string")
        if name in _INTEGER_PARAMETERS:
            numbers[name] = _http_integer(name, value)
        else:
            texts[name] = value
    fields: QueryFields = {}
    # FILTER_NAMES order (the string filters, then the time range): the first malformed filter is the one reported
    for name in _STRING_FILTERS:
        if name in texts:
            fields[name] = check_string_filter(name, texts[name])
    for time_name in _TIME_FILTERS:
        if time_name in numbers:
            fields[time_name] = check_time_filter(time_name, numbers[time_name])
    check_time_range(fields.get("created_from"), fields.get("created_before"))
    if "q" in texts:
        fields["q"] = distinct_terms(texts["q"], lexical=True)
        fields["q_text"] = texts["q"]
    if "limit" in numbers:
        if not 1 <= numbers["limit"] <= MAX_LIMIT:
            raise _bad(f"limit must be 1 through {MAX_LIMIT}")
        fields["limit"] = numbers["limit"]
    if "after_seq" in numbers:
        fields["after_seq"] = numbers["after_seq"]
    if "cursor" in texts:
        if texts["cursor"] == "":
            raise _bad("cursor must be non-empty")
        fields["cursor"] = texts["cursor"]
    return QueryRequest(**fields)


def _publication_relations(payload: Payload) -> list[Relation]:
    return payload.get("relations", [])


def query_matches(envelope: Envelope, request: QueryRequest) -> bool:
    """The §9.3 predicate over one event; ``after_seq``, ``limit`` and ``cursor`` are not filters."""
    event = envelope.event
    payload = event["payload"]
    etype = event["type"]
    if request.actor is not None and event["actor"] != request.actor:
        return False
    if request.type is not None and etype != request.type:
        return False
    created_at = event["created_at"]
    if request.created_from is not None and created_at < request.created_from:
        return False
    if request.created_before is not None and created_at >= request.created_before:
        return False
    is_publication = etype == PUBLISH
    if request.kind is not None and (not is_publication or payload["kind"] != request.kind):
        return False
    if request.tag is not None and (not is_publication or request.tag not in payload.get("tags", ())):
        return False
    if request.language is not None and (
        not is_publication or ascii_fold(payload["language"]) != ascii_fold(request.language)
    ):
        return False
    if request.verdict is not None and (etype != ASSESS or payload["verdict"] != request.verdict):
        return False
    if request.profile is not None and not any(
        b["profile"]["digest"] == request.profile for b in payload.get("profiles", ())
    ):
        return False
    if request.relation is not None:
        if not is_publication or not any(
            r["relation"] == request.relation and (request.target is None or r["target"] == request.target)
            for r in _publication_relations(payload)
        ):
            return False
    elif request.target is not None:
        if is_publication:
            if not any(r["target"] == request.target for r in _publication_relations(payload)):
                return False
        elif payload["target"] != request.target:
            return False
    if request.q is not None and not text_matches(envelope, request.q):
        return False
    return True


def index_terms(envelope: Envelope) -> list[tuple[str, str]]:
    """The distinct exact-lookup facts of one event, sorted."""
    event = envelope.event
    payload = event["payload"]
    etype = event["type"]
    terms = {("actor", event["actor"]), ("type", etype)}
    if etype == PUBLISH:
        terms.add(("kind", payload["kind"]))
        terms.add(("language", ascii_fold(payload["language"])))
        for tag in payload.get("tags", ()):
            terms.add(("tag", tag))
        for r in payload.get("relations", ()):
            terms.add(("relation", r["relation"]))
            terms.add(("target", r["target"]))
            terms.add(("relation_target", r["relation"] + " " + r["target"]))
    else:
        terms.add(("target", payload["target"]))
        if etype == ASSESS:
            terms.add(("verdict", payload["verdict"]))
    for binding in payload.get("profiles", ()):
        terms.add(("profile", binding["profile"]["digest"]))
    return sorted(terms)


def request_terms(request: QueryRequest) -> list[tuple[str, str]]:
    """The facts an event must offer (AND) to match ``request``, apart from ``q`` and the time range."""
    terms = []
    for name in ("actor", "type", "kind", "tag", "verdict", "profile"):
        value = getattr(request, name)
        if value is not None:
            terms.append((name, value))
    if request.language is not None:
        terms.append(("language", ascii_fold(request.language)))
    if request.relation is not None and request.target is not None:
        terms.append(("relation_target", request.relation + " " + request.target))
    elif request.relation is not None:
        terms.append(("relation", request.relation))
    elif request.target is not None:
        terms.append(("target", request.target))
    return sorted(terms)


def in_time_range(envelope: Envelope, request: QueryRequest) -> bool:
    created_at = envelope.event["created_at"]
    return (request.created_from is None or created_at >= request.created_from) and (
        request.created_before is None or created_at < request.created_before
    )
