"""Static semantic checks of a parsed KQL query (what the grammar cannot say).

* Binding sites (§42.4): a variable used only in an expression (FIND, FILTER,
  ORDER BY) needs a visible pattern binding site. NOT-local names are not sites
  outside their NOT; a UNION right branch sees only its own sites (§44.5).
* Raw paths (§45): a predicate variable takes no quantifier and no
  alternatives; an upper bound below the lower bound is invalid; a path that is
  not a single hop binds no Proposition variable and cannot be a nested
  Proposition term (akrelay documents no path-value binding).
* BELIEF (§46.3): ``BELIEF (?p)`` needs ``?p`` bound by an earlier pattern
  (``ProjectionTargetUnbound``); the triple and SLOT forms need their subject
  and predicate grounded or bound earlier (``ProjectionTargetUnbounded``).
* Search Pattern (§43.8): never inside NOT; literal MODE/THRESHOLD/LIMIT valid.
* Aggregates only in FIND and ORDER BY (§44.6); with aggregation, ORDER BY
  keys are aggregates or grouping expressions of FIND (§44.7).
* Function names and arity (§44.2), literal REGEX patterns, literal LIMIT,
  CURSOR, AS OF SEQ, and the WITH EPISTEMIC members (§49).

Errors determinable from the command are raised here even if no solution would
ever reach the offending expression (§44.2).
"""

from __future__ import annotations

from typing import Iterable

from akrelay.kip.kql import nodes as A
from akrelay.kip.kql.errors import KqlError
from akrelay.kip.kql.regex import compile_regex
from akrelay.kip.kql.values import Literal, Param, check_cursor, check_limit, check_seq, check_threshold

#: Registered FILTER functions (§44.2) and their arity.
FUNCTIONS: dict[str, int] = {
    "IN": 2, "CONTAINS": 2, "STARTS_WITH": 2, "ENDS_WITH": 2, "REGEX": 2,
    "IS_NULL": 1, "IS_NOT_NULL": 1, "IS_LITERAL": 1, "IS_ELEMENT": 1, "IS_KIND": 2, "LITERAL_TYPE": 1,
}
AGGREGATES = frozenset({"COUNT", "SUM", "AVG", "MIN", "MAX"})
SEARCH_MODES = ("keyword", "semantic", "hybrid")
EPISTEMIC_MEMBERS = frozenset({"purpose", "risk", "policy", "context_refs", "include_historical",
                               "include_hypothetical", "explanation"})
EXPLANATION_LEVELS = ("none", "summary", "ledger")


def invalid(message: str, hint: str | None = None) -> KqlError:
    return KqlError("InvalidSyntax", message, hint=hint)


# ---------------------------------------------------------------- binding sites


def pattern_vars(value: object) -> set[str]:
    """Variables a pattern value/term binds (object patterns, tuples, arrays)."""
    out: set[str] = set()
    if isinstance(value, A.Var):
        out.add(value.name)
    elif isinstance(value, A.ObjectPattern):
        for _, member in value.members:
            out |= pattern_vars(member)
    elif isinstance(value, A.ArrayPattern):
        for item in value.items:
            out |= pattern_vars(item)
    elif isinstance(value, A.TripleTuple):
        out |= pattern_vars(value.subject) | pattern_vars(value.object)
        for step in value.path:
            if isinstance(step.predicate, A.Var):
                out.add(step.predicate.name)
    return out


def clause_sites(clause: object) -> set[str]:
    """Variables an ordinary pattern clause binds (not FILTER/NOT/OPTIONAL/UNION)."""
    if isinstance(clause, (A.ConceptPattern, A.AssertionPattern, A.EvidencePattern, A.ActivityPattern)):
        return {clause.var} | pattern_vars(clause.pattern)
    if isinstance(clause, A.PropositionPattern):
        own = {clause.var} if clause.var else set()
        return own | pattern_vars(clause.tuple)
    if isinstance(clause, A.StructuralPattern):
        own = {clause.var} if clause.var else set()
        return own | pattern_vars(clause.subject) | pattern_vars(clause.object)
    if isinstance(clause, A.BeliefPattern):
        out = {clause.var}
        if isinstance(clause.target, A.TripleTuple):
            out |= pattern_vars(clause.target.object)
        return out
    if isinstance(clause, (A.BeliefSlotPattern, A.SearchPattern)):
        return {clause.var}
    return set()


