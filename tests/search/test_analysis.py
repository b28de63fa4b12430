"""The analyzer's invariants: folding equals the core's, and candidate terms never miss."""

from __future__ import annotations

import re

from search_corpus import publication
from hypothesis import given, settings
from hypothesis import strategies as st

from akrelay.protocol.text import ascii_fold, search_text
from akrelay.search.analysis import GRAM, fold, indexed_text, is_short, prefix_pattern, term_grams

SCALARS = st.characters(blacklist_categories=("Cs",))


@given(st.text(SCALARS, max_size=200))
def test_fast_fold_is_the_core_fold(text):
    assert fold(text) == ascii_fold(text)


def test_indexed_text_is_the_core_search_text_padded():
    e = publication("ÄBC 语言 Straße", "MiXeD cache*", "ζΣ", conditions=["ONE", "two"], limitations=["X"])
    assert indexed_text(e) == search_text(e) + "\n" * (GRAM - 1)


def _grams(text):
    return {text[i:i + GRAM] for i in range(len(text) - GRAM + 1)}


@settings(max_examples=300)
@given(st.text(SCALARS, min_size=1, max_size=60), st.integers(0, 59), st.integers(1, 8))
def test_every_substring_term_is_found_by_its_candidate_clause(field, start, length):
    """The superset argument, checked directly on the analyzer's terms."""
    text = fold(field) + "\n" * (GRAM - 1)
    term = fold(field)[start:start + length]
    if not term or re.search(r"[\t-\r ]", term):
        return
    grams = _grams(text)
    if is_short(term):
        pattern = re.compile(prefix_pattern(term))
        assert any(pattern.fullmatch(g) for g in grams)
    else:
        assert set(term_grams(term)) <= grams
