"""The nexus: one MemorySpace holding the imported cognition of one relay.

Storage design: every element is immutable and tagged with the ``space_seq`` that
created it; Assertion lifecycle moves are appended as ``(seq, status, at)``
transitions. A read at ``AS OF SEQ s`` therefore filters by ``created_seq <= s``
and replays transitions up to ``s``: historical reads cost nothing extra and never
need a second copy. The state is a deterministic function of the acceptance log
(``space_seq`` == acceptance ``seq``): rebuilding from the log gives an equal nexus.

:class:`NexusBase` is the storage interface every reader (projection, META, KQL,
search) and the import mapping use; nothing outside a backend touches its
containers. Two backends implement it and pass one contract suite
(``tests/kip/test_nexus_contract.py``): :class:`Nexus`, in memory (tests, embedded
use, a relay without a data directory), and
:class:`akrelay.kip.nexus_sqlite.SqliteNexus`, one SQLite file per data directory
written by one importer and read by every worker.
"""

from __future__ import annotations

import bisect
import contextlib
import re
import unicodedata
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, cast

from akrelay.jsontypes import JSON, JSONObject
from akrelay.kip import budget
from akrelay.kip.elements import (
    IMPORT_CHANNEL, IMPORT_ORIGIN_PRINCIPAL, KIND_OF, Activity, Assertion, Concept, Element, Evidence, Proposition,
)
from akrelay.kip.errors import KipError
from akrelay.kip.space import AK_PACKAGE_REF

_TOKEN = re.compile(r"\w+", re.UNICODE)
SEARCH_KINDS = ("concept", "proposition", "assertion", "evidence")
ELEMENT_KINDS = ("concept", "proposition", "assertion", "evidence", "activity")


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


def concept_tags(element: Concept) -> list[str]:
    """The tag-index entries of a Concept: its ``attributes.tags`` items, NFC, each once.

    A string item is entered as itself; a reference item (``{"id": ...}``) by its id, which
    is what a string compares equal to in a KQL pattern (§9.6). Other items no string equals.
    """
    items = element.attributes.get("tags") if isinstance(element.attributes, dict) else None
    if not isinstance(items, list):
        return []
    out: dict[str, None] = {}
    for item in items:
        if isinstance(item, str):
            out[nfc(item)] = None
        elif isinstance(item, dict) and len(item) == 1 and isinstance(item.get("id"), str):
            out[nfc(item["id"])] = None
    return list(out)


def object_key(obj: object) -> str:
    """The lookup key of a Proposition object: a reference by id, a literal by type and value."""
    if isinstance(obj, dict):
        return f"r:{obj['id']}"
    return f"l:{type(obj).__name__}:{obj!r}"


