"""Unification: how a pattern value matches a stored value (variables, scalars, objects, arrays, tuples),
and how an element or a proposition matches an object pattern or a triple (§42.3)."""

from __future__ import annotations

import unicodedata
from typing import Any, Callable, Iterator, Mapping

from akrelay.jsontypes import JSONValue
from akrelay.kip.elements import Concept, Element, Proposition
from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.context import (
    Bound,
    Context,
    Solution,
    _canon,
    _is_ref,
    binding_key,
)
from akrelay.kip.kql.values import (
    Literal,
    Param,
)


def _same(a: Bound, b: Bound) -> bool:
    return binding_key(a) == binding_key(b)


def _scalar_matches(value: JSONValue, stored: Bound, ctx: Context) -> bool:
    """A parameter/literal constraint against a stored value (§9.6 equality)."""
    if _is_ref(stored):
        if isinstance(value, str):
            return bool(value == stored["id"])
        if _is_ref(value):
            return bool(value["id"] == stored["id"])
        return False
    if type(value) is str and type(stored) is str:
        return value == stored or unicodedata.normalize("NFC", value) == unicodedata.normalize("NFC", stored)
    return _canon(value) == _canon(stored)


def _deref(stored: Bound, ctx: Context) -> Bound:
    if _is_ref(stored):
        element = ctx.get(stored["id"])
        if element is not None:
            return element
    return stored


def unify(pv: A.Term, stored: Bound, sol: Solution, ctx: Context) -> Iterator[Solution]:
    """Match one pattern value against a stored value, extending ``sol``."""
    ctx.tick()
    how = _UNIFY.get(type(pv))
    return how(pv, stored, sol, ctx) if how is not None else iter(())


def _unify_var(pv: A.Var, stored: Bound, sol: Solution, ctx: Context) -> Iterator[Solution]:
    value = _deref(stored, ctx)
    if pv.name in sol:
        if _same(sol[pv.name], value):
            yield sol
        return
    yield {**sol, pv.name: value}


def _unify_scalar(pv: Param | Literal, stored: Bound, sol: Solution, ctx: Context) -> Iterator[Solution]:
    if _scalar_matches(ctx.value(pv), stored, ctx):
        yield sol


def _unify_object(pv: A.ObjectPattern, stored: Bound, sol: Solution, ctx: Context) -> Iterator[Solution]:
    if _is_ref(stored):
        element = ctx.get(stored["id"])
        if element is not None:
            yield from match_element(element, pv, sol, ctx)
    elif isinstance(stored, (dict, Mapping)):
        yield from _match_members(list(pv.members), stored, sol, ctx)


def _unify_array(pv: A.ArrayPattern, stored: Bound, sol: Solution, ctx: Context) -> Iterator[Solution]:
    if isinstance(stored, list):
        yield from _match_items(list(pv.items), stored, sol, ctx)


def _unify_tuple(pv: A.TripleTuple | A.IdTuple, stored: Bound, sol: Solution, ctx: Context) -> Iterator[Solution]:
    if _is_ref(stored):
        element = ctx.get(stored["id"])
        if isinstance(element, Proposition):
            yield from match_proposition(element, pv, sol, ctx)


#: How each kind of pattern value matches a stored value, by node type (others match nothing).
_UNIFY: dict[type, Callable[[Any, Bound, Solution, Context], Iterator[Solution]]] = {  # Any: each takes its key's node type
    A.Var: _unify_var,
    Param: _unify_scalar,
    Literal: _unify_scalar,
    A.ObjectPattern: _unify_object,
    A.ArrayPattern: _unify_array,
    A.TripleTuple: _unify_tuple,
    A.IdTuple: _unify_tuple,
}


def _match_members(members: list[tuple[str, A.Term]], stored: Mapping[str, Bound], sol: Solution,
                   ctx: Context) -> Iterator[Solution]:
    if not members:
        yield sol
        return
    (name, pv), rest = members[0], members[1:]
    if name not in stored:
        return  # an absent field matches nothing, not even null (§43.1)
    for extended in unify(pv, stored[name], sol, ctx):
        yield from _match_members(rest, stored, extended, ctx)


def _match_items(items: list[A.Term], stored: list[Bound], sol: Solution, ctx: Context) -> Iterator[Solution]:
    if not items:
        yield sol
        return
    for candidate in stored:
        for extended in unify(items[0], candidate, sol, ctx):
            yield from _match_items(items[1:], stored, extended, ctx)


def match_element(element: Element, pattern: A.ObjectPattern, sol: Solution,
                  ctx: Context) -> Iterator[Solution]:
    """An element against an object pattern; ``type`` is Schema-resolved (§43.1)."""
    members: list[tuple[str, A.Term]] = []
    for name, pv in pattern.members:
        if name == "type" and isinstance(element, Concept) and isinstance(pv, (Param, Literal)):
            if ctx.resolve_symbol(ctx.value(pv), "ConceptType") != element.type:
                return
            continue
        members.append((name, pv))
    yield from _match_members(members, ctx.view(element), sol, ctx)


def match_proposition(prop: Proposition, tup: A.TripleTuple | A.IdTuple, sol: Solution,
                      ctx: Context) -> Iterator[Solution]:
    """A Proposition against a single-hop tuple or an id tuple."""
    if isinstance(tup, A.IdTuple):
        if ctx.value(tup.id) == prop.id:
            yield sol
        return
    for step in tup.path:
        yield from _match_step(prop, step, tup, sol, ctx)


def _match_step(prop: Proposition, step: A.PathStep, tup: A.TripleTuple, sol: Solution,
                ctx: Context) -> Iterator[Solution]:
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
