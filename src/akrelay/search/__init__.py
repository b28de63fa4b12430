"""Ranked search (Agent Knowledge §9.5): a Tantivy index following the acceptance log.

Tantivy proposes candidates; the protocol core verifies every hit, so lexical
hits are exactly ``q`` matches and coverage never overstates completeness.
"""

from akrelay.search.analysis import RANKING_ID
from akrelay.search.lexical import Budget
from akrelay.search.results import SearchHit, SearchPage
from akrelay.search.service import FEATURE, MODES, SearchService, reindex

__all__ = ["FEATURE", "MODES", "RANKING_ID", "Budget", "SearchHit", "SearchPage", "SearchService", "reindex"]
