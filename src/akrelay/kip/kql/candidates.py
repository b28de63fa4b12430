"""Candidates: the elements a pattern can match, taken from the nexus's indexes (ids, kinds, tags,
proposition endpoints) instead of a scan wherever the pattern or the solution grounds them."""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping, TypeVar

from akrelay.kip.elements import Activity, Assertion, Concept, Element, Evidence, Proposition
from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.context import (
    Bound,
    Context,
    _element_of,
    _is_ref,
)
from akrelay.kip.kql.values import (
    Literal,
    Param,
)


#: An element class a lookup is filtered to.
_E = TypeVar("_E", bound=Element)
#: The element classes of the Assertion, Evidence and Activity patterns.
KindClass = type[Assertion] | type[Evidence] | type[Activity]


def _grounded_id(term: A.Term, sol: Mapping[str, Bound], ctx: Context) -> tuple[bool, Bound]:
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


def _of(elements: Iterable[Element], cls: type[_E]) -> Iterator[_E]:
    """The ``cls`` elements of a nexus lookup (already filtered to the snapshot)."""
    for element in elements:
        if isinstance(element, cls):
            yield element


def _fixed_candidate(cls: type[_E], var: str, pattern: A.ObjectPattern, sol: Mapping[str, Bound],
                     ctx: Context) -> tuple[bool, _E | None]:
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


def _concept_candidates(var: str, pattern: A.ObjectPattern, sol: Mapping[str, Bound],
                        ctx: Context) -> Iterator[Concept]:
    fixed, element = _fixed_candidate(Concept, var, pattern, sol, ctx)
    if fixed:
        if element is not None:
            yield element
        return
    members = dict(pattern.members)
    type_pv, key_pv, name_pv = members.get("type"), members.get("key"), members.get("name")
    if isinstance(type_pv, (Param, Literal)):
        local = ctx.resolve_symbol(ctx.value(type_pv), "ConceptType")
        key = ctx.value(key_pv) if isinstance(key_pv, (Param, Literal)) else None
        if isinstance(key, str):
            element = ctx.nexus.concept(local, key, ctx.seq)
            if element is not None:
                yield element
            return
        name = ctx.value(name_pv) if isinstance(name_pv, (Param, Literal)) else None
        if isinstance(name, str):
            # an index lookup; a withheld capsule shows its key as its name, so that
            # concept is a candidate too (match_element decides)
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


def _later_tags(clauses: tuple[A.Clause, ...], start: int, ctx: Context) -> dict[str, tuple[str, ...]]:
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


def _kind_candidates(cls: KindClass, kind: str, var: str, pattern: A.ObjectPattern, sol: Mapping[str, Bound],
                     ctx: Context) -> Iterator[Element]:
    fixed, element = _fixed_candidate(cls, var, pattern, sol, ctx)
    if fixed:
        if element is not None:
            yield element
        return
    members = dict(pattern.members)
    if cls is Assertion:
        ok, pid = _grounded_id(members["proposition"], sol, ctx) if "proposition" in members else (False, None)
        if ok:
            yield from (ctx.nexus.assertions_on(pid, ctx.seq) if isinstance(pid, str) else ())
            return
        ok, author = _grounded_id(members["asserted_by"], sol, ctx) if "asserted_by" in members else (False, None)
        if ok:
            yield from (_of(ctx.nexus.assertions_by(author, ctx.seq), Assertion) if isinstance(author, str) else ())
            return
    client_key = members.get("client_key")
    if cls is Evidence and isinstance(client_key, (Param, Literal)):
        key = ctx.value(client_key)
        evidence = ctx.nexus.evidence_by_key(key, ctx.seq) if isinstance(key, str) else None
        if evidence is not None:
            yield evidence
        return
    yield from _of(ctx.nexus.of_kind(kind, ctx.seq), cls)


def _proposition_candidates(tup: A.TripleTuple, sol: Mapping[str, Bound], ctx: Context) -> Iterator[Proposition]:
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
