"""``parse_kql``: KQL text to a checked :class:`~akrelay.kip.kql.nodes.Query`.

Parsing (``grammar/kql.lark``) gives ``InvalidSyntax`` with a line, a column and
a hint; the semantic checks the grammar cannot express run next
(:mod:`akrelay.kip.kql.check`), so a query that parses here is one the
evaluator can run without discovering a static error half-way.
"""

from __future__ import annotations

import functools
from typing import Callable, TypedDict

from lark import Token, Tree

from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.grammar import (
    LITERAL_KINDS, ParseTree, leaf, literal_value, optional_subtree, parse_tree, required_scalar, scalar, subtree,
)
from akrelay.kip.kql.values import Literal, Param, Value


def _name(node: object) -> str:
    return str(leaf(node))[1:]


def _string(token: Token) -> str:
    """A STRING token's text (decoded: the grammar admits only JSON strings there)."""
    value = literal_value(Tree("string", [token]))
    assert isinstance(value, str)
    return value


def _field_name(node: object) -> str:
    token = leaf(subtree(node).children[0])
    if token.type == "STRING":
        return _string(token)
    return str(token)


class QueryParts(TypedDict, total=False):
    """The :class:`~akrelay.kip.kql.nodes.Query` fields the ``query`` rule gives."""

    find: tuple[A.Projection, ...]
    where: tuple[A.Clause, ...]
    as_of_seq: Value | None
    for_time: Value | None
    epistemic: A.ObjectExpr
    order_by: tuple[A.OrderItem, ...]
    limit: Value | None
    cursor: Value | None


