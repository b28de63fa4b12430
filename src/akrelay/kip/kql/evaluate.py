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
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping

from akrelay.kip.elements import Activity, Assertion, Concept, Evidence, Proposition
from akrelay.kip.nexus import SEARCH_KINDS
from akrelay.kip.grounding import top as keyword_top
from akrelay.kip.kql import belief as B
from akrelay.kip.kql import cursor as C
from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.check import parameter_names
from akrelay.kip.kql.context import (
    Context, Edge, Hit, _canon, _element_of, _is_ref, _order_text, binding_key, solution_key,
)
from akrelay.kip.kql.expressions import _aggregate, _compare_rows, eval_expr, expr_text, render, truth
from akrelay.kip.kql.errors import KqlError
from akrelay.kip.kql.host import KqlRuntime
from akrelay.kip.kql.query import parse_kql
from akrelay.kip.kql.regex import compile_regex
from akrelay.kip.kql.values import (
    Literal, Param, check_cursor, check_limit, check_seq, check_threshold,
)

LIMITS = {
    "max_path_hops": 32,
    "max_path_visits": 200_000,
    "max_solutions": 500_000,
    "result_cap": 1000,
    "cursor_ttl_seconds": C.TTL_MS // 1000,
}


# ----------------------------------------------------------------- unification


def _same(a: Any, b: Any) -> bool:
    return binding_key(a) == binding_key(b)


def _scalar_matches(value: Any, stored: Any, ctx: Context) -> bool:
    """A parameter/literal constraint against a stored value (§9.6 equality)."""
    if _is_ref(stored):
        if isinstance(value, str):
            return value == stored["id"]
        if _is_ref(value):
            return value["id"] == stored["id"]
        return False
    if type(value) is str and type(stored) is str:
        return value == stored or unicodedata.normalize("NFC", value) == unicodedata.normalize("NFC", stored)
    return _canon(value) == _canon(stored)


def _deref(stored: Any, ctx: Context) -> Any:
    if _is_ref(stored):
        element = ctx.get(stored["id"])
        if element is not None:
            return element
    return stored


