"""KQL expressions (KIP §45–§46): three-valued truth, comparison, functions, aggregates, row order and rendering."""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Hashable
from typing import Any, Callable, Mapping, cast

from akrelay.kip.elements import KIND_OF
from akrelay.kip.kql import belief as B
from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.errors import KqlError
from akrelay.kip.kql.regex import regex_match
from akrelay.kip.kql.values import (
    Literal, Param, is_safe_integer,
)
from akrelay.kip.kql.context import (
    ELEMENT_TYPES, Bound, Context, Edge, Hit, Solution, _canon, _element_of, _is_ref, _order_text, binding_key,
)

# --------------------------------------------------------------------- expressions


def truth(value: object) -> bool | None:
    """Three-valued truth: True, False, or None (unknown)."""
    return value if isinstance(value, bool) else None


def _step(value: Bound, step: str, ctx: Context) -> Bound:
    if value is None:
        return None
    if isinstance(value, Hit):
        if step == "retrieval":
            return {"score": value.score, "mode": value.mode}
        value = value.element
    if isinstance(value, ELEMENT_TYPES):
        return ctx.view(value).get(step)
    if isinstance(value, B.BeliefValue):
        return value.data.get(step)
    if isinstance(value, Edge):
        return {"source": {"id": value.source}, "field": value.field_ref, "target": {"id": value.target},
                "index": None}.get(step)
    if isinstance(value, dict):
        if _is_ref(value) and step != "id":
            element = ctx.get(value["id"])
            return ctx.view(element).get(step) if element is not None else None
        return value.get(step)
    return None


def eval_expr(expr: A.Expr, sol: Mapping[str, Bound], ctx: Context) -> Bound:
    ctx.tick()
    return _EXPRESSIONS[type(expr)](expr, sol, ctx)


def _path(expr: A.Path, sol: Mapping[str, Bound], ctx: Context) -> Bound:
    value = sol.get(expr.var)
    for step in expr.steps:
        value = _step(value, step, ctx)
    return value


def _unary(expr: A.Unary, sol: Mapping[str, Bound], ctx: Context) -> Bound:
    operand = eval_expr(expr.operand, sol, ctx)
    if expr.op == "!":
        t = truth(operand)
        return None if t is None else not t
    if isinstance(operand, (int, float)) and not isinstance(operand, bool):
        return -operand
    return None


def _binary(expr: A.Binary, sol: Mapping[str, Bound], ctx: Context) -> Bound:
    if expr.op in ("&&", "||"):
        left = truth(eval_expr(expr.left, sol, ctx))
        if expr.op == "&&" and left is False:
            return False
        if expr.op == "||" and left is True:
            return True
        right = truth(eval_expr(expr.right, sol, ctx))
        if expr.op == "&&":
            return False if right is False else (True if left is True and right is True else None)
        return True if right is True else (False if left is False and right is False else None)
    return compare(expr.op, eval_expr(expr.left, sol, ctx), eval_expr(expr.right, sol, ctx))


#: How each kind of expression node evaluates: the one dispatch of expressions, by node type.
_EXPRESSIONS: dict[type, Callable[[Any, Mapping[str, Bound], Context], Bound]] = {  # Any: each takes its key's node type
    Param: lambda expr, sol, ctx: ctx.value(expr),
    Literal: lambda expr, sol, ctx: ctx.value(expr),
    A.Var: lambda expr, sol, ctx: sol.get(expr.name),
    A.Path: _path,
    A.ArrayExpr: lambda expr, sol, ctx: [eval_expr(i, sol, ctx) for i in expr.items],
    A.ObjectExpr: lambda expr, sol, ctx: {k: eval_expr(v, sol, ctx) for k, v in expr.members},
    A.Unary: _unary,
    A.Binary: _binary,
    A.Call: lambda expr, sol, ctx: call(expr, [eval_expr(a, sol, ctx) for a in expr.args]),
}


def _scalar_kind(value: object) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


