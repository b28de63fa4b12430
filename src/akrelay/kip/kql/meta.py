"""META commands (KIP §63–§68): AST and ``parse_meta``.

``parse_meta(text) -> MetaCommand`` parses one META statement with the grammar
in ``grammar/meta.lark``. Every META family of the KIP grammar is recognised;
the ones akrelay serves have their own node, every other one becomes
:class:`OtherMeta` so the runtime can answer ``UnsupportedCapability`` rather
than ``InvalidSyntax``. Value positions hold :class:`~akrelay.kip.kql.values.Param`
or :class:`~akrelay.kip.kql.values.Literal`; resolve them with
``value.resolve(parameters)`` (missing parameter -> ``ReferenceError``).

AST (frozen dataclasses; ``V`` = ``Param | Literal``)::

    DescribePrimer(mode: V | None)                 DESCRIBE PRIMER [MODE "compact"|"full"|:m]
    DescribeProtocol()                             DESCRIBE PROTOCOL
    DescribeCapabilities()                         DESCRIBE CAPABILITIES
    DescribeSpace(space: V | None)                 DESCRIBE SPACE [v]
    DescribeSchemaEnvironment(as_of_seq: V | None) DESCRIBE SCHEMA ENVIRONMENT [AS OF SEQ v]
    DescribeType(name: V)                          DESCRIBE TYPE v
    DescribePredicate(name: V)                     DESCRIBE PREDICATE v
    DescribeEpistemicPolicy(policy: V | None)      DESCRIBE EPISTEMIC POLICY [v]
    DescribeSnapshot(as_of_seq: V | None, at_time: V | None)
                                                   DESCRIBE SNAPSHOT [AS OF SEQ v | AT TIME v]
    ListTypes(limit: V | None, cursor: V | None)   LIST TYPES [LIMIT v] [CURSOR v]
    ListPredicates(limit, cursor)                  LIST PREDICATES ...
    ListEpistemicPolicies(limit, cursor)           LIST EPISTEMIC POLICIES ...
    Search(kind: str, term: V, with_type: V | None, with_predicate: V | None,
           mode: V | None, threshold: V | None, as_of_seq: V | None,
           limit: V | None, cursor: V | None)
                                                   SEARCH CONCEPT|PROPOSITION|ASSERTION|EVIDENCE|
                                                   ACTIVITY|COGNITION v [WITH TYPE v] ...
    OtherMeta(family: str, target: str, parameter_names: frozenset[str])
                                                   any other family/target, e.g.
                                                   ("DESCRIBE", "PACKAGE"), ("HISTORY", "SPACE"),
                                                   ("EXPORT", "CAPSULE")

Every node has ``family`` ("DESCRIBE", "LIST", "SEARCH", ...), ``target``
("PRIMER", "SCHEMA ENVIRONMENT", "CONCEPT", ...) and ``parameter_names()``,
the set of ``:names`` it references, so a runtime can report every missing
parameter before executing. Literal modes are checked here (``MODE "compact"``
or ``"full"`` for the Primer; ``"keyword"|"semantic"|"hybrid"`` for SEARCH);
a bound parameter is checked by the runtime with the helpers of ``values``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from lark import Token, Tree

from akrelay.kip.kql.errors import syntax_error
from akrelay.kip.kql.grammar import ParseTree, optional_subtree, parse_tree, required_scalar, scalar, subtree
from akrelay.kip.kql.values import Literal, Param, Value

PRIMER_MODES = ("compact", "full")
SEARCH_MODES = ("keyword", "semantic", "hybrid")
SEARCH_KINDS = ("CONCEPT", "PROPOSITION", "ASSERTION", "EVIDENCE", "ACTIVITY", "COGNITION")


class MetaCommand:
    """Base of every META AST node."""

    family: ClassVar[str] = ""
    target: ClassVar[str] = ""

    def parameter_names(self) -> frozenset[str]:
        names: set[str] = set()
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Param):
                names.add(value.name)
        return frozenset(names)


@dataclass(frozen=True, slots=True)
class DescribePrimer(MetaCommand):
    family: ClassVar[str] = "DESCRIBE"
    target: ClassVar[str] = "PRIMER"
    mode: Value | None = None


@dataclass(frozen=True, slots=True)
class DescribeProtocol(MetaCommand):
    family: ClassVar[str] = "DESCRIBE"
    target: ClassVar[str] = "PROTOCOL"


@dataclass(frozen=True, slots=True)
class DescribeCapabilities(MetaCommand):
    family: ClassVar[str] = "DESCRIBE"
    target: ClassVar[str] = "CAPABILITIES"


@dataclass(frozen=True, slots=True)
class DescribeSpace(MetaCommand):
    family: ClassVar[str] = "DESCRIBE"
    target: ClassVar[str] = "SPACE"
    space: Value | None = None


@dataclass(frozen=True, slots=True)
class DescribeSchemaEnvironment(MetaCommand):
    family: ClassVar[str] = "DESCRIBE"
    target: ClassVar[str] = "SCHEMA ENVIRONMENT"
    as_of_seq: Value | None = None


@dataclass(frozen=True, slots=True)
class DescribeType(MetaCommand):
    family: ClassVar[str] = "DESCRIBE"
    target: ClassVar[str] = "TYPE"
    name: Value


@dataclass(frozen=True, slots=True)
class DescribePredicate(MetaCommand):
    family: ClassVar[str] = "DESCRIBE"
    target: ClassVar[str] = "PREDICATE"
    name: Value


@dataclass(frozen=True, slots=True)
class DescribeEpistemicPolicy(MetaCommand):
    family: ClassVar[str] = "DESCRIBE"
    target: ClassVar[str] = "EPISTEMIC POLICY"
    policy: Value | None = None


@dataclass(frozen=True, slots=True)
class DescribeSnapshot(MetaCommand):
    family: ClassVar[str] = "DESCRIBE"
    target: ClassVar[str] = "SNAPSHOT"
    as_of_seq: Value | None = None
    at_time: Value | None = None


@dataclass(frozen=True, slots=True)
class ListTypes(MetaCommand):
    family: ClassVar[str] = "LIST"
    target: ClassVar[str] = "TYPES"
    limit: Value | None = None
    cursor: Value | None = None


@dataclass(frozen=True, slots=True)
class ListPredicates(MetaCommand):
    family: ClassVar[str] = "LIST"
    target: ClassVar[str] = "PREDICATES"
    limit: Value | None = None
    cursor: Value | None = None


@dataclass(frozen=True, slots=True)
class ListEpistemicPolicies(MetaCommand):
    family: ClassVar[str] = "LIST"
    target: ClassVar[str] = "EPISTEMIC POLICIES"
    limit: Value | None = None
    cursor: Value | None = None


@dataclass(frozen=True, slots=True)
class Search(MetaCommand):
    family: ClassVar[str] = "SEARCH"
    kind: str
    term: Value
    with_type: Value | None = None
    with_predicate: Value | None = None
    mode: Value | None = None
    threshold: Value | None = None
    as_of_seq: Value | None = None
    limit: Value | None = None
    cursor: Value | None = None

    @property
    def target(self) -> str:  # type: ignore[override]
        return self.kind


@dataclass(frozen=True, slots=True)
class OtherMeta(MetaCommand):
    """A well-formed META statement of a family/target akrelay does not serve."""

    family_name: str
    target_name: str
    parameters: frozenset[str] = frozenset()

    @property
    def family(self) -> str:  # type: ignore[override]
        return self.family_name

    @property
    def target(self) -> str:  # type: ignore[override]
        return self.target_name

    def parameter_names(self) -> frozenset[str]:
        return self.parameters


# ------------------------------------------------------------------ builder

_OTHER_DESCRIBE = {
    "describe_execution_context": "EXECUTION CONTEXT",
    "describe_package": "PACKAGE",
    "describe_facet": "FACET",
    "describe_structural_field": "STRUCTURAL FIELD",
    "describe_compatibility": "COMPATIBILITY",
    "describe_error": "ERROR",
    "describe_transaction": "TRANSACTION",
    "describe_transaction_by_key": "TRANSACTION",
    "describe_capsule": "CAPSULE",
    "describe_projection_capability": "PROJECTION CAPABILITY",
    "describe_trust": "TRUST",
    "describe_access": "ACCESS",
}
_OTHER_LIST = {
    "list_spaces": "SPACES",
    "list_schema_packages": "SCHEMA PACKAGES",
    "list_facets": "FACETS",
    "list_structural_fields": "STRUCTURAL FIELDS",
    "list_dependents": "DEPENDENTS",
}
_OTHER = {
    "verify_statement": ("VERIFY", None),
    "validate_statement": ("VALIDATE", None),
    "preview_kml": ("PREVIEW", "KML"),
    "preview_import_capsule": ("PREVIEW", "IMPORT CAPSULE"),
    "history_element": ("HISTORY", "ELEMENT"),
    "history_space": ("HISTORY", "SPACE"),
    "changes_since": ("CHANGES", "SINCE"),
    "changes_after": ("CHANGES", "AFTER SEQ"),
    "snapshot_statement": ("SNAPSHOT", ""),
    "export_capsule_statement": ("EXPORT", "CAPSULE"),
}


def _params_in(tree: ParseTree) -> frozenset[str]:
    return frozenset(
        str(tok)[1:] for tok in tree.scan_values(lambda t: isinstance(t, Token) and t.type == "PARAMETER")
    )


def _child(tree: ParseTree, name: str) -> ParseTree | None:
    for child in tree.children:
        if isinstance(child, Tree) and child.data == name:
            return child
    return None


def _clause_value(tree: ParseTree, name: str) -> Value | None:
    clause = _child(tree, name)
    return scalar(clause.children[0]) if clause is not None else None


def _paging(tree: ParseTree) -> tuple[Value | None, Value | None]:
    paging = _child(tree, "paging")
    assert paging is not None
    return _clause_value(paging, "limit_clause"), _clause_value(paging, "cursor_clause")


def _check_literal_choice(value: Value | None, choices: tuple[str, ...], what: str, tree: ParseTree) -> None:
    if isinstance(value, Literal) and value.value not in choices:
        tokens = [t for t in tree.scan_values(lambda t: isinstance(t, Token)) if str(t).startswith('"')]
        where = next((t for t in tokens if t.value.strip('"') == value.value), tokens[0] if tokens else None)
        raise syntax_error(
            f"{what} must be one of {', '.join(repr(c) for c in choices)}, got {value.value!r}",
            line=where.line if where is not None else None, column=where.column if where is not None else None,
            hint=f"write {what} " + " | ".join(f'"{c}"' for c in choices),
        )


def _build(tree: ParseTree) -> MetaCommand:
    kind = tree.data
    ch = tree.children
    if kind == "describe_primer":
        mode = scalar(ch[0])
        _check_literal_choice(mode, PRIMER_MODES, "PRIMER MODE", tree)
        return DescribePrimer(mode=mode)
    if kind == "describe_protocol":
        return DescribeProtocol()
    if kind == "describe_capabilities":
        return DescribeCapabilities()
    if kind == "describe_space":
        return DescribeSpace(space=scalar(ch[0]))
    if kind == "describe_schema_environment":
        clause = optional_subtree(ch[0])
        return DescribeSchemaEnvironment(as_of_seq=scalar(clause.children[0]) if clause is not None else None)
    if kind == "describe_type":
        return DescribeType(name=required_scalar(ch[0]))
    if kind == "describe_predicate":
        return DescribePredicate(name=required_scalar(ch[0]))
    if kind == "describe_epistemic_policy":
        return DescribeEpistemicPolicy(policy=scalar(ch[0]))
    if kind == "describe_snapshot":
        at = optional_subtree(ch[0])
        if at is None:
            return DescribeSnapshot()
        if at.data == "as_of_clause":
            return DescribeSnapshot(as_of_seq=scalar(at.children[0]))
        return DescribeSnapshot(at_time=scalar(at.children[0]))
    if kind == "list_types":
        return ListTypes(*_paging(tree))
    if kind == "list_predicates":
        return ListPredicates(*_paging(tree))
    if kind == "list_epistemic_policies":
        return ListEpistemicPolicies(*_paging(tree))
    if kind == "search_statement":
        search_kind = str(subtree(_child(tree, "search_kind")).children[0]).upper()
        mode = _clause_value(tree, "search_mode")
        _check_literal_choice(mode, SEARCH_MODES, "SEARCH MODE", tree)
        as_of = _child(tree, "as_of_clause")
        return Search(
            kind=search_kind,
            term=required_scalar(ch[1]),
            with_type=_clause_value(tree, "search_with_type"),
            with_predicate=_clause_value(tree, "search_with_predicate"),
            mode=mode,
            threshold=_clause_value(tree, "search_threshold"),
            as_of_seq=scalar(as_of.children[0]) if as_of is not None else None,
            limit=_clause_value(tree, "limit_clause"),
            cursor=_clause_value(tree, "cursor_clause"),
        )
    if kind in _OTHER_DESCRIBE:
        return OtherMeta("DESCRIBE", _OTHER_DESCRIBE[kind], _params_in(tree))
    if kind in _OTHER_LIST:
        return OtherMeta("LIST", _OTHER_LIST[kind], _params_in(tree))
    if kind in _OTHER:
        family, target = _OTHER[kind]
        if target is None:
            target = " ".join(str(t).upper() for t in subtree(ch[0]).children)
        return OtherMeta(family, target, _params_in(tree))
    raise AssertionError(f"unhandled META node {kind}")  # pragma: no cover


def parse_meta(text: str) -> MetaCommand:
    """Parse one META statement; malformed text raises ``KqlError('InvalidSyntax')``."""
    tree = parse_tree(text, "meta")
    return _build(subtree(tree.children[0]))
