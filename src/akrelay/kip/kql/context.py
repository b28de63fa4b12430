"""KQL evaluation values and the per-query context (KIP §42): hits, edges, binding keys, symbol resolution.

Shared by the pattern matcher (:mod:`.evaluate`) and the expression evaluator (:mod:`.expressions`).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from collections.abc import Hashable
from typing import Callable, Mapping, Sequence, TypeAlias, TypedDict, TypeGuard, Union

from akrelay.kip import budget as _budget
from akrelay.jsontypes import JSON, JSONMapping, JSONScalar, JSONValue
from akrelay.kip.elements import Activity, Assertion, Concept, Element, Evidence, Proposition
from akrelay.kip.kql import belief as B
from akrelay.kip.kql.access import query_view
from akrelay.kip.kql.errors import KqlError
from akrelay.kip.kql.host import KqlRuntime
from akrelay.kip.kql.values import (
    Literal, Param,
)
from akrelay.kip.nexus import NexusBase

ELEMENT_TYPES = (Concept, Proposition, Assertion, Evidence, Activity)


# ------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Hit:
    """A Search Pattern binding: the element plus its transient retrieval data (§43.8)."""

    element: Element
    score: float
    mode: str


@dataclass(frozen=True, slots=True)
class Edge:
    """A virtual Structural binding (§43.7)."""

    source: str
    field_ref: str
    target: str


#: What a KQL variable binds and an expression yields (§42.5): a JSON value (read from a stored
#: field, a parameter or a literal), an element, a search hit, a Structural edge or a virtual
#: Belief/Slot, or an array or object of these (``FIND [?a, ?b]``).
Bound: TypeAlias = Union[JSONScalar, Element, Hit, Edge, B.BeliefValue, Sequence["Bound"], Mapping[str, "Bound"]]
#: One solution of a WHERE block: variable name (without ``?``) -> bound value.
Solution: TypeAlias = dict[str, Bound]


class Ref(TypedDict):
    """A reference field of a stored value (``{"id": ...}``)."""

    id: str


def _element_of(value: object) -> Element | None:
    if isinstance(value, Hit):
        return value.element
    return value if isinstance(value, ELEMENT_TYPES) else None


def _canon(value: object) -> Hashable:
    """§9.6 canonical form of a JSON value, as a hashable structure."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
            return ("n", int(value))
        return ("n", value if isinstance(value, int) else float(value))
    if isinstance(value, str):
        return ("s", unicodedata.normalize("NFC", value))
    if isinstance(value, list):
        return ("a", tuple(_canon(v) for v in value))
    if isinstance(value, dict):
        return ("o", tuple(sorted((k, _canon(v)) for k, v in value.items())))
    return ("?", repr(value))


def binding_key(value: object) -> Hashable:
    """Identity of a bound value for deduplication and unification (§42.5)."""
    element = _element_of(value)
    if element is not None:
        return ("e", element.id)
    if isinstance(value, B.BeliefValue):
        return ("b", value.key)
    if isinstance(value, Edge):
        return ("s", value.source, value.field_ref, value.target)
    return ("v", _canon(value))


def solution_key(solution: Mapping[str, object]) -> tuple[tuple[str, Hashable], ...]:
    return tuple(sorted((name, binding_key(v)) for name, v in solution.items()))


def _order_text(key: object) -> str:
    """A deterministic total-order key for tie-breaking (ids and canonical values only)."""
    return repr(key)


# ------------------------------------------------------------------------ context


@dataclass
class Context:
    rt: KqlRuntime
    seq: int
    params: JSONMapping
    settings: B.Settings
    views: dict[str, Mapping[str, JSON]] = field(default_factory=dict)
    used_search: bool = False
    used_projection: bool = False
    #: Tags later patterns of the block require of a variable the running clause binds
    #: (``evaluate._later_tags``): its candidates may come from the tag index.
    hints: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: The request's CPU budget (``akrelay.kip.budget``), ticked by every candidate
    #: read, unification step, expression node, path visit and sort comparison.
    tick: Callable[[], None] = field(default_factory=lambda: _budget.current().tick)

    @property
    def nexus(self) -> NexusBase:
        return self.rt.nexus

    def value(self, v: object) -> JSONValue:
        """The bound value of a value position (a Param or Literal: the static checks keep
        anything else, e.g. a predicate variable in a raw path, out; it fails as a bug)."""
        if isinstance(v, Param):
            return self.params[v.name]  # presence checked before execution
        if isinstance(v, Literal):
            return v.value
        raise AssertionError(v)  # pragma: no cover

    def get(self, eid: object) -> Element | None:
        self.tick()
        if not isinstance(eid, str):
            return None
        return self.nexus.get(eid, self.seq)

    def view(self, element: Element) -> Mapping[str, JSON]:
        found = self.views.get(element.id)
        if found is None:
            found = self.views[element.id] = query_view(self.nexus, element, self.seq)
        return found

    def resolve_symbol(self, name: object, kind: str) -> str:
        """A Schema symbol (local name, exact or lineage ref) -> its local name."""
        if not isinstance(name, str):
            raise KqlError("TypeMismatch", f"a {kind} symbol must be a string, got {type(name).__name__}")
        exact: str = self.rt.environment.resolve(name, kind)[0]
        return exact.rsplit("/", 1)[1]

    def exact_ref(self, local: str, kind: str) -> str:
        exact: str = self.rt.environment.resolve(local, kind)[0]
        return exact


def _is_ref(stored: object) -> TypeGuard[Ref]:
    return isinstance(stored, dict) and len(stored) == 1 and isinstance(stored.get("id"), str)
