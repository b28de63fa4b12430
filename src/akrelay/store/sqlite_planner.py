"""The query planner of the SQLite store: which index drives a page, and the SQL that reads it.

Pure functions over a reader connection: index terms live in a ``(term, seq)``
table, so every filtered page is an ordered index range scan driven by the
sparsest term near ``after_seq``; ``q`` terms of three or more characters find
candidates in the FTS5 trigram index where it has caught up, and every candidate
is verified with ``instr``, so a page is complete and exact.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import cast

from akrelay.store.base import QueryParams, Record

#: Postings counted (at most) per term when choosing the driving index; a term
#: reaching the cap is "broad", and ``q`` then drives through the trigram index.
COUNT_CAP = 1000
MAX_SEQ = (1 << 63) - 1

COLUMNS = "r.seq, r.accepted_at, r.withheld, r.body"


@dataclass(slots=True)
class QueryPlan:
    """What one query asks for, normalised: index terms, time bounds, text terms, withheld or not."""

    terms: list[str]
    created_from: int | None
    created_before: int | None
    sql_texts: list[str]
    py_texts: list[str]
    include_withheld: bool


#: A row of :data:`COLUMNS`: seq, accepted_at, withheld (0 or 1) and the canonical envelope bytes.
RecordRow = tuple[int, int, int, "bytes | bytearray | memoryview"]


def record_of(row: RecordRow) -> Record:
    seq, accepted_at, withheld, body = row
    return Record(seq, accepted_at, None, bool(withheld), body=body if type(body) is bytes else bytes(body))


#: Trigrams used per ``q`` term (spread over the term): a necessary condition is
#: enough, because every candidate is verified with ``instr``.
MAX_TRIGRAMS = 8


def fts_query(terms: list[str]) -> str:
    """An FTS5 query requiring trigrams of every term (``detail=none``: no positions).

    Every occurrence of a term contains all of its trigrams, so this selects a
    superset of the matching records; ``instr`` then makes the result exact.
    """
    grams: dict[str, None] = {}
    for term in terms:
        all_grams = [term[i : i + 3] for i in range(len(term) - 2)]
        if len(all_grams) > MAX_TRIGRAMS:
            step = (len(all_grams) - 1) / (MAX_TRIGRAMS - 1)
            all_grams = [all_grams[round(i * step)] for i in range(MAX_TRIGRAMS)]
        for gram in all_grams:
            grams[gram] = None
    return " AND ".join('"' + g.replace('"', '""') + '"' for g in grams)


def text_position(conn: sqlite3.Connection) -> int:
    """How far (``seq``) the trigram text index has caught up with the log."""
    return cast("int", conn.execute("SELECT position FROM followers WHERE name = 'text_index'").fetchone()[0])


def _term_count(conn: sqlite3.Connection, term: str, lower: int, upper: int) -> int:
    return cast("int", conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM terms WHERE term = ? AND seq > ? AND seq <= ? LIMIT ?)",
        (term, lower, upper, COUNT_CAP),
    ).fetchone()[0])


def run_query(conn: sqlite3.Connection, params: QueryParams, *, probe_window: int = 0,
              density_window: int = 20000) -> list[Record]:
    """One exact query page (see :meth:`akrelay.store.base.Queryable.query`) on ``conn``, a reader.

    ``density_window`` is how many ``seq`` values after ``after_seq`` are sampled
    to choose the driving term; ``probe_window`` (tests) scans that many first.
    """
    after_seq, upto_seq, limit = params.after_seq, params.upto_seq, params.limit
    upper = MAX_SEQ if upto_seq is None else upto_seq
    if upper <= after_seq:
        return []
    texts = params.texts
    plan = QueryPlan(
        terms=list(params.terms),
        created_from=params.created_from,
        created_before=params.created_before,
        # Terms SQLite's instr cannot judge reliably (embedded NUL) are verified in Python.
        sql_texts=[t for t in texts if "\x00" not in t],
        py_texts=[t for t in texts if "\x00" in t],
        include_withheld=params.include_withheld,
    )
    fts_texts = [t for t in plan.sql_texts if len(t) >= 3]
    conn.execute("BEGIN")  # one snapshot: text-index position and rows agree
    try:
        driver: str | None = None
        if len(plan.terms) == 1 and not fts_texts:
            driver = plan.terms[0]
        elif plan.terms:
            # A page starts at after_seq, so what matters is each term's density
            # just after it: count (capped) postings in a leading window.
            window = min(upper, after_seq + density_window)
            counts = {t: _term_count(conn, t, after_seq, window) for t in plan.terms}
            driver = min(plan.terms, key=lambda t: (counts[t], t))
            if fts_texts and counts[driver] >= COUNT_CAP:
                driver = None
        if driver is not None or not fts_texts:
            return _select(conn, plan, driver, None, after_seq, upper, limit)
        # Trigram candidates (verified with instr) where the text index has
        # caught up, then an exact scan of the not-yet-indexed tail after it.
        out: list[Record] = []
        lower = after_seq
        if probe_window:  # tests use a probe to mix all three phases
            lower = min(upper, after_seq + probe_window)
            out = _select(conn, plan, None, None, after_seq, lower, limit)
            if len(out) >= limit or lower >= upper:
                return out
        indexed = text_position(conn)
        if indexed > lower:
            out += _select(conn, plan, None, fts_texts, lower, min(indexed, upper), limit - len(out))
        start = max(lower, indexed)
        if len(out) < limit and upper > start:
            out += _select(conn, plan, None, None, start, upper, limit - len(out))
        return out
    finally:
        conn.execute("COMMIT")

def _select(
    conn: sqlite3.Connection,
    plan: QueryPlan,
    driver: str | None,
    fts_texts: list[str] | None,
    lower: int,
    upper: int,
    limit: int,
) -> list[Record]:
    where: list[str] = []
    params: list[object] = []
    if driver is not None:
        source = "terms t CROSS JOIN records r ON r.seq = t.seq"
        where += ["t.term = ?", "t.seq > ?", "t.seq <= ?"]
        params += [driver, lower, upper]
        order = "t.seq"
    elif fts_texts:
        source = "text_index CROSS JOIN records r ON r.seq = text_index.rowid"
        where += ["text_index MATCH ?", "text_index.rowid > ?", "text_index.rowid <= ?"]
        params += [fts_query(fts_texts), lower, upper]
        order = "text_index.rowid"
    else:
        source = "records r"
        where += ["r.seq > ?", "r.seq <= ?"]
        params += [lower, upper]
        order = "r.seq"
    # With a driving term, time bounds and the other terms are checked on the
    # compact term index first; the record row is read only for survivors.
    row = "t" if driver is not None else "r"
    if plan.created_from is not None:
        where.append(f"{row}.created_at >= ?")
        params.append(plan.created_from)
    if plan.created_before is not None:
        where.append(f"{row}.created_at < ?")
        params.append(plan.created_before)
    for term in plan.terms:
        if term != driver:
            where.append(f"EXISTS (SELECT 1 FROM terms x WHERE x.term = ? AND x.seq = {row}.seq)")
            params.append(term)
    if not plan.include_withheld:
        where.append("r.withheld = 0")
    for text in plan.sql_texts:
        where.append("instr(r.text, ?) > 0")
        params.append(text)

    columns = COLUMNS + (", r.text" if plan.py_texts else "")
    sql = f"SELECT {columns} FROM {source} WHERE {' AND '.join(where)} ORDER BY {order}"
    if not plan.py_texts:
        rows = conn.execute(sql + " LIMIT ?", (*params, limit)).fetchall()
        return [record_of(row) for row in rows]
    out: list[Record] = []
    for row in conn.execute(sql, params):
        if all(t in row[4] for t in plan.py_texts):
            out.append(record_of(row[:4]))
            if len(out) >= limit:
                break
    return out
