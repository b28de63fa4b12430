"""Candidates: the elements a pattern can match, taken from the nexus's indexes (ids, kinds, tags,
proposition endpoints) instead of a scan wherever the pattern or the solution grounds them."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from akrelay.kip.elements import Assertion, Concept, Evidence, Proposition
from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.context import (
    Context,
    _element_of,
    _is_ref,
)
from akrelay.kip.kql.values import (
    Literal,
    Param,
)


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
