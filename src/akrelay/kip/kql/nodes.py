"""The KQL abstract syntax tree (KIP §42–§49).

Frozen dataclasses, hashable, compared structurally. Variable names are kept
without the ``?``; parameter names without the ``:``. Value positions hold a
:class:`~akrelay.kip.kql.values.Param` or :class:`~akrelay.kip.kql.values.Literal`.

Expressions (FIND, FILTER, ORDER BY)::

    Var(name)                        ?x
    Path(var, steps)                 ?x.a.b / ?x["k"]   (steps: tuple of str)
    Param(name) | Literal(value)     :p / "s", 1, true, null
    ArrayExpr(items), ObjectExpr(members)    [..] / {k: ..}
    Call(name, args)                 IS_NULL(?x); name upper-cased
    Unary(op, operand)               op in "!", "-"
    Binary(op, left, right)          op in == != < > <= >= && ||
    Aggregate(func, distinct, arg)   COUNT/SUM/AVG/MIN/MAX, FIND and ORDER BY only

Patterns (WHERE)::

    ObjectPattern(members)           {field: value, ...}; members: ((name, value), ...)
    ArrayPattern(items)
    TripleTuple(subject, path, object)   (s, "p"{m,n} | "q", o); path: tuple[PathStep]
    PathStep(predicate, min_hops, max_hops, quantified)   max_hops None = open
    IdTuple(id)                      (id: v)
    ConceptPattern(var, pattern)     ?c [CONCEPT] {...}
    PropositionPattern(var | None, tuple)
    AssertionPattern / EvidencePattern / ActivityPattern(var, pattern)
    StructuralPattern(var | None, subject, field, object)
    BeliefPattern(var, target)       target: Var | IdTuple | TripleTuple (single exact step)
    BeliefSlotPattern(var, subject, predicate)
    SearchPattern(var, kind, term, with_type, with_predicate, mode, threshold, limit)
    Filter(expr), Not(clauses), Optional(clauses), Union(clauses)

    Query(find, where, as_of_seq, for_time, epistemic, order_by, limit, cursor, text)
    OrderItem(expr, descending)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Union as _U

from akrelay.kip.kql.values import Literal, Param, Value


@dataclass(frozen=True, slots=True)
class Var:
    name: str


@dataclass(frozen=True, slots=True)
class Path:
    var: str
    steps: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ArrayExpr:
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class ObjectExpr:
    members: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Unary:
    op: str
    operand: Expr


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Aggregate:
    func: str
    distinct: bool
    arg: Expr


Expr = _U[Var, Path, Param, Literal, ArrayExpr, ObjectExpr, Call, Unary, Binary]
#: What FIND and ORDER BY hold: an expression, or an aggregate over one.
Projection = _U[Expr, Aggregate]


@dataclass(frozen=True, slots=True)
class ObjectPattern:
    members: tuple[tuple[str, Term], ...]


@dataclass(frozen=True, slots=True)
class ArrayPattern:
    items: tuple[Term, ...]


@dataclass(frozen=True, slots=True)
class PathStep:
    predicate: Predicate
    min_hops: int = 1
    max_hops: int | None = 1  # None: no query-specified upper bound
    quantified: bool = False

    @property
    def is_single_hop(self) -> bool:
        return self.min_hops == 1 and self.max_hops == 1


@dataclass(frozen=True, slots=True)
class TripleTuple:
    subject: Term
    path: tuple[PathStep, ...]
    object: Term

    @property
    def is_exact(self) -> bool:
        """One predicate, exactly one hop: a tuple that denotes Propositions."""
        return len(self.path) == 1 and self.path[0].is_single_hop


@dataclass(frozen=True, slots=True)
class IdTuple:
    id: Value


@dataclass(frozen=True, slots=True)
class ConceptPattern:
    var: str
    pattern: ObjectPattern


@dataclass(frozen=True, slots=True)
class PropositionPattern:
    var: str | None
    tuple: TripleTuple | IdTuple


@dataclass(frozen=True, slots=True)
class AssertionPattern:
    var: str
    pattern: ObjectPattern


@dataclass(frozen=True, slots=True)
class EvidencePattern:
    var: str
    pattern: ObjectPattern


@dataclass(frozen=True, slots=True)
class ActivityPattern:
    var: str
    pattern: ObjectPattern


@dataclass(frozen=True, slots=True)
class StructuralPattern:
    var: str | None
    subject: Term
    field: Value
    object: Term


@dataclass(frozen=True, slots=True)
class BeliefPattern:
    var: str
    target: Var | IdTuple | TripleTuple


@dataclass(frozen=True, slots=True)
class BeliefSlotPattern:
    var: str
    subject: Term
    predicate: Predicate


@dataclass(frozen=True, slots=True)
class SearchPattern:
    var: str
    kind: str
    term: Value | None
    with_type: Value | None = None
    with_predicate: Value | None = None
    mode: Value | None = None
    threshold: Value | None = None
    limit: Value | None = None


@dataclass(frozen=True, slots=True)
class Filter:
    expr: Expr


@dataclass(frozen=True, slots=True)
class Not:
    clauses: tuple[Clause, ...]


@dataclass(frozen=True, slots=True)
class Optional:
    clauses: tuple[Clause, ...]


@dataclass(frozen=True, slots=True)
class Union:
    clauses: tuple[Clause, ...]


#: A predicate position of a triple (a string literal, a parameter or a variable).
Predicate = _U[Literal, Param, Var]
#: A value position of a pattern: a variable, a value, a nested pattern or a Proposition tuple.
Term = _U[Var, Param, Literal, ObjectPattern, ArrayPattern, TripleTuple, IdTuple]
#: One clause of a WHERE block.
Clause = _U[ConceptPattern, PropositionPattern, AssertionPattern, EvidencePattern, ActivityPattern,
            StructuralPattern, BeliefPattern, BeliefSlotPattern, SearchPattern, Filter, Not, Optional, Union]


@dataclass(frozen=True, slots=True)
class OrderItem:
    expr: Projection
    descending: bool = False


@dataclass(frozen=True, slots=True)
class Query:
    find: tuple[Projection, ...]
    where: tuple[Clause, ...]
    as_of_seq: Value | None = None
    for_time: Value | None = None
    epistemic: ObjectExpr | None = None
    order_by: tuple[OrderItem, ...] = ()
    limit: Value | None = None
    cursor: Value | None = None
    text: str = ""

    @property
    def has_aggregates(self) -> bool:
        return any(isinstance(item, Aggregate) for item in self.find)


# -------------------------------------------------------------------- walking expressions

#: The direct sub-expressions of each composite expression node; leaves (variables, paths,
#: parameters, literals) have none. The one walker of expressions: the static checks
#: (``check``) and the evaluator's pre-validation (``evaluate.prevalidate``) both use it.
_CHILDREN: dict[type, Callable[[Projection], tuple[Projection, ...]]] = {
    ArrayExpr: lambda e: tuple(e.items) if isinstance(e, ArrayExpr) else (),
    ObjectExpr: lambda e: tuple(v for _, v in e.members) if isinstance(e, ObjectExpr) else (),
    Call: lambda e: tuple(e.args) if isinstance(e, Call) else (),
    Unary: lambda e: (e.operand,) if isinstance(e, Unary) else (),
    Binary: lambda e: (e.left, e.right) if isinstance(e, Binary) else (),
    Aggregate: lambda e: (e.arg,) if isinstance(e, Aggregate) else (),
}


def subexpressions(expr: Projection) -> tuple[Projection, ...]:
    children = _CHILDREN.get(type(expr))
    return children(expr) if children is not None else ()


def walk_expression(expr: Projection) -> Iterator[Projection]:
    """``expr`` and every expression inside it, parents before children, left to right."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(subexpressions(node)))

