"""Language classification of a command (KIP §73.1) and the KML recogniser.

A caller-supplied ``language`` label can never downgrade a write into a read,
so the runtime classifies the command text itself. akrelay is a read-only
runtime (§76): any KML statement must be answered ``ReadonlyViolation``, never
``InvalidSyntax``, so KML is recognised by its leading statement keyword(s)
(Appendix B) without being parsed in full. Comments and whitespace before the
first keyword are skipped; keywords are ASCII case-insensitive.
"""

from __future__ import annotations

import re

#: Leading keywords of every KML statement of Appendix B (plus MUTATE blocks).
KML_KEYWORDS = frozenset({
    "MUTATE", "CREATE", "UPSERT", "ENSURE", "ASSERT", "UPDATE", "TRANSITION",
    "PURGE", "MERGE", "DEFINE", "ARCHIVE", "TOMBSTONE", "RESTORE",
})
#: Two-word KML statements whose first word alone is not decisive.
KML_PAIRS = frozenset({("SET", "RETENTION")})
#: Leading keywords of the META families (§63.3, §68, Appendix C).
META_KEYWORDS = frozenset({
    "DESCRIBE", "LIST", "SEARCH", "VERIFY", "VALIDATE", "PREVIEW",
    "HISTORY", "CHANGES", "SNAPSHOT", "EXPORT",
})
KQL_KEYWORDS = frozenset({"FIND"})

_SKIP = re.compile(r"(?:\s+|//[^\n]*)*")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def leading_keywords(text: str, count: int = 2) -> list[str]:
    """The first ``count`` bare words of ``text``, uppercased, skipping comments."""
    words: list[str] = []
    pos = 0
    while len(words) < count:
        pos = _SKIP.match(text, pos).end()  # type: ignore[union-attr]
        match = _WORD.match(text, pos)
        if match is None:
            break
        words.append(match.group(0).upper())
        pos = match.end()
    return words


def classify(text: str) -> str | None:
    """``"KQL"``, ``"KML"``, ``"META"`` by the command's own leading keyword, else None."""
    if not isinstance(text, str):
        return None
    words = leading_keywords(text)
    if not words:
        return None
    first = words[0]
    if first in KQL_KEYWORDS:
        return "KQL"
    if first in META_KEYWORDS:
        return "META"
    if first in KML_KEYWORDS or tuple(words[:2]) in KML_PAIRS:
        return "KML"
    return None


def is_kml(text: str) -> bool:
    """Whether ``text`` is a KML (mutation) statement, well-formed or not."""
    return classify(text) == "KML"
