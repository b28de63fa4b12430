"""The nexus: one MemorySpace holding the imported cognition of one relay.

Storage design: every element is immutable and tagged with the ``space_seq`` that
created it; Assertion lifecycle moves are appended as ``(seq, status)``
transitions. A read at ``AS OF SEQ s`` therefore filters by ``created_seq <= s``
and replays transitions up to ``s``: historical reads cost nothing extra and never
need a second copy. The state lives in memory, is a deterministic function of the
acceptance log (``space_seq`` == acceptance ``seq``), and is persisted as a
snapshot with the follower's position (``akrelay.kip.follower``); rebuilding from
the log gives an equal nexus.
"""

from __future__ import annotations

import bisect
import re
from array import array
from dataclasses import dataclass
from typing import Any, Iterator

from akrelay.kip import budget
from akrelay.kip.elements import (
    IMPORT_CHANNEL, IMPORT_ORIGIN_PRINCIPAL, KIND_OF, Activity, Assertion, Concept, Element, Evidence, Proposition,
)
from akrelay.kip.errors import KipError
from akrelay.kip.package import AK_PACKAGE_REF

_TOKEN = re.compile(r"\w+", re.UNICODE)
SEARCH_KINDS = ("concept", "proposition", "assertion", "evidence")


#: ASCII bytes that are not word characters (``\w``) become spaces.
_ASCII_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_ASCII_SPLIT = bytes(c if c in _ASCII_WORD else 0x20 for c in range(256))


def tokens(text: str) -> set[str]:
    """Keyword grounding terms: Unicode word runs, case-folded."""
    if text.isascii():
        # The same terms, three times faster (import cost): on ASCII, casefold is
        # lower() and maps letters to letters, so folding the whole text first
        # cannot move a word boundary, and the word characters are exactly
        # [A-Za-z0-9_]. Outside ASCII folding can move one ("İ" folds to "i" plus
        # a combining dot, which is not a word character), so each word is folded.
        return set(text.lower().encode("ascii").translate(_ASCII_SPLIT).decode("ascii").split())
    return {t.casefold() for t in _TOKEN.findall(text)}


@dataclass(frozen=True, slots=True)
class Transaction:
    """One import transaction: exactly one accepted event (§5.4)."""

    seq: int
    tx_id: str
    committed_at: str          # the record's accepted_at, KIP form
    event_id: str
    event_type: str
    status: str                # "committed" | "no_effect"


