"""Read accessors the KQL evaluator needs beyond the nexus's own API.

The nexus indexes what import needs (concept by key, Propositions by subject,
Assertions by Proposition). Query evaluation also walks edges backwards and
selects by type or predicate, so this module keeps secondary indexes over the
append-only element map, extended incrementally as new elements appear. As
elements never change once created, an index entry is valid at every snapshot
at or after its element's ``created_seq``; readers filter by snapshot.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Mapping
from typing import Any, Iterator

from akrelay.kip.elements import Activity, Assertion, Concept, Evidence, Proposition
from akrelay.kip.nexus import Nexus


class Indexes:
    """Secondary indexes of one nexus (see module docstring)."""

    def __init__(self) -> None:
        self.seen = 0
        self.by_type: dict[str, list[str]] = {}
        self.struct_sources: dict[tuple[str, str], list[str]] = {}
        self.struct_by_field: dict[str, list[str]] = {}
        self.props_by_object: dict[str, list[str]] = {}
        self.props_by_predicate: dict[str, list[str]] = {}
        self.assertions_by_author: dict[str, list[str]] = {}
        self.by_kind: dict[str, list[str]] = {k: [] for k in ("concept", "proposition", "assertion",
                                                                  "evidence", "activity")}

    def update(self, nexus: Nexus) -> None:
        total = len(nexus.elements)
        if total == self.seen:
            return
        for element in itertools.islice(nexus.elements.values(), self.seen, None):
            eid = element.id
            if isinstance(element, Concept):
                self.by_kind["concept"].append(eid)
                self.by_type.setdefault(element.type, []).append(eid)
                for field, target in element.structural.items():
                    self.struct_sources.setdefault((field, target), []).append(eid)
                    self.struct_by_field.setdefault(field, []).append(eid)
            elif isinstance(element, Proposition):
                self.by_kind["proposition"].append(eid)
                self.props_by_predicate.setdefault(element.predicate, []).append(eid)
                if isinstance(element.object, dict):
                    self.props_by_object.setdefault(element.object["id"], []).append(eid)
            elif isinstance(element, Assertion):
                self.by_kind["assertion"].append(eid)
                self.assertions_by_author.setdefault(element.asserted_by, []).append(eid)
            elif isinstance(element, Evidence):
                self.by_kind["evidence"].append(eid)
            elif isinstance(element, Activity):
                self.by_kind["activity"].append(eid)
        self.seen = total


_INDEXES: "weakref.WeakKeyDictionary[Nexus, Indexes]" = weakref.WeakKeyDictionary()


def indexes(nexus: Nexus) -> Indexes:
    """The up-to-date secondary indexes of ``nexus`` (built on first use)."""
    found = _INDEXES.get(nexus)
    if found is None:
        found = _INDEXES[nexus] = Indexes()
    found.update(nexus)
    return found


def _fast_fields(nexus: Nexus, element: Any) -> dict[str, Any]:
    """View members readable straight from the element, identical to the full view's.

    A capsule withheld by the operator is redacted by the nexus's view (no attributes,
    its key as name), so its members always come from that view.
    """
    if isinstance(element, Concept):
        if element.type == "KnowledgeCapsule" and nexus.is_withheld(element.key):
            return {"id": element.id}
        return {"id": element.id, "kind": "concept", "type": element.type, "schema_ref": element.schema_ref,
                "key": element.key, "name": element.name, "attributes": element.attributes}
    if isinstance(element, Proposition):
        subject = {"id": element.subject}
        return {"id": element.id, "kind": "proposition", "subject": subject, "canonical_subject": subject,
                "predicate_ref": element.predicate_ref, "predicate": element.predicate_ref,
                "object": element.object, "canonical_object": element.object}
    if isinstance(element, Assertion):
        return {"id": element.id, "kind": "assertion", "proposition": {"id": element.proposition},
                "asserted_by": {"id": element.asserted_by}, "stance": element.stance, "mode": "imported",
                "asserted_at": element.asserted_at}
    return {"id": element.id}


class ElementView(Mapping):
    """The element view KQL paths and object patterns read (§44.1), built lazily.

    It is the nexus's authorized view plus query conveniences: a Concept's local
    ``type`` name, and a Proposition's ``predicate`` and merge-resolved
    ``canonical_subject``/``canonical_object`` (no merges happen here, so they
    equal the stored endpoints, §43.2). Common members are read straight from the
    element; the full view is built only when another member is asked for.
    """

    __slots__ = ("_nexus", "_element", "_seq", "_fast", "_full")

    def __init__(self, nexus: Nexus, element: Any, seq: int) -> None:
        self._nexus, self._element, self._seq = nexus, element, seq
        self._fast = _fast_fields(nexus, element)
        self._full: dict[str, Any] | None = None

    def _materialize(self) -> dict[str, Any]:
        if self._full is None:
            full = self._nexus.view(self._element, self._seq)
            full.update(self._fast)
            self._full = full
        return self._full

    def __getitem__(self, key: str) -> Any:
        if key in self._fast:
            return self._fast[key]
        return self._materialize()[key]

    def __contains__(self, key: object) -> bool:
        return key in self._fast or key in self._materialize()

    def get(self, key: str, default: Any = None) -> Any:
        if key in self._fast:
            return self._fast[key]
        return self._materialize().get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._materialize())

    def __len__(self) -> int:
        return len(self._materialize())


def query_view(nexus: Nexus, element: Any, seq: int) -> ElementView:
    """The lazily built query view of ``element`` at ``seq`` (see :class:`ElementView`)."""
    return ElementView(nexus, element, seq)
