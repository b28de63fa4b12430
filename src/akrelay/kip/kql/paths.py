"""Raw paths: a ``{m,n}`` walk over proposition predicates from a grounded start (§42.6), bounded by
``max_path_hops`` and ``max_path_visits``."""

from __future__ import annotations

from typing import Iterator, TypeAlias

from akrelay.kip.elements import Concept
from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.candidates import _grounded_id, _of
from akrelay.kip.kql.context import (
    Bound,
    Context,
    Solution,
)
from akrelay.kip.kql.errors import KqlError
from akrelay.kip.kql.limits import LIMITS
from akrelay.kip.kql.unify import unify
from akrelay.kip.kql.values import (
    Literal,
)


#: A node of a raw path walk: a Concept id, or ``("lit", value)`` for a literal object (an endpoint only).
_Node: TypeAlias = str | tuple[str, Bound]


def _walk(ctx: Context, start: str, predicates: set[str], lo: int, hi: int | None,
          forward: bool) -> list[_Node]:
    """Endpoints reachable from ``start`` in ``lo..hi`` hops over ``predicates`` (§45)."""
    max_hops = LIMITS["max_path_hops"]
    reached: dict[_Node, None] = {}
    if lo == 0:
        reached[start] = None
    frontier = [start]
    seen: set[object] = {start}  # concept ids, and ("lit", value) for literal objects
    visits = 0
    depth = 0
    limit = hi if hi is not None else max_hops
    while frontier and depth < limit:
        depth += 1
        nxt: list[str] = []
        for node in frontier:
            targets: list[_Node]
            if forward:
                props = [p for p in ctx.nexus.propositions_about(node, ctx.seq) if p.predicate in predicates] \
                    if isinstance(node, str) else []
                targets = [p.object["id"] if isinstance(p.object, dict) else ("lit", p.object) for p in props]
            else:
                props = [p for p in ctx.nexus.propositions_to(node, ctx.seq)
                         if p.predicate in predicates] if isinstance(node, str) else []
                targets = [p.subject for p in props]
            for target in targets:
                ctx.tick()
                visits += 1
                if visits > LIMITS["max_path_visits"]:
                    raise KqlError("ResourceExhausted", "the raw path visits more nodes than this runtime allows",
                                   details={"limit": "max_path_visits", "value": LIMITS["max_path_visits"]})
                if depth >= lo:
                    reached[target] = None
                if target not in seen:
                    seen.add(target)
                    if not (isinstance(target, tuple)):
                        nxt.append(target)
        frontier = nxt
    if frontier and (hi is None or hi > max_hops):
        raise KqlError("ResourceExhausted",
                       f"the raw path continues beyond {max_hops} hops; reachability was not truncated",
                       details={"limit": "max_path_hops", "value": max_hops},
                       hint="give the path an explicit upper bound")
    return list(reached)


def _path_solutions(tup: A.TripleTuple, sol: Solution, ctx: Context) -> Iterator[Solution]:
    groups: dict[tuple[int, int | None], set[str]] = {}
    for step in tup.path:
        groups.setdefault((step.min_hops, step.max_hops), set()).add(
            ctx.resolve_symbol(ctx.value(step.predicate), "Predicate"))
    s_ok, subject = _grounded_id(tup.subject, sol, ctx)
    o_ok, obj = _grounded_id(tup.object, sol, ctx)
    pairs: dict[tuple[_Node, _Node], None] = {}
    starts: list[Bound]
    for (lo, hi), predicates in groups.items():
        if s_ok:
            starts, forward = [subject], True
        elif o_ok and isinstance(obj, str) and not isinstance(tup.object, Literal):
            starts, forward = [obj], False
        else:
            if lo == 0:
                starts = [e.id for e in _of(ctx.nexus.of_kind("concept", ctx.seq), Concept)]
            else:
                starts = list(dict.fromkeys(p.subject for local in predicates
                                            for p in ctx.nexus.propositions_with(local, ctx.seq)))
            forward = True
            if len(starts) > LIMITS["max_path_visits"]:
                raise KqlError("ResourceExhausted", "the raw path has more start nodes than this runtime visits",
                               details={"limit": "max_path_visits", "value": LIMITS["max_path_visits"]},
                               hint="bind one endpoint first")
        for start in starts:
            if not isinstance(start, str) or ctx.get(start) is None:
                continue
            for end in _walk(ctx, start, predicates, lo, hi, forward):
                pairs[(start, end) if forward else (end, start)] = None
    for s_id, o_id in pairs:
        o_value = o_id[1] if isinstance(o_id, tuple) else {"id": o_id}
        for s2 in unify(tup.subject, {"id": s_id}, sol, ctx):
            yield from unify(tup.object, o_value, s2, ctx)