def compare(op: str, left: Bound, right: Bound) -> bool | None:
    """Comparison without coercion; a null/unbound operand is unknown (§44.2)."""
    if left is None or right is None:
        return None
    if op in ("==", "!="):
        if _element_of(left) is not None or _element_of(right) is not None \
                or isinstance(left, (B.BeliefValue, Edge)) or isinstance(right, (B.BeliefValue, Edge)):
            equal = binding_key(left) == binding_key(right)
        else:
            equal = _canon(left) == _canon(right)
        return equal if op == "==" else not equal
    # ordering only between two strings or two numbers (booleans are not ordered)
    if isinstance(left, bool) or isinstance(right, bool):
        return None
    if isinstance(left, str):
        if not isinstance(right, str):
            return None
        a, b = unicodedata.normalize("NFC", left), unicodedata.normalize("NFC", right)
        return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return {"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right}[op]
    return None


def call(expr: A.Call, args: list[Bound]) -> Bound:
    name = expr.name
    if name == "IS_NULL":
        return args[0] is None
    if name == "IS_NOT_NULL":
        return args[0] is not None
    if name == "IS_LITERAL":
        return _scalar_kind(args[0]) is not None
    if name == "IS_ELEMENT":
        return _element_of(args[0]) is not None
    if name == "IS_KIND":
        element = _element_of(args[0])
        if element is None or args[1] is None:
            return None if args[0] is None else False
        if not isinstance(args[1], str):
            raise KqlError("TypeMismatch", "IS_KIND takes a kind name")
        return KIND_OF[type(element)] == args[1].lower()
    if name == "LITERAL_TYPE":
        if args[0] is None:
            return None
        return _scalar_kind(args[0]) or ("array" if isinstance(args[0], list) else
                                         "object" if isinstance(args[0], dict) else None)
    if name == "IN":
        value, candidates = args
        if not isinstance(candidates, list):
            raise KqlError("TypeMismatch", "IN takes a list as its second argument")
        if value is None:
            return None
        return any(compare("==", value, c) is True for c in candidates)
    if name in ("CONTAINS", "STARTS_WITH", "ENDS_WITH", "REGEX"):
        text, other = args
        if text is None or other is None:
            return None
        if name == "REGEX":
            if not isinstance(other, str):
                raise KqlError("TypeMismatch", "REGEX takes a string pattern")
            return regex_match(text, other) if isinstance(text, str) else None
        if not isinstance(text, str) or not isinstance(other, str):
            return None
        text, other = unicodedata.normalize("NFC", text), unicodedata.normalize("NFC", other)
        return {"CONTAINS": other in text, "STARTS_WITH": text.startswith(other),
                "ENDS_WITH": text.endswith(other)}[name]
    raise KqlError("InvalidSyntax", f"unknown function {name}")  # pragma: no cover - checked statically


# --------------------------------------------------------------------- aggregation


def _aggregate(agg: A.Aggregate, group: list[Solution], ctx: Context) -> Bound:
    values = [eval_expr(agg.arg, s, ctx) for s in group]
    values = [v for v in values if v is not None]
    if agg.distinct:
        unique: dict[Hashable, Bound] = {}
        for v in values:
            unique.setdefault(binding_key(v), v)
        values = list(unique.values())
    if agg.func == "COUNT":
        return len(values)
    if not values:
        return None
    if agg.func in ("SUM", "AVG"):
        numbers: list[int | float] = []
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise KqlError("TypeMismatch", f"{agg.func} takes numeric inputs")
            numbers.append(v)
        total = math.fsum(numbers) if any(isinstance(v, float) for v in numbers) else sum(numbers)
        if agg.func == "AVG":
            total = total / len(values)
        if not math.isfinite(total) or (float(total).is_integer() and not is_safe_integer(total)):
            raise KqlError("ResourceExhausted", f"{agg.func} leaves the §9.3 numeric range")
        return int(total) if isinstance(total, float) and total.is_integer() and agg.func == "SUM" else total
    kinds = {_scalar_kind(v) for v in values}
    if len(kinds) != 1 or None in kinds or "boolean" in kinds:
        raise KqlError("TypeMismatch", f"{agg.func} needs mutually comparable scalar inputs")
    scalars = cast("list[str | float]", values)  # one kind: all strings, or all numbers
    return min(scalars) if agg.func == "MIN" else max(scalars)


# ------------------------------------------------------------------ ordering & rows


def _sort_rank(value: Bound) -> tuple[int, bool | int | float | str]:
    if isinstance(value, bool):
        return (0, value)
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, unicodedata.normalize("NFC", value))
    return (3, _order_text(binding_key(value)))


def _compare_rows(a: tuple[list[Bound], str], b: tuple[list[Bound], str], descending: list[bool]) -> int:
    for av, bv, desc in zip(a[0], b[0], descending):
        if av is None and bv is None:
            continue
        if av is None:
            return 1          # nulls last, ascending or descending
        if bv is None:
            return -1
        ar, br = _sort_rank(av), _sort_rank(bv)
        if ar == br:
            continue
        result = -1 if ar < br else 1
        return -result if desc else result
    return (a[1] > b[1]) - (a[1] < b[1])


def render(value: Bound, ctx: Context) -> Bound:
    """The JSON cell of a projected value (§42.5, §81.1)."""
    if isinstance(value, Hit):
        view = dict(ctx.nexus.view(value.element, ctx.seq))
        view["retrieval"] = {"score": value.score, "mode": value.mode}
        return view
    if isinstance(value, ELEMENT_TYPES):
        return ctx.nexus.view(value, ctx.seq)
    if isinstance(value, B.BeliefValue):
        return value.data
    if isinstance(value, Edge):
        return {"kind": "structural", "source": {"id": value.source}, "field": value.field_ref,
                "target": {"id": value.target}, "index": None}
    return value


def expr_text(expr: A.Projection) -> str:
    """A canonical rendering of a FIND/ORDER BY expression, used as column name."""
    if isinstance(expr, A.Var):
        return f"?{expr.name}"
    if isinstance(expr, A.Path):
        out = f"?{expr.var}"
        for step in expr.steps:
            out += f".{step}" if step.isidentifier() else f"[{json.dumps(step, ensure_ascii=False)}]"
        return out
    if isinstance(expr, Param):
        return f":{expr.name}"
    if isinstance(expr, Literal):
        return json.dumps(expr.value, ensure_ascii=False)
    if isinstance(expr, A.Aggregate):
        return f"{expr.func}({'DISTINCT ' if expr.distinct else ''}{expr_text(expr.arg)})"
    if isinstance(expr, A.Call):
        return f"{expr.name}({', '.join(expr_text(a) for a in expr.args)})"
    if isinstance(expr, A.Unary):
        return f"{expr.op}{expr_text(expr.operand)}"
    if isinstance(expr, A.Binary):
        return f"({expr_text(expr.left)} {expr.op} {expr_text(expr.right)})"
    if isinstance(expr, A.ArrayExpr):
        return "[" + ", ".join(expr_text(i) for i in expr.items) + "]"
    if isinstance(expr, A.ObjectExpr):
        return "{" + ", ".join(f"{k}: {expr_text(v)}" for k, v in expr.members) + "}"
    return repr(expr)  # pragma: no cover