def block_exports(clauses: Iterable[object]) -> set[str]:
    """Variables a block makes visible to its enclosing scope (§44.5 table)."""
    out: set[str] = set()
    for clause in clauses:
        if isinstance(clause, (A.Optional, A.Union)):
            out |= block_exports(clause.clauses)
        elif not isinstance(clause, (A.Not, A.Filter)):
            out |= clause_sites(clause)
    return out


# ------------------------------------------------------------------ expressions


def expr_vars(expr: A.Projection) -> set[str]:
    """The variables an expression reads (through :func:`nodes.walk_expression`)."""
    out: set[str] = set()
    for node in A.walk_expression(expr):
        if isinstance(node, A.Var):
            out.add(node.name)
        elif isinstance(node, A.Path):
            out.add(node.var)
    return out


def _check_expr(expr: A.Projection, visible: set[str], where: str) -> None:
    if isinstance(expr, (A.Var, A.Path)):
        name = expr.name if isinstance(expr, A.Var) else expr.var
        if name not in visible:
            raise invalid(
                f"?{name} is used in {where} but has no visible pattern binding site",
                hint="bind it with a pattern in the same scope; NOT-local variables and variables of "
                     "another UNION branch are not visible here (§42.4, §44.5)",
            )
    elif isinstance(expr, A.Call):
        if expr.name in AGGREGATES:
            raise invalid(f"aggregate {expr.name}(...) is allowed only as a FIND or ORDER BY item, not in {where}",
                          hint="aggregates apply to the whole solution set (§44.6)")
        arity = FUNCTIONS.get(expr.name)
        if arity is None:
            raise invalid(f"unknown function {expr.name}", hint="registered: " + ", ".join(sorted(FUNCTIONS)))
        if len(expr.args) != arity:
            raise invalid(f"{expr.name} takes {arity} argument(s), got {len(expr.args)}")
        if expr.name == "REGEX" and isinstance(expr.args[1], Literal):
            compile_regex(expr.args[1].value)
        if expr.name == "IN" and isinstance(expr.args[1], Literal) and not isinstance(expr.args[1].value, list):
            raise KqlError("TypeMismatch", "IN takes a list as its second argument")
        for arg in expr.args:
            _check_expr(arg, visible, where)
    elif isinstance(expr, A.Unary):
        _check_expr(expr.operand, visible, where)
    elif isinstance(expr, A.Binary):
        _check_expr(expr.left, visible, where)
        _check_expr(expr.right, visible, where)
    elif isinstance(expr, A.ArrayExpr):
        for item in expr.items:
            _check_expr(item, visible, where)
    elif isinstance(expr, A.ObjectExpr):
        for _, value in expr.members:
            _check_expr(value, visible, where)
    elif isinstance(expr, A.Aggregate):  # pragma: no cover - grammar keeps them top-level
        raise invalid(f"aggregate {expr.func} cannot be nested")


# --------------------------------------------------------------------- patterns