class _Builder:
    """Tree -> AST; one method per grammar rule/alias."""

    def build(self, node: object) -> object:
        """The AST node of one subtree (``None`` for an absent optional part)."""
        if node is None:
            return None
        if isinstance(node, Token):
            raise AssertionError(f"unexpected token {node!r}")  # pragma: no cover
        tree = subtree(node)
        method: Callable[[ParseTree], object] | None = getattr(self, "b_" + tree.data, None)
        if method is None:
            raise AssertionError(f"no builder for {tree.data}")  # pragma: no cover
        return method(tree)

    # Typed views of :meth:`build`: what the grammar puts at each position (checked, never cast).
    def expr(self, node: object) -> A.Expr:
        built = self.build(node)
        assert isinstance(built, _EXPR), built
        return built

    def projection(self, node: object) -> A.Projection:
        built = self.build(node)
        assert isinstance(built, _EXPR + (A.Aggregate,)), built
        return built

    def term(self, node: object) -> A.Term:
        built = self.build(node)
        assert isinstance(built, _TERM), built
        return built

    def clause(self, node: object) -> A.Clause:
        built = self.build(node)
        assert isinstance(built, _CLAUSE), built
        return built

    def block(self, node: object) -> tuple[A.Clause, ...]:
        built = self.build(node)
        assert isinstance(built, tuple), built
        clauses: list[A.Clause] = []
        for clause in built:
            assert isinstance(clause, _CLAUSE), clause
            clauses.append(clause)
        return tuple(clauses)

    def object_literal(self, node: object) -> A.ObjectExpr:
        built = self.build(node)
        assert isinstance(built, A.ObjectExpr), built
        return built

    def object_pattern(self, node: object) -> A.ObjectPattern:
        built = self.build(node)
        assert isinstance(built, A.ObjectPattern), built
        return built

    def proposition_tuple(self, node: object) -> A.TripleTuple | A.IdTuple:
        built = self.build(node)
        assert isinstance(built, (A.TripleTuple, A.IdTuple)), built
        return built

    # -- values and expressions ---------------------------------------------------------
    def _literal(self, tree: ParseTree) -> Literal:
        return Literal(literal_value(tree))

    b_string = b_number = b_true = b_false = b_null = _literal

    def b_param(self, tree: ParseTree) -> Param:
        return Param(_name(tree.children[0]))

    def b_var(self, tree: ParseTree) -> A.Var:
        return A.Var(_name(tree.children[0]))

    def b_field_access(self, tree: ParseTree) -> A.Path:
        var = _name(tree.children[0])
        steps = []
        for node in tree.children[1:]:
            step = subtree(node)
            token = leaf(step.children[0])
            if step.data == "dot_step":
                steps.append(str(token))
            else:
                steps.append(_string(token))
        return A.Path(var, tuple(steps))

    def b_array_literal(self, tree: ParseTree) -> A.ArrayExpr:
        return A.ArrayExpr(tuple(self.expr(c) for c in tree.children if c is not None))

    def b_object_literal(self, tree: ParseTree) -> A.ObjectExpr:
        members = []
        for node in tree.children:
            if node is None:
                continue
            member = subtree(node)
            members.append((_field_name(member.children[0]), self.expr(member.children[1])))
        return A.ObjectExpr(tuple(members))

    def b_function_call(self, tree: ParseTree) -> A.Call:
        name = str(tree.children[0]).upper()
        args = tuple(self.expr(c) for c in tree.children[1:] if c is not None)
        return A.Call(name, args)

    def b_not_op(self, tree: ParseTree) -> A.Unary:
        return A.Unary("!", self.expr(tree.children[0]))

    def b_neg_op(self, tree: ParseTree) -> A.Unary:
        return A.Unary("-", self.expr(tree.children[0]))

    def b_compare(self, tree: ParseTree) -> A.Binary:
        left, op, right = tree.children
        return A.Binary(str(op), self.expr(left), self.expr(right))

    def b_and_op(self, tree: ParseTree) -> A.Binary:
        return A.Binary("&&", self.expr(tree.children[0]), self.expr(tree.children[1]))

    def b_or_op(self, tree: ParseTree) -> A.Binary:
        return A.Binary("||", self.expr(tree.children[0]), self.expr(tree.children[1]))

    def b_aggregate_expression(self, tree: ParseTree) -> A.Aggregate:
        name_tree, distinct, arg = tree.children
        return A.Aggregate(str(subtree(name_tree).children[0]).upper(), distinct is not None, self.expr(arg))

    # -- patterns -------------------------------------------------------------------------
    def b_object_pattern(self, tree: ParseTree) -> A.ObjectPattern:
        members = []
        for node in tree.children:
            if node is None:
                continue
            member = subtree(node)
            members.append((_field_name(member.children[0]), self.term(member.children[1])))
        return A.ObjectPattern(tuple(members))

    def b_array_pattern(self, tree: ParseTree) -> A.ArrayPattern:
        return A.ArrayPattern(tuple(self.term(c) for c in tree.children if c is not None))

    def _predicate_atom(self, node: object) -> A.Predicate:
        token = leaf(subtree(node).children[0])
        if token.type == "STRING":
            return Literal(_string(token))
        if token.type == "PARAMETER":
            return Param(_name(token))
        return A.Var(_name(token))

    def b_triple_tuple(self, tree: ParseTree) -> A.TripleTuple:
        subject, path, obj = tree.children
        steps = []
        for node in subtree(path).children:
            atom = subtree(node)
            predicate = self._predicate_atom(atom.children[0])
            quant = optional_subtree(atom.children[1]) if len(atom.children) > 1 else None
            if quant is None:
                steps.append(A.PathStep(predicate))
                continue
            nums = [int(str(t)) for t in quant.children]
            lo: int
            hi: int | None
            if quant.data == "hops_exact":
                lo, hi = nums[0], nums[0]
            elif quant.data == "hops_open":
                lo, hi = nums[0], None
            else:
                lo, hi = nums
            steps.append(A.PathStep(predicate, lo, hi, True))
        return A.TripleTuple(self.term(subject), tuple(steps), self.term(obj))

    def b_id_tuple(self, tree: ParseTree) -> A.IdTuple:
        return A.IdTuple(required_scalar(tree.children[0]))

    def b_concept_pattern(self, tree: ParseTree) -> A.ConceptPattern:
        return A.ConceptPattern(_name(tree.children[0]), self.object_pattern(tree.children[-1]))

    def b_proposition_pattern(self, tree: ParseTree) -> A.PropositionPattern:
        var = tree.children[0]
        return A.PropositionPattern(_name(var) if var is not None else None,
                                    self.proposition_tuple(tree.children[-1]))

    def b_assertion_pattern(self, tree: ParseTree) -> A.AssertionPattern:
        return A.AssertionPattern(_name(tree.children[0]), self.object_pattern(tree.children[1]))

    def b_evidence_pattern(self, tree: ParseTree) -> A.EvidencePattern:
        return A.EvidencePattern(_name(tree.children[0]), self.object_pattern(tree.children[1]))

    def b_activity_pattern(self, tree: ParseTree) -> A.ActivityPattern:
        return A.ActivityPattern(_name(tree.children[0]), self.object_pattern(tree.children[1]))

    def b_structural_pattern(self, tree: ParseTree) -> A.StructuralPattern:
        var, subject, field, obj = tree.children
        token = leaf(subtree(field).children[0])
        field_value: Value = (Param(_name(token)) if token.type == "PARAMETER"
                              else Literal(_string(token)))
        return A.StructuralPattern(_name(var) if var is not None else None, self.term(subject),
                                   field_value, self.term(obj))

    def b_belief_var(self, tree: ParseTree) -> A.BeliefPattern:
        return A.BeliefPattern(_name(tree.children[0]), A.Var(_name(tree.children[1])))

    def b_belief_id(self, tree: ParseTree) -> A.BeliefPattern:
        return A.BeliefPattern(_name(tree.children[0]), A.IdTuple(required_scalar(tree.children[1])))

    def b_belief_triple(self, tree: ParseTree) -> A.BeliefPattern:
        var, subject, predicate, obj = tree.children
        triple = A.TripleTuple(self.term(subject), (A.PathStep(self._predicate_atom(predicate)),), self.term(obj))
        return A.BeliefPattern(_name(var), triple)

    def b_belief_slot_pattern(self, tree: ParseTree) -> A.BeliefSlotPattern:
        var, subject, predicate = tree.children
        return A.BeliefSlotPattern(_name(var), self.term(subject), self._predicate_atom(predicate))

    def b_search_pattern(self, tree: ParseTree) -> A.SearchPattern:
        children = tree.children
        var = _name(children[0])
        kind = str(subtree(children[1]).children[0]).upper()
        term = scalar(children[2])
        mods: dict[str, Value | None] = {}
        for node in children[3:-1]:
            child = optional_subtree(node)
            if child is None:
                continue
            key = {"search_with_type": "with_type", "search_with_predicate": "with_predicate",
                   "search_mode": "mode", "search_threshold": "threshold"}[child.data]
            mods[key] = scalar(child.children[0])
        return A.SearchPattern(var, kind, term, limit=scalar(children[-1]), with_type=mods.get("with_type"),
                               with_predicate=mods.get("with_predicate"), mode=mods.get("mode"),
                               threshold=mods.get("threshold"))

    def b_filter_clause(self, tree: ParseTree) -> A.Filter:
        return A.Filter(self.expr(tree.children[0]))

    def b_where_block(self, tree: ParseTree) -> tuple[A.Clause, ...]:
        return tuple(self.clause(c) for c in tree.children)

    def b_not_clause(self, tree: ParseTree) -> A.Not:
        return A.Not(self.block(tree.children[0]))

    def b_optional_clause(self, tree: ParseTree) -> A.Optional:
        return A.Optional(self.block(tree.children[0]))

    def b_union_clause(self, tree: ParseTree) -> A.Union:
        return A.Union(self.block(tree.children[0]))

    # -- query ------------------------------------------------------------------------------
    def b_query(self, tree: ParseTree) -> QueryParts:
        parts: QueryParts = {}
        children = list(tree.children)
        parts["find"] = tuple(self.projection(c) for c in subtree(children[0]).children)
        parts["where"] = self.block(children[1])
        for node in children[2:]:
            child = optional_subtree(node)
            if child is None:
                continue
            if child.data == "as_of_clause":
                parts["as_of_seq"] = scalar(child.children[0])
            elif child.data == "for_time_clause":
                parts["for_time"] = scalar(child.children[0])
            elif child.data == "epistemic_clause":
                parts["epistemic"] = self.object_literal(child.children[0])
            elif child.data == "order_by_clause":
                items = []
                for item_node in child.children:
                    item = subtree(item_node)
                    direction = optional_subtree(item.children[1]) if len(item.children) > 1 else None
                    descending = direction is not None and str(direction.children[0]).upper() == "DESC"
                    items.append(A.OrderItem(self.projection(item.children[0]), descending))
                parts["order_by"] = tuple(items)
            elif child.data == "limit_clause":
                parts["limit"] = scalar(child.children[0])
            elif child.data == "cursor_clause":
                parts["cursor"] = scalar(child.children[0])
        return parts