class Nexus:
    """State of the one Space. Mutated only through :mod:`akrelay.kip.mapping`."""

    def __init__(self, space_id: str) -> None:
        self.space_id = space_id
        self.head = 0
        self.elements: dict[str, Element] = {}
        self.concept_by_key: dict[tuple[str, str], str] = {}
        self.prop_by_tuple: dict[tuple[str, str, Any], str] = {}
        self.assertions_by_prop: dict[str, list[str]] = {}
        self.assertions_by_event: dict[str, list[str]] = {}
        self.evidence_by_client_key: dict[str, str] = {}
        self.props_by_subject: dict[str, list[str]] = {}
        self.transactions: list[Transaction] = []
        self._tx_seqs: list[int] = []
        #: keyword index: kind -> term -> ordinals (positions in ``order``), ascending.
        self.index: dict[str, dict[str, array]] = {k: {} for k in SEARCH_KINDS}
        #: element ids in creation order; an ordinal is a position here.
        self.order: list[str] = []
        self._tx_ordinals: list[int] = []
        #: read-time visibility: ``withheld(event_id)`` is true for a record the operator
        #: withheld (agent-knowledge §7.1). Not state: never persisted, never imported.
        self.withheld: Any = None
        self.kind_counts: dict[str, int] = {}
        self.type_counts: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["withheld"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def is_withheld(self, event_id: str) -> bool:
        return self.withheld is not None and bool(self.withheld(event_id))

    def hidden(self, element: Element) -> bool:
        """Whether a read hides ``element``: it came from a withheld event (Agents never hide)."""
        if self.withheld is None or (isinstance(element, Concept) and element.type == "Agent"):
            return False
        return self.is_withheld(element.import_id)

    # ---- writes (used by the mapping) -------------------------------------------------

    def add(self, element: Element, text: str | None = None) -> Element:
        if element.id in self.elements:
            raise RuntimeError(f"element id {element.id} reused")
        self.elements[element.id] = element
        ordinal = len(self.order)
        self.order.append(element.id)
        kind = KIND_OF[type(element)]
        self.kind_counts[kind] = self.kind_counts.get(kind, 0) + 1
        if isinstance(element, Concept):
            self.type_counts[element.type] = self.type_counts.get(element.type, 0) + 1
        if text and kind in self.index:
            postings = self.index[kind]
            for term in tokens(text):
                entry = postings.get(term)
                if entry is None:
                    postings[term] = entry = array("I")
                entry.append(ordinal)
        return element

    def commit(self, tx: Transaction) -> None:
        self.transactions.append(tx)
        self._tx_seqs.append(tx.seq)
        self._tx_ordinals.append(len(self.order))
        self.head = tx.seq

    # ---- reads -----------------------------------------------------------------------

    def check_seq(self, seq: int | None) -> int:
        """The snapshot a read uses: ``None`` is the head; a later seq is not served."""
        if seq is None:
            return self.head
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise KipError("TypeMismatch", "AS OF SEQ takes a non-negative integer")
        if seq < 0:
            raise KipError("ConstraintViolation", "AS OF SEQ must not be negative")
        if seq > self.head:
            raise KipError("HistoricalSnapshotUnavailable",
                           f"space_seq {seq} is not committed yet (head is {self.head})",
                           details={"requested_seq": seq, "head_seq": self.head})
        return seq

    def get(self, element_id: str, seq: int | None = None) -> Element | None:
        """An element visible at ``seq`` (head by default)."""
        seq = self.head if seq is None else seq
        element = self.elements.get(element_id)
        if element is None or element.created_seq > seq:
            return None
        return element

    def ordinal_limit(self, seq: int) -> int:
        """How many elements exist at ``seq``: ordinals below this are visible."""
        i = bisect.bisect_right(self._tx_seqs, seq)
        return self._tx_ordinals[i - 1] if i else 0

    def transaction_at(self, seq: int) -> Transaction | None:
        """The last transaction committed at or before ``seq``."""
        i = bisect.bisect_right(self._tx_seqs, seq)
        return self.transactions[i - 1] if i else None

    def concept(self, type_name: str, key: str, seq: int | None = None) -> Concept | None:
        cid = self.concept_by_key.get((type_name, key))
        found = self.get(cid, seq) if cid else None
        return found if isinstance(found, Concept) else None

    def capsule(self, event_id: str, seq: int | None = None) -> Concept | None:
        return self.concept("KnowledgeCapsule", event_id, seq)

    def agent(self, actor: str, seq: int | None = None) -> Concept | None:
        return self.concept("Agent", actor, seq)

    def proposition(self, subject: str, predicate: str, obj: Any, seq: int | None = None) -> Proposition | None:
        pid = self.prop_by_tuple.get((subject, predicate, _object_key(obj)))
        found = self.get(pid, seq) if pid else None
        return found if isinstance(found, Proposition) else None

    def holds(self, capsule_event_id: str, seq: int | None = None) -> Proposition | None:
        """The ``(C, ak_holds, true)`` Proposition of a capsule."""
        cap = self.capsule(capsule_event_id, seq)
        return self.proposition(cap.id, "ak_holds", True, seq) if cap else None

    def assertions_on(self, proposition_id: str, seq: int | None = None) -> list[Assertion]:
        seq = self.head if seq is None else seq
        out = []
        for aid in self.assertions_by_prop.get(proposition_id, ()):
            a = self.elements[aid]
            if a.created_seq <= seq:
                out.append(a)  # type: ignore[arg-type]
        return out

    def propositions_about(self, concept_id: str, seq: int | None = None) -> list[Proposition]:
        seq = self.head if seq is None else seq
        return [p for pid in self.props_by_subject.get(concept_id, ())
                if (p := self.elements[pid]).created_seq <= seq]  # type: ignore[misc]

    def evidence_for_event(self, event_id: str, seq: int | None = None) -> Evidence | None:
        eid = self.evidence_by_client_key.get("ak:" + event_id)
        found = self.get(eid, seq) if eid else None
        return found if isinstance(found, Evidence) else None

    def iter_kind(self, kind: str, seq: int | None = None) -> Iterator[Element]:
        seq = self.head if seq is None else seq
        cls = {v: k for k, v in KIND_OF.items()}[kind]
        for element in self.elements.values():
            if isinstance(element, cls) and element.created_seq <= seq:
                yield element

    def counts(self, seq: int | None = None) -> dict[str, int]:
        """Element counts per kind (head: O(1); historical: a scan)."""
        if seq is None or seq == self.head:
            return {k: self.kind_counts.get(k, 0) for k in ("concept", "proposition", "assertion", "evidence", "activity")}
        out = dict.fromkeys(("concept", "proposition", "assertion", "evidence", "activity"), 0)
        tick = budget.current().tick
        for element in self.elements.values():
            tick()
            if element.created_seq <= seq:
                out[KIND_OF[type(element)]] += 1
        return out

    def type_count(self, type_name: str, seq: int | None = None) -> int:
        if seq is None or seq == self.head:
            return self.type_counts.get(type_name, 0)
        tick = budget.current().tick
        count = 0
        for e in self.elements.values():
            tick()
            if isinstance(e, Concept) and e.type == type_name and e.created_seq <= seq:
                count += 1
        return count

    # ---- wire views --------------------------------------------------------------------

    def view(self, element: Element, seq: int | None = None) -> dict[str, Any]:
        """The authorized element view (§6.2) at ``seq``; everything here is public."""
        seq = self.head if seq is None else seq
        kind = KIND_OF[type(element)]
        updated_at, updated_seq, version = element.created_at, element.created_seq, 1
        body: dict[str, Any] = {"id": element.id, "kind": kind, "space_id": self.space_id}
        if isinstance(element, Concept):
            hidden = element.type == "KnowledgeCapsule" and self.is_withheld(element.key)
            body.update(schema_ref=element.schema_ref, key=element.key,
                        name=element.key if hidden else element.name, canonical_id=None,
                        aliases=[], attributes={} if hidden else element.attributes,
                        structural={k: {"id": v} for k, v in element.structural.items()})
        elif isinstance(element, Proposition):
            body.update(subject={"id": element.subject}, predicate_ref=element.predicate_ref,
                        object=element.object)
        elif isinstance(element, Assertion):
            status = element.status_at(seq)
            for t_seq, _, at in element.transitions:
                if t_seq <= seq:
                    updated_at, updated_seq, version = at, t_seq, version + 1
            body.update(proposition={"id": element.proposition}, asserted_by={"id": element.asserted_by},
                        stance=element.stance, mode="imported", asserted_at=element.asserted_at,
                        evidence=element.evidence,
                        lifecycle={"status": status, "supersedes": [], "superseded_by": [],
                                   "retracted_at": element.retracted_at(seq)})
        elif isinstance(element, Evidence):
            payload = ({"mode": "withheld", "inline": None, "content_ref": None}
                       if self.is_withheld(element.import_id) else
                       {"mode": "inline", "inline": element.envelope, "content_ref": None})
            body.update(evidence_class=element.evidence_class, payload=payload,
                        content_digest=element.content_digest, media_type="application/json",
                        observed_at=element.observed_at, source=[{"id": element.source}], generated_by=None,
                        client_key=element.client_key,
                        lifecycle={"status": "active", "corrects": [], "corrected_by": []})
        elif isinstance(element, Activity):
            body.update(activity_class=element.activity_class, started_at=element.started_at,
                        ended_at=element.ended_at, inputs=[], outputs=[{"id": o} for o in element.outputs],
                        associated_actors=[{"id": a} for a in element.associated_actors], status="completed")
        body["governance"] = {"classification": "public", "authority_class": "descriptive"}
        body["retention"] = {"retention_class": "standard", "expires_at": None, "legal_hold": False}
        body["facets"] = getattr(element, "facets", {})
        body["_system"] = {
            "version": version, "created_at": element.created_at, "updated_at": updated_at,
            "created_tx": f"tx-{element.created_seq}", "updated_tx": f"tx-{updated_seq}",
            "space_seq": element.created_seq, "state": "active",
            "origin": {"principal_id": IMPORT_ORIGIN_PRINCIPAL, "channel": IMPORT_CHANNEL,
                       "import_id": element.import_id},
            "package": AK_PACKAGE_REF,
        }
        return body

    def fingerprint(self) -> Any:
        """A comparable value of the whole state (rebuild == incremental tests)."""
        return (self.space_id, self.head, self.transactions,
                sorted((eid, repr(e)) for eid, e in self.elements.items()),
                sorted(self.concept_by_key.items()), sorted(self.evidence_by_client_key.items()),
                {k: sorted((t, tuple(o)) for t, o in v.items()) for k, v in self.index.items()}, self.order)


def _object_key(obj: Any) -> Any:
    if isinstance(obj, dict):
        return ("ref", obj["id"])
    return ("lit", type(obj).__name__, obj)
