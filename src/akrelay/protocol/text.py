"""Portable text matching (Agent Knowledge §9.3.1), exactly as specified.

Literal substrings only: ASCII-only case folding, no normalization, stemming
or wildcards, so every service gives the same answer for the same ``q``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import PUBLISH, RETRACT

if TYPE_CHECKING:
    from akrelay.protocol.envelope import Envelope

MAX_TEXT_CHARS = 1024
MAX_LEXICAL_TERMS = 16
_SPLIT_RE = re.compile(r"[\x09-\x0d\x20]+")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_fold(value: str) -> str:
    """Fold ASCII ``A``–``Z`` only; every other character is left as is."""
    if value.isascii():
        return value.lower()  # on pure ASCII, lower() changes exactly A-Z
    return value.translate(_FOLD)


def text_terms(text: object, lexical: bool = True) -> list[str]:
    """Split ``text`` into folded terms, in order, repeats kept (as the vectors list them).

    ``invalid_request`` unless it has 1..1024 Unicode scalar values and 1..16
    terms (the term bound applies in lexical mode only). Repeated terms have the
    effect of one; use :func:`distinct_terms` for matching.
    """
    if type(text) is not str or not 1 <= len(text) <= MAX_TEXT_CHARS:
        raise ProtocolError("invalid_request", f"text must contain 1 through {MAX_TEXT_CHARS} Unicode scalar values")
    if not text.isascii() and _SURROGATE_RE.search(text):
        raise ProtocolError("invalid_request", "text must not contain unpaired surrogates")
    terms = [ascii_fold(part) for part in _SPLIT_RE.split(text) if part]
    if not terms:
        raise ProtocolError("invalid_request", "text must contain at least one term (ASCII whitespace separates terms)")
    if lexical and len(terms) > MAX_LEXICAL_TERMS:
        raise ProtocolError("invalid_request", f"text must contain at most {MAX_LEXICAL_TERMS} terms, got {len(terms)}")
    return terms


def distinct_terms(text: object, lexical: bool = True) -> tuple[str, ...]:
    """:func:`text_terms` without repeats, first occurrence first."""
    return tuple(dict.fromkeys(text_terms(text, lexical)))


def eligible_fields(envelope: Envelope) -> list[str]:
    """The searchable fields of one event; each ``context`` item is its own field."""
    event = envelope.event
    payload = event["payload"]
    etype = event["type"]
    if etype == RETRACT:
        return [payload["reason"]]
    if etype == PUBLISH:
        fields = [payload["title"], payload["statement"], payload["basis"]]
    else:
        fields = [payload["summary"], payload["basis"]]
    context = payload["context"]
    fields.append(context["scope"])
    fields.extend(context["conditions"])
    fields.extend(context["limitations"])
    return fields


def search_text(envelope: Envelope) -> str:
    """Folded eligible fields joined by ``"\\n"``.

    A term never contains ASCII whitespace, so a substring hit in this text is
    always inside a single field: stores may search it directly.
    """
    return "\n".join(ascii_fold(field) for field in eligible_fields(envelope))


def text_matches(envelope: Envelope, terms: Iterable[str]) -> bool:
    """Every (already folded) term occurs in some eligible field."""
    haystack = search_text(envelope)
    return all(term in haystack for term in terms)
