"""text_cases: §9.3.1 term splitting, folding and field-bounded matching."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.text import ascii_fold, distinct_terms, eligible_fields, search_text, text_matches, text_terms
from knowledge_vectors import FIXTURES, cases, envelope

CASES = cases("text_cases")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_text_case(case):
    try:
        terms = text_terms(case["text"], case.get("lexical", True))
        outcome = "valid"
    except ProtocolError as exc:
        outcome = exc.code
    assert outcome == case["expected"]
    if outcome == "valid":
        assert terms == case["terms"]
        if "fixture" in case:
            assert text_matches(envelope(case["fixture"]), distinct_terms(case["text"])) is case["matches"]


def test_ascii_fold_touches_only_ascii_letters():
    assert ascii_fold("ÄBC-Ωz") == "Äbc-Ωz"
    assert ascii_fold("İSTANBUL") == "İstanbul"


def test_eligible_fields_keep_context_items_separate():
    item = envelope("text_publication")
    fields = eligible_fields(item)
    p = item.payload
    assert fields == [p["title"], p["statement"], p["basis"], p["context"]["scope"],
                      *p["context"]["conditions"], *p["context"]["limitations"]]
    assert eligible_fields(envelope("text_retraction")) == [envelope("text_retraction").payload["reason"]]


@settings(max_examples=300, deadline=None)
@given(
    fields=st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=5),
    term=st.text(alphabet=st.characters(blacklist_characters="\t\n\x0b\x0c\r "), min_size=1, max_size=6),
)
def test_search_text_substring_equals_per_field_match(fields, term):
    """The joined search text never lets a whitespace-free term span two fields."""
    joined = "\n".join(ascii_fold(f) for f in fields)
    folded = ascii_fold(term)
    assert (folded in joined) == any(folded in ascii_fold(f) for f in fields)


@pytest.mark.parametrize("name", [n for n in FIXTURES if n.startswith(("text_", "research_question", "original"))])
def test_search_text_is_folded_fields(name):
    item = envelope(name)
    assert search_text(item) == "\n".join(ascii_fold(f) for f in eligible_fields(item))


_REFERENCE_FOLD = {ord(c): ord(c) + 32 for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"}


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20))
def test_ascii_fold_equals_the_reference_mapping(text):
    """The ASCII fast path (``str.lower``) and the translation table agree on every string."""
    assert ascii_fold(text) == text.translate(_REFERENCE_FOLD)
