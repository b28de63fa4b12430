"""Relevance first: rank a turn's retrieved capsules by how well they answer the ask.

BM25 over the index finds candidates; this module decides which of them
answers. Each capsule is read as sentences (its statement, its basis, and the
summaries of assessments that support it); each sentence is scored against
the ask's topic words (weighted by how rare they are among the candidates),
their proximity, and the question's type (a duration for "how long", a
count for "how many", a cause for "why", the asked unit). Belief is a
qualifier of the answer, never the sort key: an accepted capsule that
shares a word does not outrank the unconfirmed one that answers.

A capsule far below the best one is cut; when even the best covers too little
of the ask, the turn declines rather than cite a word in common. In a
session, a short follow-up borrows the previous asks' words (at a lower
weight) and prefers capsules related to the previous answer and not yet cited.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from akrelay.knowql import extract
from akrelay.knowql.answer_types import Artifact, Detail
from akrelay.knowql.extract import Question

#: The best capsule must cover this share of the ask's (weighted) topic words, and at least
#: :data:`ANSWER_TERMS` of the ask's own words (all of them for a shorter ask), or the turn declines.
ANSWER_COVERAGE = 0.3
ANSWER_TERMS = 2
#: A capsule covering this share of the ask answers it even without the quantity its type asks for.
TYPE_WAIVER = 0.8
#: Capsules scoring below this fraction of the best one are not cited.
CUT_FRACTION = 0.45
#: Weight of a previous ask's words in a follow-up.
HISTORY_TERM_WEIGHT = 0.35
#: A follow-up prefers what the previous answer did not already lead with.
ALREADY_CITED = 0.85
RELATED_BONUS = 0.08
#: A follow-up is a short ask, or one that points back ("that", "it", "and ...").
FOLLOW_UP_TERMS = 3
_ANAPHORA = frozenset("that it this those these they them there its such one".split())
#: Words that may sit between a number and the counted noun ("three synchronous replicas").
_ADJECTIVAL = ("synchronous", "separate", "more", "new", "extra", "active", "parallel", "concurrent", "million",
               "thousand", "billion", "hundred", "different", "distinct", "independent", "redundant")
_SENTENCE_KINDS = ("statement", "basis", "assessment")


@dataclass
class Sentence:
    text: str
    origin: str               # statement, basis or assessment
    source: str               # the event ID it comes from (the capsule's publication, or the assessment)
    score: float = 0.0
    stems: extract.StemSet = field(default_factory=extract.StemSet)


@dataclass
class Ranked:
    artifact: Artifact
    relevance: float
    coverage: float
    matched: int              # how many of the ask's own topic words the capsule holds
    sentences: list[Sentence] = field(default_factory=list)

    @property
    def best(self) -> Sentence | None:
        return self.sentences[0] if self.sentences else None


@dataclass
class Ranking:
    question: Question
    terms: dict[str, float]           # stem -> weight
    ranked: list[Ranked]
    answered: bool                    # False: decline (nothing covers the ask)
    follow_up: bool


class EarlierTurn(Protocol):
    """What ranking reads of an earlier turn (``akrelay.knowql.models.HistoryEntry``, which imports this)."""

    @property
    def ask(self) -> str: ...

    @property
    def sources(self) -> Sequence[str]: ...


def is_follow_up(ask: str, history: Sequence[object]) -> bool:
    if not history:
        return False
    words = extract.tokens(ask)
    return (len(extract.content_stems(ask)) <= FOLLOW_UP_TERMS or bool(_ANAPHORA & set(words))
            or (bool(words) and words[0] in ("and", "also", "then", "so")))


def _sentences(artifact: Artifact, detail: Detail) -> list[Sentence]:
    out = [Sentence(s, "statement", artifact["source"]) for s in extract.sentences(artifact["text"])]
    out += [Sentence(s, "basis", artifact["source"]) for s in extract.sentences(detail.get("basis") or "")]
    for assessment in detail.get("assessments", ()):
        if assessment.get("verdict") == "supports":
            out += [Sentence(s, "assessment", assessment["source"]) for s in extract.sentences(assessment["text"])]
    return out


def _class_nouns(text: str) -> set[str]:
    """The class nouns ("temperatur", "percent", ...) that ``text``'s quantities satisfy."""
    found = extract.classes(text)
    return {noun for noun, cls in extract.CLASS_NOUNS.items() if cls in found} if found else set()


