"""The KQL evaluator over the nexus (KIP §42–§50).

Solution processing follows §42.4–§42.5 and §44 literally:

1. the WHERE block is evaluated left to right over a list of solutions (dicts
   from variable name to value); the top level and every UNION right branch
   start from one empty solution; ordinary patterns extend each incoming
   solution, FILTER keeps solutions whose condition is *true* (three-valued
   logic, unknown never passes), NOT keeps an incoming solution when its block
   has no compatible match, OPTIONAL extends or keeps the solution once, and
   UNION appends an independent branch (§44.5 table);
2. identical complete solutions are deduplicated on every visible binding;
3. implicit grouping and aggregates (§44.6);
4. output expressions, ORDER BY (nulls last in both directions, ties broken
   by the complete solution so pages never skip or repeat), then the page.

Patterns run in the order written — put the most selective pattern first.
Values bound to variables are elements (compared by id), search hits
(elements plus transient ``retrieval``), virtual Belief/Slot and Structural
edge values, or JSON values (compared by §9.6 canonical form). Reference
fields (``{"id": ...}``) bind the referenced element and paths step through
them. Array patterns match by containment: each item pattern matches some
stored item, binding once per matching item.

Limits (declared in ``LIMITS`` and by DESCRIBE CAPABILITIES): raw paths walk
at most ``max_path_hops`` hops and visit at most ``max_path_visits`` nodes;
an open ``{m,}`` path that would need more, or a solution set larger than
``max_solutions``, fails ``ResourceExhausted`` rather than truncating. A query
without ``LIMIT`` returns at most ``result_cap`` rows and says so.

The evaluator is split at its seams: :mod:`~akrelay.kip.kql.unify` (matching stored values),
:mod:`~akrelay.kip.kql.candidates` (what a pattern can match), :mod:`~akrelay.kip.kql.paths` (raw path
walks), :mod:`~akrelay.kip.kql.patterns` (each pattern clause) and :mod:`~akrelay.kip.kql.block` (the WHERE
block); this module is the driver: settings, pre-validation, grouping, ordering, paging, ``execute_kql``, ``run``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from collections.abc import Hashable
from typing import Callable

from akrelay.jsontypes import JSONMapping, JSONValue

from akrelay.kip.kql import belief as B
from akrelay.kip.kql import cursor as C
from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.block import eval_block
from akrelay.kip.kql.check import parameter_names
from akrelay.kip.kql.context import (
    Bound,
    Context,
    Edge,
    Hit,
    Solution,
    _order_text,
    binding_key,
    solution_key,
)
from akrelay.kip.kql.errors import KqlError
from akrelay.kip.kql.expressions import _aggregate, _compare_rows, eval_expr, expr_text, render
from akrelay.kip.kql.host import KqlRuntime
from akrelay.kip.kql.limits import LIMITS
from akrelay.kip.kql.query import parse_kql
from akrelay.kip.kql.regex import compile_regex
from akrelay.kip.kql.values import (
    Literal,
    Param,
    check_cursor,
    check_limit,
    check_seq,
    check_threshold,
)
from akrelay.kip.nexus import SEARCH_KINDS

__all__ = ["LIMITS", "Outcome", "evaluate", "execute_kql", "prevalidate", "run"]


@dataclass
class Outcome:
    """What one query evaluation produced, before result encoding."""

    columns: list[str]
    rows: list[list[Bound]]
    total: int
    seq: int
    next_offset: int | None
    truncated_by_cap: bool
    used_search: bool
    used_projection: bool
    settings: B.Settings


def _settings(query: A.Query, params: JSONMapping, ctx_value: Callable[[object], JSONValue]) -> B.Settings:
    members: dict[str, JSONValue] = {}
    if query.epistemic is not None:
        for key, value in query.epistemic.members:
            members[key] = ctx_value(value)
    text: dict[str, str | None] = {}
    for key in ("policy", "purpose", "risk"):
        member = members.get(key)
        if member is not None and not isinstance(member, str):
            raise KqlError("TypeMismatch", f"WITH EPISTEMIC {key} is a string")
        text[key] = member
    explanation = members.get("explanation")
    if explanation is not None and (not isinstance(explanation, str)
                                    or explanation not in ("none", "summary", "ledger")):
        raise KqlError("ConstraintViolation", "explanation is none, summary or ledger")
    for_time = ctx_value(query.for_time) if query.for_time is not None else None
    if for_time is not None:
        from akrelay.kip.timefmt import parse_kip_timestamp

        try:
            if not isinstance(for_time, str):
                raise ValueError(for_time)  # parse_kip_timestamp rejects a non-string the same way
            parse_kip_timestamp(for_time)
        except ValueError:
            raise KqlError("TypeMismatch", "FOR TIME takes a KIP timestamp (YYYY-MM-DDTHH:mm:ss.SSSZ)",
                           details={"value": for_time if isinstance(for_time, str) else None}) from None
    return B.Settings(policy=text["policy"], purpose=text["purpose"], risk=text["risk"],
                      explanation=explanation, for_time=for_time)


def prevalidate(clauses: tuple[A.Clause, ...], ctx: Context) -> None:
    """Resolve every Schema symbol and check every bound value the command names, before
    any solution exists: such errors are errors even in a branch no solution reaches (§42.5,
    §44.2)."""

    def symbol(value: object, kind: str) -> None:
        if isinstance(value, (Param, Literal)):
            ctx.resolve_symbol(ctx.value(value), kind)

    def term(value: A.Term) -> None:
        if isinstance(value, A.ObjectPattern):
            for name, member in value.members:
                if name == "type":
                    symbol(member, "ConceptType")
        elif isinstance(value, A.TripleTuple):
            tuple_(value)

    def tuple_(tup: A.TripleTuple | A.IdTuple | A.Var) -> None:
        if isinstance(tup, A.TripleTuple):
            for step in tup.path:
                symbol(step.predicate, "Predicate")
            term(tup.subject)
            term(tup.object)

    def expr(root: A.Projection) -> None:
        for e in A.walk_expression(root):  # the walker check.py uses too
            if not isinstance(e, A.Call):
                continue
            if e.name == "REGEX" and isinstance(e.args[1], Param):
                value = ctx.value(e.args[1])
                if not isinstance(value, str):
                    raise KqlError("TypeMismatch", "REGEX takes a string pattern")
                compile_regex(value)
            if e.name == "IN" and isinstance(e.args[1], Param) and not isinstance(ctx.value(e.args[1]), list):
                raise KqlError("TypeMismatch", "IN takes a list as its second argument")

    for clause in clauses:
        if isinstance(clause, A.ConceptPattern):
            term(clause.pattern)
        elif isinstance(clause, A.PropositionPattern):
            tuple_(clause.tuple)
        elif isinstance(clause, A.StructuralPattern):
            symbol(clause.field, "StructuralField")
            term(clause.subject)
            term(clause.object)
        elif isinstance(clause, A.BeliefPattern):
            tuple_(clause.target)
        elif isinstance(clause, A.BeliefSlotPattern):
            symbol(clause.predicate, "Predicate")
            term(clause.subject)
        elif isinstance(clause, A.SearchPattern):
            if clause.kind.lower() not in SEARCH_KINDS:
                raise KqlError("SearchIndexUnavailable", f"{clause.kind} is not indexed for search",
                               details={"kind": clause.kind.lower(), "indexed": sorted(SEARCH_KINDS)})
            symbol(clause.with_type, "ConceptType")
            symbol(clause.with_predicate, "Predicate")
            if clause.threshold is not None:
                check_threshold(ctx.value(clause.threshold))
            check_limit(ctx.value(clause.limit), "Search Pattern LIMIT")
            mode = ctx.value(clause.mode) if clause.mode is not None else "keyword"
            if mode not in ("keyword", "semantic", "hybrid"):
                raise KqlError("ConstraintViolation", f"unknown search MODE {mode!r}")
            if mode != "keyword":
                raise KqlError("SearchModeUnsupported", f"search mode {mode!r} is not supported; this runtime "
                               "serves keyword", details={"mode": mode, "supported": ["keyword"]})
        elif isinstance(clause, A.Filter):
            expr(clause.expr)
        elif isinstance(clause, (A.Not, A.Optional, A.Union)):
            prevalidate(clause.clauses, ctx)


def evaluate(rt: KqlRuntime, query: A.Query, params: JSONMapping, seq: int, offset: int,
             limit: int | None) -> Outcome:
    """Run a checked query at snapshot ``seq``; rows ``offset``..``offset+limit``."""
    ctx = Context(rt, seq, params, B.Settings())

    def value_of(v: object) -> JSONValue:
        return ctx.value(v) if isinstance(v, (Param, Literal)) else None

    ctx.settings = _settings(query, params, value_of)
    if ctx.settings.policy is not None or query.epistemic is not None:
        B.basis(rt, seq, ctx.settings)  # validates the policy even if no solution projects

    prevalidate(query.where, ctx)
    for item in list(query.find) + [o.expr for o in query.order_by]:
        prevalidate((A.Filter(item.arg if isinstance(item, A.Aggregate) else item),), ctx)
    # without ORDER BY or aggregates rows follow the solution key: the page needs only its
    # first offset + size (+1, to know whether more follow) solutions
    top = (None if query.order_by or query.has_aggregates
           else offset + (limit if limit is not None else LIMITS["result_cap"]) + 1)
    solutions = eval_block(query.where, [{}], ctx, top)
    unique: dict[Hashable, Solution] = {}
    for s in solutions:
        ctx.tick()
        unique.setdefault(solution_key(s), s)
    solutions = list(unique.values())

    descending = [o.descending for o in query.order_by]
    keyed: list[tuple[list[Bound], str, list[Bound]]] = []
    group_exprs = [e for e in query.find if not isinstance(e, A.Aggregate)]
    if query.has_aggregates:
        groups: dict[tuple[Hashable, ...], list[Solution]] = {}
        for s in solutions:
            key = tuple(binding_key(eval_expr(e, s, ctx)) for e in group_exprs)
            groups.setdefault(key, []).append(s)
        if not group_exprs and not groups:
            groups[()] = []
        for key, group in groups.items():
            cells: list[Bound] = []
            for e in query.find:
                cells.append(_aggregate(e, group, ctx) if isinstance(e, A.Aggregate)
                             else eval_expr(e, group[0], ctx))
            sort_values: list[Bound] = []
            for order in query.order_by:
                position = query.find.index(order.expr) if order.expr in query.find else None
                if position is not None:
                    sort_values.append(cells[position])
                else:
                    sort_values.append(_aggregate(order.expr, group, ctx) if isinstance(order.expr, A.Aggregate)
                                       else eval_expr(order.expr, group[0], ctx))
            keyed.append((sort_values, _order_text(key), cells))
    else:
        # without aggregates in FIND, ORDER BY has none either (``check``): both lists are plain expressions
        order_exprs = [o.expr for o in query.order_by if not isinstance(o.expr, A.Aggregate)]
        for s in solutions:
            cells = [eval_expr(e, s, ctx) for e in group_exprs]
            sort_values = [eval_expr(e, s, ctx) for e in order_exprs]
            keyed.append((sort_values, _order_text(solution_key(s)), cells))

    def compare(a: tuple[list[Bound], str, list[Bound]], b: tuple[list[Bound], str, list[Bound]]) -> int:
        ctx.tick()
        return _compare_rows(a[:2], b[:2], descending)

    keyed.sort(key=functools.cmp_to_key(compare))
    total = len(keyed)
    cap = LIMITS["result_cap"]
    page_size = limit if limit is not None else cap
    page = keyed[offset: offset + page_size]
    end = offset + len(page)
    next_offset = end if end < total else None
    rows = [[render(c, ctx) for c in cells] for _, _, cells in page]
    return Outcome(columns=[expr_text(e) for e in query.find], rows=rows, total=total, seq=seq,
                   next_offset=next_offset, truncated_by_cap=limit is None and next_offset is not None,
                   used_search=ctx.used_search, used_projection=ctx.used_projection, settings=ctx.settings)


@functools.lru_cache(maxsize=1024)
def _prepared(text: str) -> tuple[A.Query, frozenset[str], tuple[str, ...], str]:
    """A checked query with its parameter names, cursor-binding names and shape (cached by text)."""
    query = parse_kql(text)
    names = frozenset(parameter_names(query))
    cursor_param = query.cursor.name if isinstance(query.cursor, Param) else None
    bound = tuple(sorted(n for n in names if n != cursor_param))
    return query, names, bound, repr(replace(query, cursor=None, text=""))


def _binding(rt: KqlRuntime, shape: str, bound: tuple[str, ...], params: JSONMapping) -> dict[str, object]:
    """What a cursor is bound to: the query without its CURSOR, its parameters, the Space."""
    return {"query": shape, "parameters": {n: params[n] for n in bound}, "space": rt.nexus.space_id}


def execute_kql(rt: KqlRuntime, command: str, params: JSONMapping | None, seq: int, *,
                now_ms: int | None = None) -> tuple[dict[str, object], dict[str, object]]:
    """Run one KQL command for the runtime: ``(result, extra result context)``.

    ``seq`` is the request's snapshot (the head when the request started);
    ``AS OF SEQ`` reads an earlier one and a cursor continues the snapshot it
    pinned. The result is ``{"layout": "rows", "columns", "rows", ...}`` with
    ``next_cursor`` when more rows remain.
    """
    params = dict(params or {})
    if not isinstance(command, str):
        raise KqlError("InvalidSyntax", "command must be a string")
    query, names, bound_names, shape = _prepared(command)
    missing = sorted(n for n in names if n not in params)
    if missing:
        raise KqlError("ReferenceError", f"parameter :{missing[0]} is not bound",
                       details={"missing": missing}, hint="supply every referenced parameter (§74)")
    now_ms = rt.now_ms() if now_ms is None else now_ms

    def bound(v: Param | Literal) -> JSONValue:
        return params[v.name] if isinstance(v, Param) else v.value

    limit = check_limit(bound(query.limit)) if query.limit is not None else None
    read_seq = seq
    if query.as_of_seq is not None:
        read_seq = rt.nexus.check_seq(check_seq(bound(query.as_of_seq)))
    offset = 0
    binding = _binding(rt, shape, bound_names, params)
    if query.cursor is not None:
        token = check_cursor(bound(query.cursor))
        pinned, offset = C.decode(rt.cursors, token, binding, now_ms)
        if pinned > rt.nexus.head:
            raise KqlError("CursorInvalid", "the cursor names a snapshot this Space never committed",
                           details={"family": "kql", "reason": "malformed"})
        read_seq = pinned
    outcome = evaluate(rt, query, params, read_seq, offset, limit)

    result: dict[str, object] = {"layout": "rows", "columns": outcome.columns, "rows": outcome.rows,
                              "row_count": len(outcome.rows)}
    if outcome.truncated_by_cap:
        result["truncated"] = True
        result["result_cap"] = LIMITS["result_cap"]
    if outcome.used_search:
        result["approximate"] = True
    if outcome.next_offset is not None:
        result["next_cursor"] = C.encode(rt.cursors, binding, read_seq, outcome.next_offset, now_ms + C.TTL_MS)
    extra: dict[str, object] = {"snapshot_seq": read_seq}
    if query.as_of_seq is not None:
        extra["as_of_seq"] = read_seq
    if outcome.settings.for_time is not None:
        extra["valid_time"] = outcome.settings.for_time
    if outcome.used_projection or query.epistemic is not None:
        extra["projection_basis"] = B.basis(rt, read_seq, outcome.settings)
    if outcome.used_search:
        extra["search"] = {"index_seq": read_seq, "consistency": "synchronous", "mode": "keyword"}
    return result, extra


def run(rt: KqlRuntime, command: str, parameters: JSONMapping | None = None, *,
        now_ms: int | None = None) -> dict[str, object]:
    """In-process convenience: the result plus its context, at the runtime's head."""
    with rt.lock:
        result, extra = execute_kql(rt, command, parameters, rt.nexus.head, now_ms=now_ms)
    return {"result": result, "context": {"space_id": rt.nexus.space_id,
                                          "schema_environment_version": rt.environment.version, **extra}}


__all__ = ["LIMITS", "Edge", "Hit", "eval_block", "evaluate", "execute_kql", "run"]
