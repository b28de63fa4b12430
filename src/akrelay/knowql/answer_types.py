"""The documents a turn's answer is built from: retrieved artifacts and passages, capsule details, facts.

:mod:`.retrieval` builds the artifacts (one per capsule, with its BELIEF projection), the chunks
(the capsule's publication and its assessments, as passages) and the details (what the composer
reads beyond the statement); :mod:`.rank` and :mod:`.compose` read them by key, and the retrieval
envelope and the citations copy them onto the wire. They are typed here, below those modules, so
that :mod:`.shape` can name the :class:`Fact` it binds without importing the composer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NotRequired, TypedDict

if TYPE_CHECKING:  # annotations only: extract is loaded by the composer, not by request parsing
    from akrelay.knowql.extract import Quantity


class Belief(TypedDict):
    """A capsule's BELIEF projection as an artifact carries it (seed 000 §8.2 plus akrelay members)."""

    status: str               # accepted, contested, uncertain, insufficient, rejected
    leading: str
    supporting: int           # assessments (not the author's publication) among the support
    rejecting: int            # assessments among the opposition
    reasons: list[str]        # the projection's uncertainty reasons ("uncorroborated", ...)
    policy: str
    snapshot_seq: int


class Artifact(TypedDict):
    """One retrieved capsule (a ``KnowledgeCapsule`` of the retrieval envelope)."""

    id: str                   # the nexus concept ID
    source: str               # the capsule's publish event ID
    type: str
    name: str                 # the capsule's title
    kind: str
    text: str                 # its statement
    context: list[str]        # the scope's context slugs that keep it
    score: float              # its best hit's score
    seq: int
    url: str
    belief: Belief
    rank: NotRequired[int]    # 1-based, set once the artifact is kept


class Chunk(TypedDict):
    """One retrieved passage: a capsule's publication or an assessment of it."""

    id: str
    source: str               # the event ID of the passage's record
    kind: str                 # capsule or assessment
    capsule: str              # the publish event ID of the capsule it belongs to
    context: list[str]
    title: str
    text: str                 # the statement, or the assessment's summary
    score: float
    seq: int
    url: str
    verdict: NotRequired[str]  # an assessment's
    rank: NotRequired[int]    # 1-based over all the turn's chunks


class AssessmentNote(TypedDict):
    """An assessment among the hits, as a capsule's detail lists it."""

    source: str
    verdict: str | None
    text: str


class Detail(TypedDict, total=False):
    """What the composer reads of a capsule beyond its statement (not part of the retrieval envelope).

    Built with every member; partial because a capsule without one is read as the empty detail.
    """

    basis: str
    assessments: list[AssessmentNote]   # supporting and challenging assessments among the hits
    related: list[str]                  # relation targets
    tags: list[str]
    scope: str | None                   # the capsule's context scope


@dataclass
class Fact:
    """A sentence that answers the ask, what it says, and where it comes from (for ``shape``)."""

    sentence: str
    citation: int             # the [n] of its capsule
    source: str               # the capsule's publish event ID
    status: str               # the capsule's BELIEF status
    quantity: Quantity | None = None
    yes: bool | None = None   # the yes/no answer, when the ask is a yes/no question and belief settles it
    note: str = ""            # for a rejected claim (no sentence stated as fact): the lead line that reports it


__all__ = ["Artifact", "AssessmentNote", "Belief", "Chunk", "Detail", "Fact"]