def _check_tuple(tup: object, *, binds_var: bool, nested: bool) -> None:
    if isinstance(tup, A.IdTuple):
        if isinstance(tup.id, Literal) and not isinstance(tup.id.value, str):
            raise KqlError("TypeMismatch", "(id: ...) takes a string id")
        return
    if not isinstance(tup, A.TripleTuple):
        return
    for step in tup.path:
        if step.max_hops is not None and step.max_hops < step.min_hops:
            raise invalid(f"path quantifier {{{step.min_hops},{step.max_hops}}} has an upper bound below its lower bound")
        if isinstance(step.predicate, A.Var) and (step.quantified or len(tup.path) > 1):
            raise invalid("a predicate variable denotes one exact Predicate: it takes no quantifier or alternatives",
                          hint="use quoted predicate names or parameters in raw paths (§45)")
        if isinstance(step.predicate, Literal) and not isinstance(step.predicate.value, str):
            raise KqlError("TypeMismatch", "a predicate is a string Schema symbol")
    single_hop = all(step.is_single_hop for step in tup.path)
    if not single_hop and binds_var:
        raise invalid("a multi-hop or zero-hop path binds no Proposition variable",
                      hint="drop the ?variable before the path: a raw path is reachability, not a Proposition (§45)")
    if not single_hop and nested:
        raise invalid("a nested Proposition term must name Propositions, not a raw path")
    _check_terms(tup.subject)
    _check_terms(tup.object)


def _check_terms(value: object) -> None:
    if isinstance(value, (A.TripleTuple, A.IdTuple)):
        _check_tuple(value, binds_var=False, nested=True)
    elif isinstance(value, A.ObjectPattern):
        for _, member in value.members:
            _check_terms(member)
    elif isinstance(value, A.ArrayPattern):
        for item in value.items:
            _check_terms(item)


def _grounded(term: object, bound: set[str]) -> bool:
    if isinstance(term, A.Var):
        return term.name in bound
    return True  # parameter, literal, object pattern, Proposition tuple


def _check_belief(clause: A.BeliefPattern | A.BeliefSlotPattern, bound: set[str]) -> None:
    if isinstance(clause, A.BeliefPattern):
        target = clause.target
        if isinstance(target, A.Var):
            if target.name not in bound:
                raise KqlError(
                    "ProjectionTargetUnbound",
                    f"BELIEF (?{target.name}) needs ?{target.name} bound to a Proposition by an earlier pattern",
                    hint="match the Proposition first, e.g. ?p (?s, \"pred\", ?o), then ?b BELIEF (?p)",
                )
            return
        if isinstance(target, A.IdTuple):
            _check_tuple(target, binds_var=False, nested=False)
            return
        subject, predicate = target.subject, target.path[0].predicate
        _check_tuple(target, binds_var=False, nested=False)
    else:
        subject, predicate = clause.subject, clause.predicate
        _check_terms(subject)
    if not _grounded(subject, bound) or (isinstance(predicate, A.Var) and predicate.name not in bound):
        raise KqlError(
            "ProjectionTargetUnbounded",
            "BELIEF needs its subject and predicate grounded or bound by an earlier pattern (§46.3)",
            hint="bind the subject first (e.g. ?c {id: :id}); a whole-Brain projection is refused",
        )


def _check_search(clause: A.SearchPattern, in_not: bool) -> None:
    if in_not:
        raise invalid("a Search Pattern cannot appear inside NOT: a search miss never proves absence (§43.8)",
                      hint="use an exact pattern inside NOT, or move the search outside it")
    if isinstance(clause.term, Literal) and not isinstance(clause.term.value, str):
        raise KqlError("TypeMismatch", "the search term is a string")
    if isinstance(clause.mode, Literal) and clause.mode.value not in SEARCH_MODES:
        raise invalid(f"unknown search MODE {clause.mode.value!r}", hint='MODE "keyword" | "semantic" | "hybrid"')
    if isinstance(clause.threshold, Literal):
        check_threshold(clause.threshold.value)
    if isinstance(clause.limit, Literal):
        check_limit(clause.limit.value, "Search Pattern LIMIT")
    for value in (clause.with_type, clause.with_predicate):
        if isinstance(value, Literal) and not isinstance(value.value, str):
            raise KqlError("TypeMismatch", "WITH TYPE / WITH PREDICATE take a Schema symbol string")


