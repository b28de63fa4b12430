"""The one expression walker (kql.nodes.walk_expression), shared by the static checks and the evaluator."""

from __future__ import annotations

from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.check import expr_vars
from akrelay.kip.kql.values import Literal


def test_walk_visits_parents_before_children_left_to_right() -> None:
    expr = A.Binary("&&", A.Call("REGEX", (A.Var("a"), Literal("x"))),
                    A.Unary("!", A.ArrayExpr((A.Path("b", ("name",)), A.ObjectExpr((("k", A.Var("c")),))))))
    kinds = [type(n).__name__ for n in A.walk_expression(expr)]
    assert kinds == ["Binary", "Call", "Var", "Literal", "Unary", "ArrayExpr", "Path", "ObjectExpr", "Var"]
    assert expr_vars(expr) == {"a", "b", "c"}
    assert expr_vars(A.Aggregate("COUNT", False, A.Var("z"))) == {"z"}
    assert list(A.walk_expression(Literal(1))) == [Literal(1)]
