"""``parse_kql``: KQL text to a checked :class:`~akrelay.kip.kql.nodes.Query`.

Parsing (``grammar/kql.lark``) gives ``InvalidSyntax`` with a line, a column and
a hint; the semantic checks the grammar cannot express run next
(:mod:`akrelay.kip.kql.check`), so a query that parses here is one the
evaluator can run without discovering a static error half-way.
"""

from __future__ import annotations

import functools
from typing import Any

from lark import Token, Tree

from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.grammar import LITERAL_KINDS, literal_value, parse_tree, scalar
from akrelay.kip.kql.values import Literal, Param


def _name(token: Token) -> str:
    return str(token)[1:]


def _field_name(tree: Tree) -> str:
    token = tree.children[0]
    if token.type == "STRING":
        return literal_value(Tree("string", [token]))
    return str(token)


class _Builder:
    """Tree -> AST; one method per grammar rule/alias."""

    def build(self, tree: Any) -> Any:
        if tree is None:
            return None
        if isinstance(tree, Token):
            raise AssertionError(f"unexpected token {tree!r}")  # pragma: no cover
        method = getattr(self, "b_" + tree.data, None)
        if method is None:
            raise AssertionError(f"no builder for {tree.data}")  # pragma: no cover
        return method(tree)

    # -- values and expressions ---------------------------------------------------------
    def _literal(self, tree: Tree) -> Literal:
        return Literal(literal_value(tree))

    b_string = b_number = b_true = b_false = b_null = _literal

    def b_param(self, tree: Tree) -> Param:
        return Param(_name(tree.children[0]))

    def b_var(self, tree: Tree) -> A.Var:
        return A.Var(_name(tree.children[0]))

    def b_field_access(self, tree: Tree) -> A.Path:
        var = _name(tree.children[0])
        steps = []
        for step in tree.children[1:]:
            token = step.children[0]
            if step.data == "dot_step":
                steps.append(str(token))
            else:
                steps.append(literal_value(Tree("string", [token])))
        return A.Path(var, tuple(steps))

    def b_array_literal(self, tree: Tree) -> A.ArrayExpr:
        return A.ArrayExpr(tuple(self.build(c) for c in tree.children if c is not None))

    def b_object_literal(self, tree: Tree) -> A.ObjectExpr:
        members = []
        for member in tree.children:
            if member is None:
                continue
            members.append((_field_name(member.children[0]), self.build(member.children[1])))
        return A.ObjectExpr(tuple(members))

    def b_function_call(self, tree: Tree) -> A.Call:
        name = str(tree.children[0]).upper()
        args = tuple(self.build(c) for c in tree.children[1:] if c is not None)
        return A.Call(name, args)

    def b_not_op(self, tree: Tree) -> A.Unary:
        return A.Unary("!", self.build(tree.children[0]))

    def b_neg_op(self, tree: Tree) -> A.Unary:
        return A.Unary("-", self.build(tree.children[0]))

    def b_compare(self, tree: Tree) -> A.Binary:
        left, op, right = tree.children
        return A.Binary(str(op), self.build(left), self.build(right))

    def b_and_op(self, tree: Tree) -> A.Binary:
        return A.Binary("&&", self.build(tree.children[0]), self.build(tree.children[1]))

    def b_or_op(self, tree: Tree) -> A.Binary:
        return A.Binary("||", self.build(tree.children[0]), self.build(tree.children[1]))

    def b_aggregate_expression(self, tree: Tree) -> A.Aggregate:
        name_tree, distinct, arg = tree.children
        return A.Aggregate(str(name_tree.children[0]).upper(), distinct is not None, self.build(arg))

    # -- patterns -------------------------------------------------------------------------
    def b_object_pattern(self, tree: Tree) -> A.ObjectPattern:
        members = []
        for member in tree.children:
            if member is None:
                continue
            members.append((_field_name(member.children[0]), self.build(member.children[1])))
        return A.ObjectPattern(tuple(members))

    def b_array_pattern(self, tree: Tree) -> A.ArrayPattern:
        return A.ArrayPattern(tuple(self.build(c) for c in tree.children if c is not None))

    def _predicate_atom(self, tree: Tree) -> Any:
        token = tree.children[0]
        if token.type == "STRING":
            return Literal(literal_value(Tree("string", [token])))
        if token.type == "PARAMETER":
            return Param(_name(token))
        return A.Var(_name(token))

    def b_triple_tuple(self, tree: Tree) -> A.TripleTuple:
        subject, path, obj = tree.children
        steps = []
        for atom in path.children:
            predicate = self._predicate_atom(atom.children[0])
            quant = atom.children[1] if len(atom.children) > 1 else None
            if quant is None:
                steps.append(A.PathStep(predicate))
                continue
            nums = [int(str(t)) for t in quant.children]
            if quant.data == "hops_exact":
                lo, hi = nums[0], nums[0]
            elif quant.data == "hops_open":
                lo, hi = nums[0], None
            else:
                lo, hi = nums
            steps.append(A.PathStep(predicate, lo, hi, True))
        return A.TripleTuple(self.build(subject), tuple(steps), self.build(obj))

    def b_id_tuple(self, tree: Tree) -> A.IdTuple:
        return A.IdTuple(scalar(tree.children[0]))

    def b_concept_pattern(self, tree: Tree) -> A.ConceptPattern:
        return A.ConceptPattern(_name(tree.children[0]), self.build(tree.children[-1]))

    def b_proposition_pattern(self, tree: Tree) -> A.PropositionPattern:
        var = tree.children[0]
        return A.PropositionPattern(_name(var) if var is not None else None, self.build(tree.children[-1]))

    def b_assertion_pattern(self, tree: Tree) -> A.AssertionPattern:
        return A.AssertionPattern(_name(tree.children[0]), self.build(tree.children[1]))

    def b_evidence_pattern(self, tree: Tree) -> A.EvidencePattern:
        return A.EvidencePattern(_name(tree.children[0]), self.build(tree.children[1]))

    def b_activity_pattern(self, tree: Tree) -> A.ActivityPattern:
        return A.ActivityPattern(_name(tree.children[0]), self.build(tree.children[1]))

    def b_structural_pattern(self, tree: Tree) -> A.StructuralPattern:
        var, subject, field, obj = tree.children
        token = field.children[0]
        field_value = (Param(_name(token)) if token.type == "PARAMETER"
                       else Literal(literal_value(Tree("string", [token]))))
        return A.StructuralPattern(_name(var) if var is not None else None, self.build(subject),
                                   field_value, self.build(obj))

    def b_belief_var(self, tree: Tree) -> A.BeliefPattern:
        return A.BeliefPattern(_name(tree.children[0]), A.Var(_name(tree.children[1])))

    def b_belief_id(self, tree: Tree) -> A.BeliefPattern:
        return A.BeliefPattern(_name(tree.children[0]), A.IdTuple(scalar(tree.children[1])))

    def b_belief_triple(self, tree: Tree) -> A.BeliefPattern:
        var, subject, predicate, obj = tree.children
        triple = A.TripleTuple(self.build(subject), (A.PathStep(self._predicate_atom(predicate)),), self.build(obj))
        return A.BeliefPattern(_name(var), triple)

    def b_belief_slot_pattern(self, tree: Tree) -> A.BeliefSlotPattern:
        var, subject, predicate = tree.children
        return A.BeliefSlotPattern(_name(var), self.build(subject), self._predicate_atom(predicate))

    def b_search_pattern(self, tree: Tree) -> A.SearchPattern:
        children = tree.children
        var = _name(children[0])
        kind = str(children[1].children[0]).upper()
        term = scalar(children[2])
        mods: dict[str, Any] = {}
        for child in children[3:-1]:
            if child is None:
                continue
            key = {"search_with_type": "with_type", "search_with_predicate": "with_predicate",
                   "search_mode": "mode", "search_threshold": "threshold"}[child.data]
            mods[key] = scalar(child.children[0])
        return A.SearchPattern(var, kind, term, limit=scalar(children[-1]), **mods)

    def b_filter_clause(self, tree: Tree) -> A.Filter:
        return A.Filter(self.build(tree.children[0]))

    def _block(self, tree: Tree) -> tuple[Any, ...]:
        return tuple(self.build(c) for c in tree.children)

    def b_where_block(self, tree: Tree) -> tuple[Any, ...]:
        return self._block(tree)

    def b_not_clause(self, tree: Tree) -> A.Not:
        return A.Not(self.build(tree.children[0]))

    def b_optional_clause(self, tree: Tree) -> A.Optional:
        return A.Optional(self.build(tree.children[0]))

    def b_union_clause(self, tree: Tree) -> A.Union:
        return A.Union(self.build(tree.children[0]))

    # -- query ------------------------------------------------------------------------------
    def b_query(self, tree: Tree) -> dict[str, Any]:
        parts: dict[str, Any] = {}
        children = list(tree.children)
        parts["find"] = tuple(self.build(c) for c in children[0].children)
        parts["where"] = self.build(children[1])
        for child in children[2:]:
            if child is None:
                continue
            if child.data == "as_of_clause":
                parts["as_of_seq"] = scalar(child.children[0])
            elif child.data == "for_time_clause":
                parts["for_time"] = scalar(child.children[0])
            elif child.data == "epistemic_clause":
                parts["epistemic"] = self.build(child.children[0])
            elif child.data == "order_by_clause":
                items = []
                for item in child.children:
                    direction = item.children[1] if len(item.children) > 1 else None
                    descending = direction is not None and str(direction.children[0]).upper() == "DESC"
                    items.append(A.OrderItem(self.build(item.children[0]), descending))
                parts["order_by"] = tuple(items)
            elif child.data == "limit_clause":
                parts["limit"] = scalar(child.children[0])
            elif child.data == "cursor_clause":
                parts["cursor"] = scalar(child.children[0])
        return parts


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
    parts = _Builder().build(tree.children[0])
    query = A.Query(text=text, **parts)
    if check:
        from akrelay.kip.kql.check import check_query

        check_query(query)
    return query


__all__ = ["LITERAL_KINDS", "parse_kql"]