def unify(pv: Any, stored: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    """Match one pattern value against a stored value, extending ``sol``."""
    ctx.tick()
    how = _UNIFY.get(type(pv))
    return how(pv, stored, sol, ctx) if how is not None else iter(())


def _unify_var(pv: A.Var, stored: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    value = _deref(stored, ctx)
    if pv.name in sol:
        if _same(sol[pv.name], value):
            yield sol
        return
    yield {**sol, pv.name: value}


def _unify_scalar(pv: Any, stored: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    if _scalar_matches(ctx.value(pv), stored, ctx):
        yield sol


def _unify_object(pv: A.ObjectPattern, stored: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    if _is_ref(stored):
        element = ctx.get(stored["id"])
        if element is not None:
            yield from match_element(element, pv, sol, ctx)
    elif isinstance(stored, (dict, Mapping)):
        yield from _match_members(list(pv.members), stored, sol, ctx)


def _unify_array(pv: A.ArrayPattern, stored: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    if isinstance(stored, list):
        yield from _match_items(list(pv.items), stored, sol, ctx)


def _unify_tuple(pv: Any, stored: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    if _is_ref(stored):
        element = ctx.get(stored["id"])
        if isinstance(element, Proposition):
            yield from match_proposition(element, pv, sol, ctx)


#: How each kind of pattern value matches a stored value, by node type (others match nothing).
_UNIFY: dict[type, Callable[[Any, Any, dict[str, Any], Context], Iterator[dict[str, Any]]]] = {
    A.Var: _unify_var,
    Param: _unify_scalar,
    Literal: _unify_scalar,
    A.ObjectPattern: _unify_object,
    A.ArrayPattern: _unify_array,
    A.TripleTuple: _unify_tuple,
    A.IdTuple: _unify_tuple,
}


def _match_members(members: list[tuple[str, Any]], stored: Mapping[str, Any], sol: dict[str, Any],
                   ctx: Context) -> Iterator[dict[str, Any]]:
    if not members:
        yield sol
        return
    (name, pv), rest = members[0], members[1:]
    if name not in stored:
        return  # an absent field matches nothing, not even null (§43.1)
    for extended in unify(pv, stored[name], sol, ctx):
        yield from _match_members(rest, stored, extended, ctx)


def _match_items(items: list[Any], stored: list[Any], sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    if not items:
        yield sol
        return
    for candidate in stored:
        for extended in unify(items[0], candidate, sol, ctx):
            yield from _match_items(items[1:], stored, extended, ctx)


def match_element(element: Any, pattern: A.ObjectPattern, sol: dict[str, Any],
                  ctx: Context) -> Iterator[dict[str, Any]]:
    """An element against an object pattern; ``type`` is Schema-resolved (§43.1)."""
    members = []
    for name, pv in pattern.members:
        if name == "type" and isinstance(element, Concept) and isinstance(pv, (Param, Literal)):
            if ctx.resolve_symbol(ctx.value(pv), "ConceptType") != element.type:
                return
            continue
        members.append((name, pv))
    yield from _match_members(members, ctx.view(element), sol, ctx)


def match_proposition(prop: Proposition, tup: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    """A Proposition against a single-hop tuple or an id tuple."""
    if isinstance(tup, A.IdTuple):
        if ctx.value(tup.id) == prop.id:
            yield sol
        return
    for step in tup.path:
        yield from _match_step(prop, step, tup, sol, ctx)


def _match_step(prop: Proposition, step: A.PathStep, tup: A.TripleTuple, sol: dict[str, Any],
                ctx: Context) -> Iterator[dict[str, Any]]:
    predicate = step.predicate
    if isinstance(predicate, A.Var):
        ref = ctx.exact_ref(prop.predicate, "Predicate")
        if predicate.name in sol:
            bound = sol[predicate.name]
            if not isinstance(bound, str) or ctx.resolve_symbol(bound, "Predicate") != prop.predicate:
                return
            sols = [sol]
        else:
            sols = [{**sol, predicate.name: ref}]
    else:
        if ctx.resolve_symbol(ctx.value(predicate), "Predicate") != prop.predicate:
            return
        sols = [sol]
    for s in sols:
        for s2 in unify(tup.subject, {"id": prop.subject}, s, ctx):
            yield from unify(tup.object, prop.object, s2, ctx)


# ------------------------------------------------------------------ candidates


def _grounded_id(term: Any, sol: Mapping[str, Any], ctx: Context) -> tuple[bool, Any]:
    """Whether ``term`` names one element already, and its id."""
    if isinstance(term, A.Var):
        if term.name in sol:
            element = _element_of(sol[term.name])
            if element is not None:
                return True, element.id
            value = sol[term.name]
            return True, value["id"] if _is_ref(value) else value
        return False, None
    if isinstance(term, (Param, Literal)):
        value = ctx.value(term)
        return True, value["id"] if _is_ref(value) else value
    if isinstance(term, A.ObjectPattern):
        for name, pv in term.members:
            if name == "id":
                if isinstance(pv, (Param, Literal)):
                    return True, ctx.value(pv)
                if isinstance(pv, A.Var) and pv.name in sol:
                    return _grounded_id(pv, sol, ctx)
    if isinstance(term, A.IdTuple):
        return True, ctx.value(term.id)
    return False, None


def _visible(ids: Any, ctx: Context, cls: Any) -> Iterator[Any]:
    for eid in ids:
        element = ctx.get(eid)
        if isinstance(element, cls):
            yield element


def _of(elements: Any, cls: Any) -> Iterator[Any]:
    """The ``cls`` elements of a nexus lookup (already filtered to the snapshot)."""
    for element in elements:
        if isinstance(element, cls):
            yield element


def _fixed_candidate(cls: Any, var: str, pattern: A.ObjectPattern, sol: Mapping[str, Any],
                     ctx: Context) -> tuple[bool, Any]:
    """The one element ``var`` is already bound to, or the pattern's grounded id names:
    ``(True, element or None if it is not a ``cls``)``; ``(False, None)`` when the
    candidates must be enumerated."""
    if var in sol:
        element = _element_of(sol[var])
        return True, element if isinstance(element, cls) else None
    ok, eid = _grounded_id(pattern, sol, ctx)
    if ok:
        element = ctx.get(eid)
        return True, element if isinstance(element, cls) else None
    return False, None


def _concept_candidates(var: str, pattern: A.ObjectPattern, sol: Mapping[str, Any], ctx: Context) -> Iterator[Any]:
    fixed, element = _fixed_candidate(Concept, var, pattern, sol, ctx)
    if fixed:
        if element is not None:
            yield element
        return
    members = dict(pattern.members)
    type_pv, key_pv, name_pv = members.get("type"), members.get("key"), members.get("name")
    if isinstance(type_pv, (Param, Literal)):
        local = ctx.resolve_symbol(ctx.value(type_pv), "ConceptType")
        if isinstance(key_pv, (Param, Literal)) and isinstance(ctx.value(key_pv), str):
            element = ctx.nexus.concept(local, ctx.value(key_pv), ctx.seq)
            if element is not None:
                yield element
            return
        if isinstance(name_pv, (Param, Literal)) and isinstance(ctx.value(name_pv), str):
            # an index lookup; a withheld capsule shows its key as its name, so that
            # concept is a candidate too (match_element decides)
            name = ctx.value(name_pv)
            named = ctx.nexus.concepts_named(local, name, ctx.seq)
            by_key = ctx.nexus.concept(local, name, ctx.seq)
            if by_key is not None and all(c.id != by_key.id for c in named):
                named = sorted([*named, by_key], key=lambda c: (c.created_seq, _id_order(c.id)))
            yield from named
            return
    tags = (*required_tags(pattern, ctx), *ctx.hints.get(var, ()))
    if tags:  # the tag index; match_element still checks the type and everything else
        yield from ctx.nexus.concepts_tagged(tags, ctx.seq)
        return
    if isinstance(type_pv, (Param, Literal)):
        yield from _of(ctx.nexus.concepts_of_type(ctx.resolve_symbol(ctx.value(type_pv), "ConceptType"), ctx.seq),
                       Concept)
        return
    yield from _of(ctx.nexus.of_kind("concept", ctx.seq), Concept)


def required_tags(pattern: A.ObjectPattern, ctx: Context) -> list[str]:
    """The tags an object pattern requires of a Concept: the constant string items of
    ``{attributes: {tags: [...]}}`` (each must be some stored item, §43.1)."""
    out: list[str] = []
    for name, pv in pattern.members:
        if name != "attributes" or not isinstance(pv, A.ObjectPattern):
            continue
        for inner, items in pv.members:
            if inner == "tags" and isinstance(items, A.ArrayPattern):
                out.extend(v for v in (ctx.value(i) for i in items.items if isinstance(i, (Param, Literal)))
                           if isinstance(v, str))
    return out


def _later_tags(clauses: tuple[Any, ...], start: int, ctx: Context) -> dict[str, tuple[str, ...]]:
    """Tags the Concept patterns right after clause ``start`` require of their variables.

    Planning without reordering: a clause that enumerates candidates for ``?c`` may skip
    those a later ``?c {attributes: {tags: [...]}}`` would drop anyway. Only across a run
    of Concept and Structural patterns, which raise nothing for a solution and only extend
    or drop it, so the solutions, their order and the errors stay the same; only the
    work (and an intermediate ``max_solutions`` count) shrinks.
    """
    out: dict[str, tuple[str, ...]] = {}
    for clause in clauses[start + 1:]:
        if not isinstance(clause, (A.ConceptPattern, A.StructuralPattern)):
            break
        if isinstance(clause, A.ConceptPattern):
            tags = required_tags(clause.pattern, ctx)
            if tags:
                out[clause.var] = (*out.get(clause.var, ()), *tags)
    return out


def _id_order(eid: str) -> int:
    """Creation order inside one transaction: ids are ``<prefix><seq>.<n>``."""
    return int(eid.rpartition(".")[2])


def _kind_candidates(cls: Any, kind: str, var: str, pattern: A.ObjectPattern, sol: Mapping[str, Any],
                     ctx: Context) -> Iterator[Any]:
    fixed, element = _fixed_candidate(cls, var, pattern, sol, ctx)
    if fixed:
        if element is not None:
            yield element
        return
    members = dict(pattern.members)
    if cls is Assertion:
        ok, pid = _grounded_id(members["proposition"], sol, ctx) if "proposition" in members else (False, None)
        if ok:
            yield from (a for a in ctx.nexus.assertions_on(pid, ctx.seq) if isinstance(pid, str))
            return
        ok, author = _grounded_id(members["asserted_by"], sol, ctx) if "asserted_by" in members else (False, None)
        if ok:
            yield from (_of(ctx.nexus.assertions_by(author, ctx.seq), Assertion) if isinstance(author, str) else ())
            return
    if cls is Evidence and isinstance(members.get("client_key"), (Param, Literal)):
        key = ctx.value(members["client_key"])
        evidence = ctx.nexus.evidence_by_key(key, ctx.seq) if isinstance(key, str) else None
        if evidence is not None:
            yield evidence
        return
    yield from _of(ctx.nexus.of_kind(kind, ctx.seq), cls)


def _proposition_candidates(tup: A.TripleTuple, sol: Mapping[str, Any], ctx: Context) -> Iterator[Proposition]:
    ok, subject = _grounded_id(tup.subject, sol, ctx)
    if ok:
        if isinstance(subject, str):
            yield from ctx.nexus.propositions_about(subject, ctx.seq)
        return
    ok, obj = _grounded_id(tup.object, sol, ctx)
    if ok and isinstance(obj, str) and not isinstance(tup.object, Literal):
        yield from ctx.nexus.propositions_to(obj, ctx.seq)
        return
    locals_: list[str] = []
    for step in tup.path:
        if isinstance(step.predicate, A.Var):
            if step.predicate.name not in sol:
                yield from _of(ctx.nexus.of_kind("proposition", ctx.seq), Proposition)
                return
            locals_.append(ctx.resolve_symbol(sol[step.predicate.name], "Predicate"))
        else:
            locals_.append(ctx.resolve_symbol(ctx.value(step.predicate), "Predicate"))
    for local in dict.fromkeys(locals_):
        yield from ctx.nexus.propositions_with(local, ctx.seq)


# ----------------------------------------------------------------- raw paths


def _walk(ctx: Context, start: str, predicates: set[str], lo: int, hi: int | None,
          forward: bool) -> list[Any]:
    """Endpoints reachable from ``start`` in ``lo..hi`` hops over ``predicates`` (§45)."""
    max_hops = LIMITS["max_path_hops"]
    reached: dict[Any, None] = {}
    if lo == 0:
        reached[start] = None
    frontier = [start]
    seen = {start}
    visits = 0
    depth = 0
    limit = hi if hi is not None else max_hops
    while frontier and depth < limit:
        depth += 1
        nxt: list[Any] = []
        for node in frontier:
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


def _path_solutions(tup: A.TripleTuple, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    groups: dict[tuple[int, int | None], set[str]] = {}
    for step in tup.path:
        groups.setdefault((step.min_hops, step.max_hops), set()).add(
            ctx.resolve_symbol(ctx.value(step.predicate), "Predicate"))
    s_ok, subject = _grounded_id(tup.subject, sol, ctx)
    o_ok, obj = _grounded_id(tup.object, sol, ctx)
    pairs: dict[tuple[Any, Any], None] = {}
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


# ------------------------------------------------------------------ patterns


def _proposition_pattern(clause: A.PropositionPattern, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    tup = clause.tuple
    if isinstance(tup, A.IdTuple):
        element = ctx.get(ctx.value(tup.id))
        props = [element] if isinstance(element, Proposition) else []
    elif not all(step.is_single_hop for step in tup.path):
        yield from _path_solutions(tup, sol, ctx)
        return
    elif clause.var is not None and clause.var in sol:
        element = _element_of(sol[clause.var])
        props = [element] if isinstance(element, Proposition) else []
    else:
        props = _proposition_candidates(tup, sol, ctx)
    for prop in props:
        for s in match_proposition(prop, tup, sol, ctx):
            if clause.var is None:
                yield s
            else:
                yield from unify(A.Var(clause.var), {"id": prop.id}, s, ctx)


def _structural_pattern(clause: A.StructuralPattern, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    local = ctx.resolve_symbol(ctx.value(clause.field), "StructuralField")
    ref = ctx.exact_ref(local, "StructuralField")
    s_ok, subject = _grounded_id(clause.subject, sol, ctx)
    o_ok, obj = _grounded_id(clause.object, sol, ctx)
    tags = ctx.hints.get(clause.subject.name, ()) if isinstance(clause.subject, A.Var) else ()
    if s_ok:
        sources: Any = [ctx.get(subject)]
    elif tags:  # the edge and the tags a later pattern requires, in one index intersection
        sources = ctx.nexus.concepts_tagged(tags, ctx.seq, structural=(local, obj) if o_ok and isinstance(obj, str)
                                            else None)
    elif o_ok and isinstance(obj, str):
        sources = ctx.nexus.structural_sources(local, obj, ctx.seq)
    else:
        sources = ctx.nexus.structural_sources(local, None, ctx.seq)
    for element in sources:
        if not isinstance(element, Concept) or local not in element.structural:
            continue
        target = element.structural[local]
        if ctx.get(target) is None:
            continue
        for s in unify(clause.subject, {"id": element.id}, sol, ctx):
            for s2 in unify(clause.object, {"id": target}, s, ctx):
                if clause.var is None:
                    yield s2
                    continue
                edge = Edge(element.id, ref, target)
                if clause.var in s2:
                    if _same(s2[clause.var], edge):
                        yield s2
                else:
                    yield {**s2, clause.var: edge}


def _bind_virtual(var: str, value: Any, sol: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if var in sol:
        if _same(sol[var], value):
            yield sol
        return
    yield {**sol, var: value}


def _belief_pattern(clause: A.BeliefPattern, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    ctx.used_projection = True
    target = clause.target
    if isinstance(target, A.Var):
        bound = sol.get(target.name)
        prop = _element_of(bound)
        if not isinstance(prop, Proposition):
            raise KqlError("ProjectionTargetUnbound",
                           f"BELIEF (?{target.name}) needs ?{target.name} bound to a Proposition in every solution",
                           details={"variable": target.name})
        yield from _bind_virtual(clause.var, B.belief(ctx.rt, prop.id, ctx.seq, ctx.settings), sol)
        return
    if isinstance(target, A.IdTuple):
        prop = ctx.get(ctx.value(target.id))
        if isinstance(prop, Proposition):
            yield from _bind_virtual(clause.var, B.belief(ctx.rt, prop.id, ctx.seq, ctx.settings), sol)
        return
    predicate = target.path[0].predicate
    pred_value = sol.get(predicate.name) if isinstance(predicate, A.Var) else ctx.value(predicate)
    local = ctx.resolve_symbol(pred_value, "Predicate")
    ref = ctx.exact_ref(local, "Predicate")
    for subject in _subjects(target.subject, sol, ctx):
        for s in unify(target.subject, {"id": subject.id}, sol, ctx):
            o_ok, obj = _grounded_id(target.object, s, ctx)
            props = [p for p in ctx.nexus.propositions_about(subject.id, ctx.seq) if p.predicate == local]
            matched = False
            for prop in props:
                for s2 in unify(target.object, prop.object, s, ctx):
                    matched = True
                    yield from _bind_virtual(clause.var, B.belief(ctx.rt, prop.id, ctx.seq, ctx.settings), s2)
            if not matched and o_ok and not isinstance(target.object, (A.ObjectPattern, A.TripleTuple)):
                value = ctx.value(target.object) if isinstance(target.object, (Param, Literal)) else obj
                if isinstance(target.object, A.Var):
                    value = s[target.object.name]
                    element = _element_of(value)
                    value = {"id": element.id} if element is not None else value
                missing = B.missing_belief(ctx.rt, subject.id, ref, value, ctx.seq, ctx.settings)
                yield from _bind_virtual(clause.var, missing, s)


def _subjects(term: Any, sol: Mapping[str, Any], ctx: Context) -> Iterator[Any]:
    ok, eid = _grounded_id(term, sol, ctx)
    if ok:
        element = ctx.get(eid)
        if element is not None:
            yield element
        return
    if isinstance(term, A.ObjectPattern):
        yield from _concept_candidates("\0subject", term, {}, ctx)
        return
    raise KqlError("ProjectionTargetUnbounded", "BELIEF needs a grounded subject (§46.3)")  # pragma: no cover


def _belief_slot_pattern(clause: A.BeliefSlotPattern, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    ctx.used_projection = True
    predicate = clause.predicate
    pred_value = sol.get(predicate.name) if isinstance(predicate, A.Var) else ctx.value(predicate)
    local = ctx.resolve_symbol(pred_value, "Predicate")
    ref = ctx.exact_ref(local, "Predicate")
    for subject in _subjects(clause.subject, sol, ctx):
        for s in unify(clause.subject, {"id": subject.id}, sol, ctx):
            yield from _bind_virtual(clause.var, B.slot(ctx.rt, subject.id, local, ref, ctx.seq, ctx.settings), s)


def _search_pattern(clause: A.SearchPattern, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    ctx.used_search = True
    mode = ctx.value(clause.mode) if clause.mode is not None else "keyword"
    if mode not in ("keyword", "semantic", "hybrid"):
        raise KqlError("ConstraintViolation", f"unknown search MODE {mode!r}")
    if mode != "keyword":
        raise KqlError("SearchModeUnsupported", f"search mode {mode!r} is not supported; this runtime serves keyword",
                       details={"mode": mode, "supported": ["keyword"]})
    kind = clause.kind.lower()
    if kind not in SEARCH_KINDS:
        raise KqlError("SearchIndexUnavailable", f"{clause.kind} is not indexed for search",
                       details={"kind": kind, "indexed": sorted(SEARCH_KINDS)})
    term = ctx.value(clause.term)
    if not isinstance(term, str):
        raise KqlError("TypeMismatch", "the search term is a string")
    type_filter = (ctx.resolve_symbol(ctx.value(clause.with_type), "ConceptType")
                   if clause.with_type is not None else None)
    if type_filter is not None and kind != "concept":
        raise KqlError("ConstraintViolation", "WITH TYPE applies to SEARCH CONCEPT only")
    predicate_filter = (ctx.resolve_symbol(ctx.value(clause.with_predicate), "Predicate")
                        if clause.with_predicate is not None else None)
    if predicate_filter is not None and kind not in ("proposition", "assertion"):
        raise KqlError("ConstraintViolation", "WITH PREDICATE applies to PROPOSITION and ASSERTION searches")
    threshold = check_threshold(ctx.value(clause.threshold)) if clause.threshold is not None else None
    limit = check_limit(ctx.value(clause.limit), "Search Pattern LIMIT")
    hits, _ = keyword_top(ctx.nexus, kind, term, ctx.seq, type_filter=type_filter,
                          predicate_filter=predicate_filter, threshold=threshold, count=limit)
    for score, eid in hits:
        element = ctx.get(eid)
        if clause.var in sol:
            bound = _element_of(sol[clause.var])
            if bound is not None and bound.id == element.id:
                yield {**sol, clause.var: Hit(element, score, mode)}
            continue
        yield {**sol, clause.var: Hit(element, score, mode)}


def _concept_pattern(clause: A.ConceptPattern, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    for element in _concept_candidates(clause.var, clause.pattern, sol, ctx):
        for s in match_element(element, clause.pattern, sol, ctx):
            yield from unify(A.Var(clause.var), {"id": element.id}, s, ctx)


_KIND_OF_PATTERN = {A.AssertionPattern: (Assertion, "assertion"), A.EvidencePattern: (Evidence, "evidence"),
                    A.ActivityPattern: (Activity, "activity")}


def _kind_pattern(clause: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    cls, kind = _KIND_OF_PATTERN[type(clause)]
    for element in _kind_candidates(cls, kind, clause.var, clause.pattern, sol, ctx):
        yield from _bind_element(clause, element, sol, ctx)


def _bind_element(clause: Any, element: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    """The solutions of one candidate element of an element pattern clause."""
    for s in match_element(element, clause.pattern, sol, ctx):
        yield from unify(A.Var(clause.var), {"id": element.id}, s, ctx)


# ------------------------------------------------------------------ LIMIT pushdown


def _pattern_vars(value: Any) -> Iterator[str] | None:
    """The variables a pattern value names, or ``None`` for a value this check does not walk."""
    if isinstance(value, A.Var):
        return iter((value.name,))
    if isinstance(value, (Param, Literal)):
        return iter(())
    children = ([v for _, v in value.members] if isinstance(value, A.ObjectPattern)
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


def _ordered_candidates(clause: Any, sol: Mapping[str, Any], ctx: Context) -> Iterator[Any] | None:
    """The candidates of ``clause`` in the order its solutions sort, or ``None``.

    Without ORDER BY, rows are ordered by the complete solution (§42.5 tie-break). When a
    clause binds exactly one new variable, its solutions from one incoming solution sort by
    that element's id (ids are ``<letter><seq>.<n>``: no character that ``repr`` escapes or
    that sorts before its closing quote), so candidates enumerated by id can stop after the page (see
    :func:`eval_block`). Supported: Assertions by author, the lookup that returns hundreds
    of elements per Agent (issue 13); any other clause is enumerated as usual.
    """
    if type(clause) is not A.AssertionPattern or clause.var in sol:
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


def _first_solutions(clause: Any, sol: dict[str, Any], ctx: Context, top: int) -> list[dict[str, Any]] | None:
    """The solutions of the first ``top`` matching candidates in solution order, or ``None``
    when ``clause`` cannot enumerate in that order. Each candidate is one distinct solution
    (only the clause's own variable is new), so they include the first ``top`` distinct
    solutions extending ``sol``."""
    candidates = _ordered_candidates(clause, sol, ctx)
    if candidates is None:
        return None
    out: list[dict[str, Any]] = []
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
_PATTERNS: dict[type, Callable[[Any, dict[str, Any], Context], Iterator[dict[str, Any]]]] = {
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


def _pattern(clause: Any, sol: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
    return _PATTERNS[type(clause)](clause, sol, ctx)


def _cap(solutions: list[dict[str, Any]]) -> None:
    if len(solutions) > LIMITS["max_solutions"]:
        raise KqlError("ResourceExhausted", "the query produces more intermediate solutions than this runtime allows",
                       details={"limit": "max_solutions", "value": LIMITS["max_solutions"]},
                       hint="constrain the first patterns more tightly")


def eval_block(clauses: tuple[Any, ...], incoming: list[dict[str, Any]], ctx: Context,
               top: int | None = None) -> list[dict[str, Any]]:
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
            out: list[dict[str, Any]] = []
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


# -------------------------------------------------------------------------- driver


@dataclass
class Outcome:
    """What one query evaluation produced, before result encoding."""

    columns: list[str]
    rows: list[list[Any]]
    total: int
    seq: int
    next_offset: int | None
    truncated_by_cap: bool
    used_search: bool
    used_projection: bool
    settings: B.Settings


def _settings(query: A.Query, params: Mapping[str, Any], ctx_value: Any) -> B.Settings:
    members: dict[str, Any] = {}
    if query.epistemic is not None:
        for key, value in query.epistemic.members:
            members[key] = ctx_value(value)
    for key in ("policy", "purpose", "risk"):
        if members.get(key) is not None and not isinstance(members[key], str):
            raise KqlError("TypeMismatch", f"WITH EPISTEMIC {key} is a string")
    if members.get("explanation") not in (None, "none", "summary", "ledger"):
        raise KqlError("ConstraintViolation", "explanation is none, summary or ledger")
    for_time = ctx_value(query.for_time) if query.for_time is not None else None
    if for_time is not None:
        from akrelay.kip.timefmt import parse_kip_timestamp

        try:
            parse_kip_timestamp(for_time)
        except ValueError:
            raise KqlError("TypeMismatch", "FOR TIME takes a KIP timestamp (YYYY-MM-DDTHH:mm:ss.SSSZ)",
                           details={"value": for_time if isinstance(for_time, str) else None}) from None
    return B.Settings(policy=members.get("policy"), purpose=members.get("purpose"), risk=members.get("risk"),
                      explanation=members.get("explanation"), for_time=for_time)


def prevalidate(clauses: tuple[Any, ...], ctx: Context) -> None:
    """Resolve every Schema symbol and check every bound value the command names, before
    any solution exists: such errors are errors even in a branch no solution reaches (§42.5,
    §44.2)."""

    def symbol(value: Any, kind: str) -> None:
        if isinstance(value, (Param, Literal)):
            ctx.resolve_symbol(ctx.value(value), kind)

    def term(value: Any) -> None:
        if isinstance(value, A.ObjectPattern):
            for name, member in value.members:
                if name == "type":
                    symbol(member, "ConceptType")
        elif isinstance(value, A.TripleTuple):
            tuple_(value)

    def tuple_(tup: Any) -> None:
        if isinstance(tup, A.TripleTuple):
            for step in tup.path:
                symbol(step.predicate, "Predicate")
            term(tup.subject)
            term(tup.object)

    def expr(root: Any) -> None:
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


def evaluate(rt: KqlRuntime, query: A.Query, params: Mapping[str, Any], seq: int, offset: int,
             limit: int | None) -> Outcome:
    """Run a checked query at snapshot ``seq``; rows ``offset``..``offset+limit``."""
    ctx = Context(rt, seq, params, B.Settings())

    def value_of(v: Any) -> Any:
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
    unique: dict[Any, dict[str, Any]] = {}
    for s in solutions:
        ctx.tick()
        unique.setdefault(solution_key(s), s)
    solutions = list(unique.values())

    descending = [o.descending for o in query.order_by]
    keyed: list[tuple[list[Any], str, list[Any]]] = []
    if query.has_aggregates:
        group_exprs = [e for e in query.find if not isinstance(e, A.Aggregate)]
        groups: dict[Any, list[dict[str, Any]]] = {}
        for s in solutions:
            key = tuple(binding_key(eval_expr(e, s, ctx)) for e in group_exprs)
            groups.setdefault(key, []).append(s)
        if not group_exprs and not groups:
            groups[()] = []
        for key, group in groups.items():
            cells = []
            for e in query.find:
                cells.append(_aggregate(e, group, ctx) if isinstance(e, A.Aggregate)
                             else eval_expr(e, group[0], ctx))
            sort_values = []
            for order in query.order_by:
                position = query.find.index(order.expr) if order.expr in query.find else None
                if position is not None:
                    sort_values.append(cells[position])
                else:
                    sort_values.append(_aggregate(order.expr, group, ctx) if isinstance(order.expr, A.Aggregate)
                                       else eval_expr(order.expr, group[0], ctx))
            keyed.append((sort_values, _order_text(key), cells))
    else:
        for s in solutions:
            cells = [eval_expr(e, s, ctx) for e in query.find]
            sort_values = [eval_expr(o.expr, s, ctx) for o in query.order_by]
            keyed.append((sort_values, _order_text(solution_key(s)), cells))

    def compare(a: tuple[list[Any], str, list[Any]], b: tuple[list[Any], str, list[Any]]) -> int:
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


def _binding(rt: KqlRuntime, shape: str, bound: tuple[str, ...], params: Mapping[str, Any]) -> dict[str, Any]:
    """What a cursor is bound to: the query without its CURSOR, its parameters, the Space."""
    return {"query": shape, "parameters": {n: params[n] for n in bound}, "space": rt.nexus.space_id}


def execute_kql(rt: KqlRuntime, command: str, params: Mapping[str, Any] | None, seq: int, *,
                now_ms: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
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

    def bound(v: Any) -> Any:
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

    result: dict[str, Any] = {"layout": "rows", "columns": outcome.columns, "rows": outcome.rows,
                              "row_count": len(outcome.rows)}
    if outcome.truncated_by_cap:
        result["truncated"] = True
        result["result_cap"] = LIMITS["result_cap"]
    if outcome.used_search:
        result["approximate"] = True
    if outcome.next_offset is not None:
        result["next_cursor"] = C.encode(rt.cursors, binding, read_seq, outcome.next_offset, now_ms + C.TTL_MS)
    extra: dict[str, Any] = {"snapshot_seq": read_seq}
    if query.as_of_seq is not None:
        extra["as_of_seq"] = read_seq
    if outcome.settings.for_time is not None:
        extra["valid_time"] = outcome.settings.for_time
    if outcome.used_projection or query.epistemic is not None:
        extra["projection_basis"] = B.basis(rt, read_seq, outcome.settings)
    if outcome.used_search:
        extra["search"] = {"index_seq": read_seq, "consistency": "synchronous", "mode": "keyword"}
    return result, extra


def run(rt: KqlRuntime, command: str, parameters: Mapping[str, Any] | None = None, *,
        now_ms: int | None = None) -> dict[str, Any]:
    """In-process convenience: the result plus its context, at the runtime's head."""
    with rt.lock:
        result, extra = execute_kql(rt, command, parameters, rt.nexus.head, now_ms=now_ms)
    return {"result": result, "context": {"space_id": rt.nexus.space_id,
                                          "schema_environment_version": rt.environment.version, **extra}}


__all__ = ["LIMITS", "Edge", "Hit", "eval_block", "evaluate", "execute_kql", "run"]
