"""Pattern clauses: how each kind of pattern (proposition, structural, belief, belief slot, search,
concept, assertion/evidence/activity) extends one solution."""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping, TypeAlias

from akrelay.kip.elements import Activity, Assertion, Concept, Element, Evidence, Proposition
from akrelay.kip.grounding import top as keyword_top
from akrelay.kip.kql import belief as B
from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.candidates import (
    KindClass,
    _concept_candidates,
    _grounded_id,
    _kind_candidates,
    _proposition_candidates,
)
from akrelay.kip.kql.context import (
    Bound,
    Context,
    Edge,
    Hit,
    Solution,
    _element_of,
)
from akrelay.kip.kql.errors import KqlError
from akrelay.kip.kql.paths import _path_solutions
from akrelay.kip.kql.unify import _same, match_element, match_proposition, unify
from akrelay.kip.kql.values import (
    Literal,
    Param,
    check_limit,
    check_threshold,
)
from akrelay.kip.nexus import SEARCH_KINDS


def _proposition_pattern(clause: A.PropositionPattern, sol: Solution, ctx: Context) -> Iterator[Solution]:
    tup = clause.tuple
    props: Iterable[Proposition]
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


def _structural_pattern(clause: A.StructuralPattern, sol: Solution, ctx: Context) -> Iterator[Solution]:
    local = ctx.resolve_symbol(ctx.value(clause.field), "StructuralField")
    ref = ctx.exact_ref(local, "StructuralField")
    s_ok, subject = _grounded_id(clause.subject, sol, ctx)
    o_ok, obj = _grounded_id(clause.object, sol, ctx)
    tags = ctx.hints.get(clause.subject.name, ()) if isinstance(clause.subject, A.Var) else ()
    if s_ok:
        sources: Iterable[Element | None] = [ctx.get(subject)]
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


def _bind_virtual(var: str, value: Bound, sol: Solution) -> Iterator[Solution]:
    if var in sol:
        if _same(sol[var], value):
            yield sol
        return
    yield {**sol, var: value}


def _belief_pattern(clause: A.BeliefPattern, sol: Solution, ctx: Context) -> Iterator[Solution]:
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
                value: Bound = ctx.value(target.object) if isinstance(target.object, (Param, Literal)) else obj
                if isinstance(target.object, A.Var):
                    value = s[target.object.name]
                    element = _element_of(value)
                    value = {"id": element.id} if element is not None else value
                missing = B.missing_belief(ctx.rt, subject.id, ref, value, ctx.seq, ctx.settings)
                yield from _bind_virtual(clause.var, missing, s)


def _subjects(term: A.Term, sol: Mapping[str, Bound], ctx: Context) -> Iterator[Element]:
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


def _belief_slot_pattern(clause: A.BeliefSlotPattern, sol: Solution, ctx: Context) -> Iterator[Solution]:
    ctx.used_projection = True
    predicate = clause.predicate
    pred_value = sol.get(predicate.name) if isinstance(predicate, A.Var) else ctx.value(predicate)
    local = ctx.resolve_symbol(pred_value, "Predicate")
    ref = ctx.exact_ref(local, "Predicate")
    for subject in _subjects(clause.subject, sol, ctx):
        for s in unify(clause.subject, {"id": subject.id}, sol, ctx):
            yield from _bind_virtual(clause.var, B.slot(ctx.rt, subject.id, local, ref, ctx.seq, ctx.settings), s)


def _search_pattern(clause: A.SearchPattern, sol: Solution, ctx: Context) -> Iterator[Solution]:
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
        assert element is not None  # the search index names elements visible at ctx.seq
        if clause.var in sol:
            bound = _element_of(sol[clause.var])
            if bound is not None and bound.id == element.id:
                yield {**sol, clause.var: Hit(element, score, mode)}
            continue
        yield {**sol, clause.var: Hit(element, score, mode)}


def _concept_pattern(clause: A.ConceptPattern, sol: Solution, ctx: Context) -> Iterator[Solution]:
    for element in _concept_candidates(clause.var, clause.pattern, sol, ctx):
        for s in match_element(element, clause.pattern, sol, ctx):
            yield from unify(A.Var(clause.var), {"id": element.id}, s, ctx)


#: An Assertion, Evidence or Activity pattern clause.
ElementClause: TypeAlias = A.AssertionPattern | A.EvidencePattern | A.ActivityPattern

_KIND_OF_PATTERN: dict[type, tuple[KindClass, str]] = {
    A.AssertionPattern: (Assertion, "assertion"),
    A.EvidencePattern: (Evidence, "evidence"),
    A.ActivityPattern: (Activity, "activity"),
}


def _kind_pattern(clause: ElementClause, sol: Solution, ctx: Context) -> Iterator[Solution]:
    cls, kind = _KIND_OF_PATTERN[type(clause)]
    for element in _kind_candidates(cls, kind, clause.var, clause.pattern, sol, ctx):
        yield from _bind_element(clause, element, sol, ctx)


def _bind_element(clause: ElementClause, element: Element, sol: Solution, ctx: Context) -> Iterator[Solution]:
    """The solutions of one candidate element of an element pattern clause."""
    for s in match_element(element, clause.pattern, sol, ctx):
        yield from unify(A.Var(clause.var), {"id": element.id}, s, ctx)
