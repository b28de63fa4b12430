"""The WHERE block (§44): the one dispatch of pattern clauses, LIMIT pushdown over ordered candidates,
and ``eval_block``, which runs FILTER, NOT, OPTIONAL and UNION over the list of solutions."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from akrelay.kip.elements import Assertion
from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.candidates import _grounded_id, _later_tags, _of
from akrelay.kip.kql.context import (
    Bound,
    Context,
    Solution,
)
from akrelay.kip.kql.errors import KqlError
from akrelay.kip.kql.expressions import eval_expr, truth
from akrelay.kip.kql.limits import LIMITS
from akrelay.kip.kql.patterns import (
    _belief_pattern,
    _belief_slot_pattern,
    _bind_element,
    _concept_pattern,
    _kind_pattern,
    _proposition_pattern,
    _search_pattern,
    _structural_pattern,
)
from akrelay.kip.kql.values import (
    Literal,
    Param,
)


def _pattern_vars(value: A.Term) -> Iterator[str] | None:
    """The variables a pattern value names, or ``None`` for a value this check does not walk."""
    if isinstance(value, A.Var):
        return iter((value.name,))
    if isinstance(value, (Param, Literal)):
        return iter(())
    children: list[A.Term] | None = ([v for _, v in value.members] if isinstance(value, A.ObjectPattern)
                else list(value.items) if isinstance(value, A.ArrayPattern) else None)
    if children is None:
        return None
    names: list[str] = []
    for child in children:
        found = _pattern_vars(child)
        if found is None:
            return None
        names.extend(found)
    return iter(names)


def _ordered_candidates(clause: A.AssertionPattern, sol: Mapping[str, Bound], ctx: Context) -> Iterator[Assertion] | None:
    """The candidates of ``clause`` in the order its solutions sort, or ``None``.

    Without ORDER BY, rows are ordered by the complete solution (§42.5 tie-break). When a
    clause binds exactly one new variable, its solutions from one incoming solution sort by
    that element's id (ids are ``<letter><seq>.<n>``: no character that ``repr`` escapes or
    that sorts before its closing quote), so candidates enumerated by id can stop after the page (see
    :func:`eval_block`). Supported: Assertions by author, the lookup that returns hundreds
    of elements per Agent (issue 13); any other clause is enumerated as usual.
    """
    if clause.var in sol:
        return None
    members = dict(clause.pattern.members)
    if "id" in members or "proposition" in members or "asserted_by" not in members:
        return None  # a fixed element, or the (short) per-Proposition lookup _kind_candidates prefers
    names = _pattern_vars(clause.pattern)
    if names is None or any(n not in sol for n in names):
        return None  # binds another variable: its values would lead the sort
    ok, author = _grounded_id(members["asserted_by"], sol, ctx)
    if not ok or not isinstance(author, str):
        return None
    return _of(ctx.nexus.assertions_by(author, ctx.seq), Assertion)


def _first_solutions(clause: A.Clause, sol: Solution, ctx: Context, top: int) -> list[Solution] | None:
    """The solutions of the first ``top`` matching candidates in solution order, or ``None``
    when ``clause`` cannot enumerate in that order. Each candidate is one distinct solution
    (only the clause's own variable is new), so they include the first ``top`` distinct
    solutions extending ``sol``."""
    if type(clause) is not A.AssertionPattern:
        return None
    candidates = _ordered_candidates(clause, sol, ctx)
    if candidates is None:
        return None
    out: list[Solution] = []
    matched = 0
    for element in candidates:
        found = list(_bind_element(clause, element, sol, ctx))
        if found:
            out.extend(found)
            matched += 1
            if matched >= top:
                break
    return out


#: How each kind of pattern clause extends one solution: the one dispatch of clauses, by node type.
_PATTERNS: dict[type, Callable[[Any, Solution, Context], Iterator[Solution]]] = {  # Any: each takes its key's clause type
    A.ConceptPattern: _concept_pattern,
    A.AssertionPattern: _kind_pattern,
    A.EvidencePattern: _kind_pattern,
    A.ActivityPattern: _kind_pattern,
    A.PropositionPattern: _proposition_pattern,
    A.StructuralPattern: _structural_pattern,
    A.BeliefPattern: _belief_pattern,
    A.BeliefSlotPattern: _belief_slot_pattern,
    A.SearchPattern: _search_pattern,
}


def _pattern(clause: A.Clause, sol: Solution, ctx: Context) -> Iterator[Solution]:
    return _PATTERNS[type(clause)](clause, sol, ctx)


def _cap(solutions: list[Solution]) -> None:
    if len(solutions) > LIMITS["max_solutions"]:
        raise KqlError("ResourceExhausted", "the query produces more intermediate solutions than this runtime allows",
                       details={"limit": "max_solutions", "value": LIMITS["max_solutions"]},
                       hint="constrain the first patterns more tightly")


def eval_block(clauses: tuple[A.Clause, ...], incoming: list[Solution], ctx: Context,
               top: int | None = None) -> list[Solution]:
    """Evaluate one WHERE block over ``incoming`` solutions (§42.4, §44.3–§44.5).

    ``top``: only the first ``top`` distinct solutions in solution-key order are needed
    (a query page without ORDER BY or aggregates); the last clause may then stop early.
    The result is a superset of those, never a different set.
    """
    current = incoming
    for position, clause in enumerate(clauses):
        if isinstance(clause, A.Filter):
            current = [s for s in current if truth(eval_expr(clause.expr, s, ctx)) is True]
        elif isinstance(clause, A.Not):
            current = [s for s in current if not eval_block(clause.clauses, [s], ctx)]
        elif isinstance(clause, A.Optional):
            out: list[Solution] = []
            for s in current:
                matches = eval_block(clause.clauses, [s], ctx)
                out.extend(matches if matches else [s])
            current = out
        elif isinstance(clause, A.Union):
            current = current + eval_block(clause.clauses, [{}], ctx)
        else:
            out = []
            ctx.hints = _later_tags(clauses, position, ctx)
            last = top is not None and position == len(clauses) - 1
            try:
                for s in current:
                    first = _first_solutions(clause, s, ctx, top) if last and top is not None else None
                    out.extend(_pattern(clause, s, ctx) if first is None else first)
                    _cap(out)
            finally:
                ctx.hints = {}
            current = out
        _cap(current)
    return current