class NexusBase:
    """The nexus storage interface: snapshot reads by ``seq``, appends by the mapping.

    Reads take ``seq`` (``None``: the head) and see only what existed then. Lookups
    return elements in creation order (``assertions_by``: id order). A backend implements the abstract methods;
    the derived lookups, ``check_seq`` and the wire ``view`` live here once.
    """

    space_id: str
    #: read-time visibility: ``withheld(event_id)`` is true for a record the operator
    #: withheld (agent-knowledge §7.1). Not state: never persisted, never imported.
    withheld: Callable[[str], bool] | None = None

    # ---- snapshot scope ------------------------------------------------------------------

    def reading(self) -> contextlib.AbstractContextManager[object]:
        """One consistent snapshot for a whole request (re-entrant)."""
        return contextlib.nullcontext()

    def batch(self) -> contextlib.AbstractContextManager[object]:
        """One durable write unit: imports inside it commit together, with the head (re-entrant)."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Release what the backend holds open."""

    # ---- abstract reads ------------------------------------------------------------------

    @property
    def head(self) -> int:
        raise NotImplementedError

    def get(self, element_id: str, seq: int | None = None) -> Element | None:
        raise NotImplementedError

    def concept(self, type_name: str, key: str, seq: int | None = None) -> Concept | None:
        raise NotImplementedError

    def concepts_named(self, type_name: str, name: str, seq: int | None = None) -> list[Concept]:
        """Concepts of ``type_name`` whose name equals ``name`` after NFC normalisation."""
        raise NotImplementedError

    def proposition(self, subject: str, predicate: str, obj: object, seq: int | None = None) -> Proposition | None:
        raise NotImplementedError

    def propositions_about(self, concept_id: str, seq: int | None = None) -> list[Proposition]:
        raise NotImplementedError

    def propositions_to(self, object_id: str, seq: int | None = None) -> list[Proposition]:
        """Propositions whose object references ``object_id``."""
        raise NotImplementedError

    def propositions_with(self, predicate: str, seq: int | None = None) -> Iterator[Proposition]:
        raise NotImplementedError

    def assertions_on(self, proposition_id: str, seq: int | None = None) -> list[Assertion]:
        raise NotImplementedError

    def assertions_by(self, agent_id: str, seq: int | None = None) -> Iterator[Assertion]:
        """Assertions whose ``asserted_by`` is the Agent Concept ``agent_id``, in ascending id
        order, not creation order: KQL's row order without ORDER BY, so a page of an Agent's
        (possibly thousands of) Assertions can stop early; one index serves every use."""
        raise NotImplementedError

    def assertions_from_event(self, event_id: str) -> list[Assertion]:
        """Assertions derived from one event, at the head (the mapping's retract)."""
        raise NotImplementedError

    def evidence_by_key(self, client_key: str, seq: int | None = None) -> Evidence | None:
        raise NotImplementedError

    def concepts_of_type(self, type_name: str, seq: int | None = None) -> Iterator[Concept]:
        raise NotImplementedError

    def of_kind(self, kind: str, seq: int | None = None) -> Iterator[Element]:
        raise NotImplementedError

    def structural_sources(self, field: str, target: str | None, seq: int | None = None) -> Iterator[Concept]:
        """Concepts with structural ``field`` (pointing at ``target`` when given)."""
        raise NotImplementedError

    def concepts_tagged(self, tags: Iterable[str], seq: int | None = None, *,
                        structural: tuple[str, str] | None = None) -> Iterator[Concept]:
        """Concepts whose ``attributes.tags`` hold every one of ``tags`` (compared after NFC
        normalisation) and, with ``structural=(field, target)``, that edge too; creation order.

        An index intersection driven by the smallest of the postings, so a query planner can
        hand every indexed constraint it knows to one call (see ``kql.evaluate``).
        """
        raise NotImplementedError

    def transaction_at(self, seq: int) -> Transaction | None:
        """The last transaction committed at or before ``seq``."""
        raise NotImplementedError

    def transactions(self) -> list[Transaction]:
        """Every transaction in seq order (tests, fingerprints; a scan)."""
        raise NotImplementedError

    def seq_at_time(self, stamp: str, head: int) -> int:
        """The last seq at or below ``head`` whose transaction committed at or before ``stamp``."""
        raise NotImplementedError

    def counts(self, seq: int | None = None) -> dict[str, int]:
        raise NotImplementedError

    def type_count(self, type_name: str, seq: int | None = None) -> int:
        raise NotImplementedError

    def term_matches(self, kind: str, terms: Iterable[str], seq: int) -> Counter[int]:
        """Keyword index: ordinal -> how many of ``terms`` it matches, ordinals visible at ``seq``."""
        raise NotImplementedError

    def term_buckets(self, kind: str, terms: Iterable[str], seq: int) -> Iterator[tuple[int, Iterable[int]]]:
        """Keyword candidates by rank: ``(matched term count, ordinals ascending)``, most matched first.

        A consumer that stops early (a page of hits) need not pay for the lower buckets;
        this default computes them all from :meth:`term_matches`.
        """
        buckets: dict[int, list[int]] = {}
        tick = budget.current().tick
        for ordinal, matched in self.term_matches(kind, terms, seq).items():
            tick()
            buckets.setdefault(matched, []).append(ordinal)
        for matched in sorted(buckets, reverse=True):
            yield matched, sorted(buckets[matched])

    def at_ordinal(self, ordinal: int) -> Element:
        """The element created ``ordinal``-th (0-based, creation order)."""
        raise NotImplementedError

    def all_elements(self) -> Iterator[Element]:
        """Every element in creation order (a scan: tests and fingerprints)."""
        raise NotImplementedError

    def postings(self, kind: str) -> dict[str, list[int]]:
        """The whole keyword index of ``kind`` (a scan: tests and fingerprints)."""
        raise NotImplementedError

    # ---- abstract writes (the mapping) ---------------------------------------------------

    def add(self, element: Element, text: str | None = None) -> Element:
        raise NotImplementedError

    def add_transition(self, assertion: Assertion, seq: int, status: str, at: str) -> None:
        """Append a lifecycle move to ``assertion`` (the only change an element ever sees)."""
        raise NotImplementedError

    def commit(self, tx: Transaction) -> None:
        raise NotImplementedError

    # ---- derived reads --------------------------------------------------------------------

    def is_withheld(self, event_id: str) -> bool:
        return self.withheld is not None and bool(self.withheld(event_id))

    def hidden(self, element: Element) -> bool:
        """Whether a read hides ``element``: it came from a withheld event (Agents never hide)."""
        if self.withheld is None or (isinstance(element, Concept) and element.type == "Agent"):
            return False
        return self.is_withheld(element.import_id)

    def check_seq(self, seq: int | None) -> int:
        """The snapshot a read uses: ``None`` is the head; a later seq is not served."""
        head = self.head
        if seq is None:
            return head
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise KipError("TypeMismatch", "AS OF SEQ takes a non-negative integer")
        if seq < 0:
            raise KipError("ConstraintViolation", "AS OF SEQ must not be negative")
        if seq > head:
            raise KipError("HistoricalSnapshotUnavailable",
                           f"space_seq {seq} is not committed yet (head is {head})",
                           details={"requested_seq": seq, "head_seq": head})
        return seq

    def capsule(self, event_id: str, seq: int | None = None) -> Concept | None:
        return self.concept("KnowledgeCapsule", event_id, seq)

    def agent(self, actor: str, seq: int | None = None) -> Concept | None:
        return self.concept("Agent", actor, seq)

    def holds(self, capsule_event_id: str, seq: int | None = None) -> Proposition | None:
        """The ``(C, ak_holds, true)`` Proposition of a capsule."""
        cap = self.capsule(capsule_event_id, seq)
        return self.proposition(cap.id, "ak_holds", True, seq) if cap else None

    def evidence_for_event(self, event_id: str, seq: int | None = None) -> Evidence | None:
        return self.evidence_by_key("ak:" + event_id, seq)

    # ---- wire views --------------------------------------------------------------------

    def view(self, element: Element, seq: int | None = None) -> JSONObject:
        """The authorized element view (§6.2) at ``seq``; everything here is public."""
        seq = self.head if seq is None else seq
        kind = KIND_OF[type(element)]
        updated_at, updated_seq, version = element.created_at, element.created_seq, 1
        body: JSONObject = {"id": element.id, "kind": kind, "space_id": self.space_id}
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
                        # {id, role} string pairs: JSON already (the cast only widens list[dict[str, str]])
                        evidence=cast(JSON, element.evidence),
                        lifecycle={"status": status, "supersedes": [], "superseded_by": [],
                                   "retracted_at": element.retracted_at(seq)})
        elif isinstance(element, Evidence):
            payload: JSONObject = ({"mode": "withheld", "inline": None, "content_ref": None}
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

    def fingerprint(self) -> object:
        """A comparable value of the whole state, the same for equal nexuses of any backend."""
        return (self.space_id, self.head, self.transactions(),
                [repr(e) for e in self.all_elements()],
                {k: sorted((t, tuple(o)) for t, o in self.postings(k).items()) for k in SEARCH_KINDS})


class Nexus(NexusBase):
    """The in-memory backend: dicts and posting arrays. Mutated only through :mod:`akrelay.kip.mapping`."""

    def __init__(self, space_id: str) -> None:
        self.space_id = space_id
        self._head = 0
        self.elements: dict[str, Element] = {}
        self._concept_by_key: dict[tuple[str, str], str] = {}
        self._concept_by_name: dict[tuple[str, str], list[str]] = {}
        self._prop_by_tuple: dict[tuple[str, str, str], str] = {}
        self._props_by_subject: dict[str, list[str]] = {}
        self._props_by_object: dict[str, list[str]] = {}
        self._props_by_predicate: dict[str, list[str]] = {}
        self._assertions_by_prop: dict[str, list[str]] = {}
        self._assertions_by_event: dict[str, list[str]] = {}
        self._assertions_by_author: dict[str, list[str]] = {}
        self._evidence_by_key: dict[str, str] = {}
        self._by_type: dict[str, list[str]] = {}
        self._by_kind: dict[str, list[str]] = {k: [] for k in ELEMENT_KINDS}
        self._struct_sources: dict[tuple[str, str], list[str]] = {}
        self._struct_by_field: dict[str, list[str]] = {}
        self._by_tag: dict[str, list[str]] = {}
        self._transactions: list[Transaction] = []
        self._tx_seqs: list[int] = []
        #: keyword index: kind -> term -> ordinals (positions in ``order``), ascending.
        self.index: dict[str, dict[str, array[int]]] = {k: {} for k in SEARCH_KINDS}
        #: element ids in creation order; an ordinal is a position here.
        self.order: list[str] = []
        self._tx_ordinals: list[int] = []
        self.kind_counts: dict[str, int] = {}
        self.type_counts: dict[str, int] = {}
        self.withheld = None

    # ---- writes (used by the mapping) -------------------------------------------------

    def add(self, element: Element, text: str | None = None) -> Element:
        eid = element.id
        if eid in self.elements:
            raise RuntimeError(f"element id {eid} reused")
        self.elements[eid] = element
        ordinal = len(self.order)
        self.order.append(eid)
        kind = KIND_OF[type(element)]
        self.kind_counts[kind] = self.kind_counts.get(kind, 0) + 1
        self._by_kind[kind].append(eid)
        if isinstance(element, Concept):
            self.type_counts[element.type] = self.type_counts.get(element.type, 0) + 1
            self._concept_by_key[(element.type, element.key)] = eid
            self._concept_by_name.setdefault((element.type, nfc(element.name)), []).append(eid)
            self._by_type.setdefault(element.type, []).append(eid)
            for field, target in element.structural.items():
                self._struct_sources.setdefault((field, target), []).append(eid)
                self._struct_by_field.setdefault(field, []).append(eid)
            for tag in concept_tags(element):
                self._by_tag.setdefault(tag, []).append(eid)
        elif isinstance(element, Proposition):
            self._prop_by_tuple[(element.subject, element.predicate, object_key(element.object))] = eid
            self._props_by_subject.setdefault(element.subject, []).append(eid)
            self._props_by_predicate.setdefault(element.predicate, []).append(eid)
            if isinstance(element.object, dict):
                self._props_by_object.setdefault(element.object["id"], []).append(eid)
        elif isinstance(element, Assertion):
            self._assertions_by_prop.setdefault(element.proposition, []).append(eid)
            self._assertions_by_event.setdefault(element.import_id, []).append(eid)
            self._assertions_by_author.setdefault(element.asserted_by, []).append(eid)
        elif isinstance(element, Evidence):
            self._evidence_by_key[element.client_key] = eid
        if text and kind in self.index:
            postings = self.index[kind]
            for term in tokens(text):
                entry = postings.get(term)
                if entry is None:
                    postings[term] = entry = array("I")
                entry.append(ordinal)
        return element

    def add_transition(self, assertion: Assertion, seq: int, status: str, at: str) -> None:
        self.elements[assertion.id].transitions.append((seq, status, at))  # type: ignore[union-attr]

    def commit(self, tx: Transaction) -> None:
        self._transactions.append(tx)
        self._tx_seqs.append(tx.seq)
        self._tx_ordinals.append(len(self.order))
        self._head = tx.seq

    # ---- reads -----------------------------------------------------------------------

    @property
    def head(self) -> int:
        return self._head

    def get(self, element_id: str, seq: int | None = None) -> Element | None:
        """An element visible at ``seq`` (head by default)."""
        seq = self._head if seq is None else seq
        element = self.elements.get(element_id)
        if element is None or element.created_seq > seq:
            return None
        return element

    # each caller's ids come from an index of one kind (Concepts, Propositions, ...), the type it returns:
    # Element would need a cast per lookup, and a checked narrowing a test per element
    def _visible(self, ids: Iterable[str], seq: int | None) -> Iterator[Any]:  # Any: the kind of the caller's index
        seq = self._head if seq is None else seq
        elements = self.elements
        for eid in ids:
            element = elements[eid]
            if element.created_seq <= seq:
                yield element

    def ordinal_limit(self, seq: int) -> int:
        """How many elements exist at ``seq``: ordinals below this are visible."""
        i = bisect.bisect_right(self._tx_seqs, seq)
        return self._tx_ordinals[i - 1] if i else 0

    def transaction_at(self, seq: int) -> Transaction | None:
        i = bisect.bisect_right(self._tx_seqs, seq)
        return self._transactions[i - 1] if i else None

    def transactions(self) -> list[Transaction]:
        return list(self._transactions)

    def seq_at_time(self, stamp: str, head: int) -> int:
        best = 0
        tick = budget.current().tick
        for tx in self._transactions:
            tick()
            if tx.seq > head:
                break
            if tx.committed_at <= stamp:
                best = tx.seq
        return best

    def concept(self, type_name: str, key: str, seq: int | None = None) -> Concept | None:
        cid = self._concept_by_key.get((type_name, key))
        found = self.get(cid, seq) if cid else None
        return found if isinstance(found, Concept) else None

    def concepts_named(self, type_name: str, name: str, seq: int | None = None) -> list[Concept]:
        return list(self._visible(self._concept_by_name.get((type_name, nfc(name)), ()), seq))

    def proposition(self, subject: str, predicate: str, obj: object, seq: int | None = None) -> Proposition | None:
        pid = self._prop_by_tuple.get((subject, predicate, object_key(obj)))
        found = self.get(pid, seq) if pid else None
        return found if isinstance(found, Proposition) else None

    def propositions_about(self, concept_id: str, seq: int | None = None) -> list[Proposition]:
        return list(self._visible(self._props_by_subject.get(concept_id, ()), seq))

    def propositions_to(self, object_id: str, seq: int | None = None) -> list[Proposition]:
        return list(self._visible(self._props_by_object.get(object_id, ()), seq))

    def propositions_with(self, predicate: str, seq: int | None = None) -> Iterator[Proposition]:
        return self._visible(self._props_by_predicate.get(predicate, ()), seq)

    def assertions_on(self, proposition_id: str, seq: int | None = None) -> list[Assertion]:
        return list(self._visible(self._assertions_by_prop.get(proposition_id, ()), seq))

    def assertions_by(self, agent_id: str, seq: int | None = None) -> Iterator[Assertion]:
        return self._visible(sorted(self._assertions_by_author.get(agent_id, ())), seq)

    def assertions_from_event(self, event_id: str) -> list[Assertion]:
        return list(self._visible(self._assertions_by_event.get(event_id, ()), None))

    def evidence_by_key(self, client_key: str, seq: int | None = None) -> Evidence | None:
        eid = self._evidence_by_key.get(client_key)
        found = self.get(eid, seq) if eid else None
        return found if isinstance(found, Evidence) else None

    def concepts_of_type(self, type_name: str, seq: int | None = None) -> Iterator[Concept]:
        return self._visible(self._by_type.get(type_name, ()), seq)

    def of_kind(self, kind: str, seq: int | None = None) -> Iterator[Element]:
        return self._visible(self._by_kind[kind], seq)

    def structural_sources(self, field: str, target: str | None, seq: int | None = None) -> Iterator[Concept]:
        ids = self._struct_by_field.get(field, ()) if target is None else self._struct_sources.get((field, target), ())
        return self._visible(ids, seq)

    def concepts_tagged(self, tags: Iterable[str], seq: int | None = None, *,
                        structural: tuple[str, str] | None = None) -> Iterator[Concept]:
        wanted = list(dict.fromkeys(nfc(t) for t in tags))
        postings = [self._by_tag.get(t, []) for t in wanted]
        if structural is not None:
            postings.append(self._struct_sources.get(structural, []))
        if not postings:
            raise ValueError("concepts_tagged needs a tag or an edge")
        driver = min(postings, key=len)  # the others are checked on the element itself
        field, target = structural if structural is not None else (None, None)
        elements = self.elements

        def matches(eid: str) -> bool:
            element = elements[eid]
            if field is not None and element.structural.get(field) != target:  # type: ignore[union-attr]
                return False
            have = concept_tags(element)  # type: ignore[arg-type]
            return all(t in have for t in wanted)

        return self._visible((eid for eid in driver if matches(eid)), seq)

    def counts(self, seq: int | None = None) -> dict[str, int]:
        """Element counts per kind (head: O(1); historical: a scan)."""
        if seq is None or seq == self._head:
            return {k: self.kind_counts.get(k, 0) for k in ELEMENT_KINDS}
        out = dict.fromkeys(ELEMENT_KINDS, 0)
        tick = budget.current().tick
        for element in self.elements.values():
            tick()
            if element.created_seq <= seq:
                out[KIND_OF[type(element)]] += 1
        return out

    def type_count(self, type_name: str, seq: int | None = None) -> int:
        if seq is None or seq == self._head:
            return self.type_counts.get(type_name, 0)
        tick = budget.current().tick
        count = 0
        for _ in self.concepts_of_type(type_name, seq):
            tick()
            count += 1
        return count

    def term_matches(self, kind: str, terms: Iterable[str], seq: int) -> Counter[int]:
        postings = self.index[kind]
        counter: Counter[int] = Counter()
        for term in terms:
            entry = postings.get(term)
            if entry is not None:
                counter.update(entry)
        cutoff = self.ordinal_limit(seq)
        if len(self.order) > cutoff:
            counter = Counter({o: n for o, n in counter.items() if o < cutoff})
        return counter

    def at_ordinal(self, ordinal: int) -> Element:
        return self.elements[self.order[ordinal]]

    def all_elements(self) -> Iterator[Element]:
        return iter(self.elements.values())

    def postings(self, kind: str) -> dict[str, list[int]]:
        return {t: list(o) for t, o in self.index[kind].items()}


def nfc(text: str) -> str:
    """Names compare after NFC normalisation (§9.6); ASCII is already normal."""
    return text if text.isascii() else unicodedata.normalize("NFC", text)
