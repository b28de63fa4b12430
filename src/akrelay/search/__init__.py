"""Ranked search (Agent Knowledge §9.5): a Tantivy index following the acceptance log.

Tantivy proposes candidates; the protocol core verifies every hit, so lexical
hits are exactly ``q`` matches and coverage never overstates completeness.

The re-exports are loaded on first access (PEP 562): ``akrelay.search.options``
is read by the settings, which must not load Tantivy (``akrelay --help``, the
launcher; issue 25).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from akrelay.lazy import lazy_exports

if TYPE_CHECKING:
    from akrelay.search.analysis import RANKING_ID
    from akrelay.search.lexical import Budget
    from akrelay.search.results import SearchHit, SearchPage
    from akrelay.search.engine import FEATURE, MODES, SearchEngine, reindex

#: Each re-exported name and the module that defines it.
_EXPORTS = {
    "RANKING_ID": "analysis", "Budget": "lexical", "SearchHit": "results", "SearchPage": "results",
    "FEATURE": "engine", "MODES": "engine", "SearchEngine": "engine", "reindex": "engine",
}

__all__ = ["FEATURE", "MODES", "RANKING_ID", "Budget", "SearchHit", "SearchPage", "SearchEngine", "reindex"]


__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
