"""The element views KQL paths and object patterns read.

Lookups (by type, predicate, object, author, structural field, ...) are the
nexus storage interface's own (:class:`akrelay.kip.nexus.NexusBase`), index
lookups in every backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Iterator

from akrelay.jsontypes import JSON

from akrelay.kip.elements import Assertion, Concept, Element, Proposition
from akrelay.kip.nexus import NexusBase


def _fast_fields(nexus: NexusBase, element: Element) -> dict[str, JSON]:
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


class ElementView(Mapping[str, JSON]):
    """The element view KQL paths and object patterns read (§44.1), built lazily.

    It is the nexus's authorized view plus query conveniences: a Concept's local
    ``type`` name, and a Proposition's ``predicate`` and merge-resolved
    ``canonical_subject``/``canonical_object`` (no merges happen here, so they
    equal the stored endpoints, §43.2). Common members are read straight from the
    element; the full view is built only when another member is asked for.
    """

    __slots__ = ("_nexus", "_element", "_seq", "_fast", "_full")

    def __init__(self, nexus: NexusBase, element: Element, seq: int) -> None:
        self._nexus, self._element, self._seq = nexus, element, seq
        self._fast = _fast_fields(nexus, element)
        self._full: dict[str, JSON] | None = None

    def _materialize(self) -> dict[str, JSON]:
        if self._full is None:
            full: dict[str, JSON] = self._nexus.view(self._element, self._seq)
            full.update(self._fast)
            self._full = full
        return self._full

    def __getitem__(self, key: str) -> JSON:
        if key in self._fast:
            return self._fast[key]
        return self._materialize()[key]

    def __contains__(self, key: object) -> bool:
        return key in self._fast or key in self._materialize()

    # one signature for Mapping.get's two overloads (a view's default is a JSON value too)
    def get(self, key: str, default: JSON = None) -> JSON:  # type: ignore[override]
        if key in self._fast:
            return self._fast[key]
        return self._materialize().get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._materialize())

    def __len__(self) -> int:
        return len(self._materialize())


def query_view(nexus: NexusBase, element: Element, seq: int) -> ElementView:
    """The lazily built query view of ``element`` at ``seq`` (see :class:`ElementView`)."""
    return ElementView(nexus, element, seq)