def _answers(top: Ranked, question: Question, own_terms: int, focus: Sequence[str],
             docs: Sequence[tuple[Artifact, list[Sentence], extract.StemSet]]) -> bool:
    """Whether the best capsule answers at all: enough of the ask covered, more than one word in common
    (a single shared word is not a reason to cite), the attribute a "what is the X of ..." ask names, and
    for a quantity question a quantity of its kind."""
    if not top.sentences or top.coverage < ANSWER_COVERAGE or top.matched < min(ANSWER_TERMS, own_terms):
        return False
    vocabulary = next((d[2] for d in docs if d[0] is top.artifact), extract.StemSet())
    if focus and not any(extract.matched(t, vocabulary) for t in focus):
        return False
    return top.coverage >= TYPE_WAIVER or _typed(top, question)


def _typed(entry: Ranked, question: Question) -> bool:
    """Whether a capsule can answer a quantity question at all: one of its sentences states such a quantity."""
    if question.kind not in ("duration", "count", "quantity"):
        return True
    for sentence in entry.sentences:
        found = extract.answer_quantity(sentence.text, question)
        if found is None:
            continue
        if question.kind == "count" and question.counted:
            # "How many GPUs": a number of GPUs, not "65% utilisation" or "100 million documents".
            stems = extract.StemSet(extract.stem(w) for w in extract.tokens(sentence.text))
            if question.counts(found.noun) or (found.unit_class is None and any(
                    extract.matched(c, stems) for c in question.counted) and found.noun in (None, *_ADJECTIVAL)):
                return True
            continue
        if question.unit_class is None or found.unit_class == question.unit_class:
            return True
    return False


def _type_bonus(text: str, question: Question) -> float:
    if question.kind in ("duration", "count", "quantity"):
        found = extract.answer_quantity(text, question)
        if found is None:
            return 0.0
        if question.unit_class is not None and found.unit_class == question.unit_class:
            return 0.35
        if question.kind == "count" and question.counts(found.noun):
            return 0.35
        return 0.15
    if question.kind == "why":
        return 0.2 if extract.causal(text) else 0.0
    return 0.0


def _proximity(words: Sequence[str], terms: extract.StemSet) -> float:
    """A small bonus when the matched words sit close together (within 8 words)."""
    positions = [i for i, w in enumerate(words) if extract.stem(w) in terms]
    if len(positions) < 2:
        return 0.0
    return 0.05 if positions[-1] - positions[0] <= 8 else 0.0


def _related(source: str, detail: Detail, previous: dict[str, Detail]) -> float:
    """How close a capsule is to the previous answer's: a relation either way, then shared tags or context."""
    bonus = 0.0
    for prev_source, prev in previous.items():
        if source in prev.get("related", ()) or prev_source in detail.get("related", ()):
            return RELATED_BONUS
        if set(prev.get("tags", ())) & set(detail.get("tags", ())) or (
                prev.get("scope") and prev.get("scope") == detail.get("scope")):
            bonus = RELATED_BONUS / 2
    return bonus