def _check_block(clauses: tuple[A.Clause, ...], outer_visible: set[str], bound_before: set[str], in_not: bool) -> None:
    visible = outer_visible | block_exports(clauses)
    # NOT-local sites are visible to expressions inside that NOT only.
    bound = set(bound_before)
    for clause in clauses:
        if isinstance(clause, A.Filter):
            _check_expr(clause.expr, visible, "FILTER")
        elif isinstance(clause, A.Not):
            _check_block(clause.clauses, visible, bound, True)
        elif isinstance(clause, A.Optional):
            _check_block(clause.clauses, visible, bound, in_not)
            bound |= block_exports(clause.clauses)
        elif isinstance(clause, A.Union):
            _check_block(clause.clauses, set(), set(), in_not)
            bound |= block_exports(clause.clauses)
        else:
            if isinstance(clause, A.SearchPattern):
                _check_search(clause, in_not)
            elif isinstance(clause, (A.BeliefPattern, A.BeliefSlotPattern)):
                _check_belief(clause, bound)
            elif isinstance(clause, A.PropositionPattern):
                _check_tuple(clause.tuple, binds_var=clause.var is not None, nested=False)
            elif isinstance(clause, A.StructuralPattern):
                _check_terms(clause.subject)
                _check_terms(clause.object)
                if isinstance(clause.field, Literal) and not isinstance(clause.field.value, str):
                    raise KqlError("TypeMismatch", "a Structural Field is a string Schema symbol")
            else:
                _check_terms(clause.pattern)
            bound |= clause_sites(clause)


def _check_epistemic(obj: A.ObjectExpr | None) -> None:
    if obj is None:
        return
    for key, value in obj.members:
        if key not in EPISTEMIC_MEMBERS:
            raise invalid(f"unknown WITH EPISTEMIC member {key!r}", hint="members: " + ", ".join(sorted(EPISTEMIC_MEMBERS)))
        if expr_vars(value):
            raise invalid("WITH EPISTEMIC takes literals and parameters, not query variables")
        if key in ("policy", "purpose", "risk") and isinstance(value, Literal) and not isinstance(value.value, (str, type(None))):
            raise KqlError("TypeMismatch", f"WITH EPISTEMIC {key} is a string")
        if key == "explanation" and isinstance(value, Literal) and value.value not in EXPLANATION_LEVELS:
            raise invalid(f"explanation must be one of {', '.join(EXPLANATION_LEVELS)}")


def check_query(query: A.Query) -> None:
    """Raise the first static error of ``query`` (see the module docstring)."""
    _check_block(query.where, set(), set(), False)
    visible = block_exports(query.where)
    for item in query.find:
        _check_expr(item.arg if isinstance(item, A.Aggregate) else item, visible, "FIND")
    aggregated = query.has_aggregates
    groups = [item for item in query.find if not isinstance(item, A.Aggregate)]
    for order in query.order_by:
        expr = order.expr
        _check_expr(expr.arg if isinstance(expr, A.Aggregate) else expr, visible, "ORDER BY")
        if isinstance(expr, A.Aggregate) and not aggregated:
            raise invalid("ORDER BY uses an aggregate but FIND has none",
                          hint="aggregate in FIND first; ORDER BY keys then refer to it (§44.7)")
        if aggregated and not isinstance(expr, A.Aggregate) and expr not in groups:
            raise invalid("with aggregation, a non-aggregate ORDER BY key must be a grouping expression of FIND (§44.7)")
    if isinstance(query.limit, Literal):
        check_limit(query.limit.value)
    if isinstance(query.cursor, Literal):
        check_cursor(query.cursor.value)
    if isinstance(query.as_of_seq, Literal):
        check_seq(query.as_of_seq.value)
    if isinstance(query.for_time, Literal) and not isinstance(query.for_time.value, str):
        raise KqlError("TypeMismatch", "FOR TIME takes a KIP timestamp string")
    _check_epistemic(query.epistemic)


def parameter_names(query: A.Query) -> set[str]:
    """Every ``:name`` the query references (for ReferenceError before execution)."""
    found: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, Param):
            found.add(node.name)
        elif isinstance(node, tuple):
            for item in node:
                visit(item)
        elif hasattr(node, "__dataclass_fields__") and not isinstance(node, Literal):
            for name in node.__dataclass_fields__:
                visit(getattr(node, name))

    visit(query)
    return found