_EXPR = (A.Var, A.Path, Param, Literal, A.ArrayExpr, A.ObjectExpr, A.Call, A.Unary, A.Binary)
_TERM = (A.Var, Param, Literal, A.ObjectPattern, A.ArrayPattern, A.TripleTuple, A.IdTuple)
_CLAUSE = (A.ConceptPattern, A.PropositionPattern, A.AssertionPattern, A.EvidencePattern, A.ActivityPattern,
           A.StructuralPattern, A.BeliefPattern, A.BeliefSlotPattern, A.SearchPattern, A.Filter, A.Not,
           A.Optional, A.Union)


#: Parsed-and-checked queries by text. Parameters are bound structurally (§74),
#: so one parse serves every binding, like a prepared statement.
PARSE_CACHE_SIZE = 1024


def parse_kql(text: str, *, check: bool = True) -> A.Query:
    """Parse and (by default) semantically check one KQL query (cached by text)."""
    if check and isinstance(text, str):
        return _parse_checked(text)
    return _parse(text, check)


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def _parse_checked(text: str) -> A.Query:
    return _parse(text, True)


def _parse(text: str, check: bool) -> A.Query:
    tree = parse_tree(text, "kql")
    parts = _Builder().b_query(subtree(tree.children[0]))
    query = A.Query(text=text, **parts)
    if check:
        from akrelay.kip.kql.check import check_query

        check_query(query)
    return query


__all__ = ["LITERAL_KINDS", "parse_kql"]