def rank(ask: str, history: Sequence[EarlierTurn], artifacts: Sequence[Artifact],
         details: dict[str, Detail], previous: dict[str, Detail] | None = None) -> Ranking:
    """Rank ``artifacts`` (the retrieval's, BM25 order) for ``ask``.

    ``history`` holds the session's :class:`~akrelay.knowql.models.HistoryEntry` items, oldest first;
    ``previous`` the details of the capsules the last answer cited.
    """
    question = extract.question_type(ask)
    follow_up = is_follow_up(ask, history)
    own = extract.content_stems(ask)
    borrowed: list[str] = []
    if follow_up:
        for entry in reversed(history[-2:]):
            borrowed += [t for t in extract.content_stems(entry.ask) if t not in own and t not in borrowed]
    docs: list[tuple[Artifact, list[Sentence], extract.StemSet]] = []
    for artifact in artifacts:
        detail = details.get(artifact["source"], {})
        sents = _sentences(artifact, detail)
        title = [extract.stem(w) for w in extract.tokens(artifact["name"])]
        # What a capsule says (title, statement, basis); an assessor's words do not make it cover the ask.
        vocabulary = extract.StemSet(title)
        for sentence in sents:
            sentence.stems = extract.StemSet([*(extract.stem(w) for w in extract.tokens(sentence.text)),
                                              *_class_nouns(sentence.text)])
            if sentence.origin != "assessment":
                vocabulary.exact |= sentence.stems.exact
        docs.append((artifact, sents, vocabulary))
    idf = extract.weights(own + borrowed, [d[2] for d in docs])
    terms = {t: idf[t] for t in own}
    terms.update({t: idf[t] * HISTORY_TERM_WEIGHT for t in borrowed})
    total = sum(terms.values()) or 1.0
    term_set = extract.StemSet(terms)
    own_total = sum(idf[t] for t in own) or 1.0
    best_bm25 = max((a["score"] for a in artifacts), default=0.0) or 1.0
    led = set(history[-1].sources[:1]) if follow_up and history else set()
    ranked: list[Ranked] = []
    for artifact, sents, vocabulary in docs:
        title_stems = extract.StemSet(extract.stem(w) for w in extract.tokens(artifact["name"]))
        coverage = sum(w for t, w in terms.items() if extract.matched(t, vocabulary)) / total
        own_matched = [t for t in own if extract.matched(t, vocabulary)]
        own_coverage = sum(idf[t] for t in own_matched) / own_total if own else 0.0
        for sentence in sents:
            words = extract.tokens(sentence.text)
            stems = sentence.stems
            met = [t for t in terms if extract.matched(t, stems)]
            hit = sum(terms[t] for t in met)
            # Title words count half towards a sentence: the title frames every sentence of the capsule.
            framed = sum(w for t, w in terms.items() if not extract.matched(t, stems) and extract.matched(t, title_stems))
            sentence.score = (hit + 0.5 * framed) / total + _type_bonus(sentence.text, question) \
                + (_proximity(words, term_set) if len(met) > 1 else 0.0) - (0.05 if sentence.origin != "statement" else 0.0)
        sents.sort(key=lambda s: (-s.score, _SENTENCE_KINDS.index(s.origin)))
        best = sents[0].score if sents else 0.0
        relevance = 0.55 * coverage + 0.35 * best + 0.10 * (artifact["score"] / best_bm25)
        if follow_up:
            if artifact["source"] in led:
                relevance *= ALREADY_CITED
            else:
                relevance += _related(artifact["source"], details.get(artifact["source"], {}), previous or {})
        # A follow-up's own words must be met: borrowed words alone only say "same topic".
        if follow_up and own and own_coverage == 0.0:
            relevance *= 0.5
        ranked.append(Ranked(artifact, round(relevance, 6), coverage, len(own_matched), sents))
    ranked.sort(key=lambda r: (-r.relevance, r.artifact.get("rank", 0)))
    answered = bool(ranked) and _answers(ranked[0], question, len(own), extract.focus(ask), docs)
    if ranked:
        floor = ranked[0].relevance * CUT_FRACTION
        ranked = [r for r in ranked if r.relevance >= floor and r.coverage > 0]
    return Ranking(question, terms, ranked, answered, follow_up)
