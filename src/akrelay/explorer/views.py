"""The explorer's pages as pure functions of plain data (acceptance records as dicts, projections).

Nothing here does I/O, so each page can be rendered and checked in isolation;
:mod:`akrelay.explorer.routes` gathers the data.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

from akrelay.explorer.html import (BASE, agent_url, capsule_url, definition, h, items, link, page, search_url, short,
                                   when)
from akrelay.observability.status import RelayStatus

#: The §9.3 filters the search page offers, in the API's own names.
SEARCH_FILTERS = ("actor", "type", "kind", "tag", "language", "verdict", "relation", "target", "profile")


#: A JSON document as the pages read it (an acceptance record, a projection, a KnowQL Query document):
#: each member is narrowed where it is read, and one of another kind reads as absent.
Document = Mapping[str, object]


def as_object(value: object) -> Document:
    """A member read as an object (anything else reads as an empty one)."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> Sequence[object]:
    """A member read as an array (anything else reads as an empty one)."""
    return value if isinstance(value, list) else ()


def as_text(value: object) -> str:
    """A member read as text (anything else reads as the empty string)."""
    return value if isinstance(value, str) else ""


def event_of(record: Document) -> Document:
    return as_object(as_object(record["envelope"])["event"])


def event_id(record: Document) -> str:
    """The record's event ID (its envelope's ``hash``)."""
    return as_text(as_object(record["envelope"])["hash"])


def _title(record: Document) -> str:
    event = event_of(record)
    payload = as_object(event.get("payload"))
    if event.get("type") == "knowledge.publish":
        return str(payload.get("title", ""))
    if event.get("type") == "knowledge.assess":
        return f"assessment: {payload.get('verdict', '')}"
    return f"{event.get('type', 'event')}"


def record_row(record: Document) -> str:
    """One line of a list: title link, kind, author and time."""
    event = event_of(record)
    payload = as_object(event.get("payload"))
    eid = event_id(record)
    actor = as_text(event.get("actor"))
    kind = payload.get("kind") or payload.get("verdict") or event.get("type", "")
    return (f'{link(capsule_url(eid), _title(record) or eid, "title")} <span class="tag">{h(kind)}</span> '
            f'<span class="muted">by {link(agent_url(actor), short(actor))} · '
            f'{when(event.get("created_at"))} · seq {h(record.get("seq"))}</span>')


def recent_page(records: Sequence[Document], checkpoint: int) -> str:
    body = (f"<h1>Recent capsules</h1><p class=\"muted\">The latest accepted capsules; checkpoint {h(checkpoint)}.</p>"
            + items(record_row(r) for r in records))
    return page("Recent", body)


def _context(ctx: object) -> str:
    if not isinstance(ctx, Mapping):
        return '<p class="muted">none</p>'
    rows = [("scope", h(ctx.get("scope", "")))]
    for name in ("conditions", "limitations"):
        rows.append((name, items(h(v) for v in as_list(ctx.get(name)))))
    return definition(rows)


def _evidence(evidence: object) -> str:
    out = []
    for e in map(as_object, as_list(evidence)):
        url = e.get("url", "")
        target = link(url, url) if isinstance(url, str) and url.startswith("https://") else h(url)
        extra = " · ".join(h(e[k]) for k in ("role", "media_type", "digest") if e.get(k))
        out.append(f"{target} {h(e.get('description', ''))} <span class=\"muted\">{extra}</span>")
    return items(out)


def _reproduction(rep: object) -> str:
    if not isinstance(rep, Mapping):
        return '<p class="muted">none</p>'
    steps = "".join(f"<li>{h(s)}</li>" for s in as_list(rep.get("steps")))
    rows = [(k, h(rep[k])) for k in ("environment", "expected", "observed") if rep.get(k) is not None]
    return (definition(rows) if rows else "") + (f"<ol>{steps}</ol>" if steps else "")


#: Where each assertion of a ledger came from: assertion id -> (the event it was imported from, its signer,
#: its stance), for the ledger's links.
AssertionSources = Mapping[str, tuple[str, str, str]]


def belief_block(policy: str, projection: Document | None, error: str | None = None,
                 sources: AssertionSources | None = None) -> str:
    """The BELIEF status under one policy, with the ledger that explains it."""
    if projection is None:
        return f'<section class="belief"><h3>{h(policy)}</h3><p class="muted">unavailable: {h(error)}</p></section>'
    ledger = as_object(as_object(projection.get("explanation")).get("ledger"))
    status = projection.get("status", "")
    reasons = as_list(as_object(projection.get("uncertainty")).get("reasons")) or as_list(projection.get("conflict_reasons"))
    known = sources or {}

    def assertion(aid: str) -> str:
        if aid not in known:
            return h(aid)
        event_id, actor, stance = known[aid]
        return f"{link(capsule_url(event_id), aid)} <span class=\"muted\">({h(stance)} by {h(short(actor))})</span>"

    rows = [(name, ", ".join(assertion(str(x)) for x in as_list(ledger.get(name))) or '<span class="muted">none</span>')
            for name in ("contributing", "opposing", "uncertain")]
    exclusions = as_list(ledger.get("eligibility_exclusions"))
    rows.append(("exclusions", items(_exclusion(x, assertion) for x in exclusions)))
    trust = ", ".join(f"{short(as_text(t.get('actor', '')))}: {t.get('class', '')}"
                      for t in map(as_object, as_list(ledger.get("trust_decisions"))))
    rows.append(("trust", h(trust)))
    rows.append(("snapshot", h(as_object(projection.get("basis")).get("snapshot_seq"))))
    rules = items(h(r) for r in as_list(ledger.get("rules")))
    return (f'<section class="belief"><h3>{h(policy)}: <span class="status status-{h(status)}">{h(status)}</span>'
            f'{" <span class=muted>(" + h(", ".join(map(str, reasons))) + ")</span>" if reasons else ""}</h3>'
            f"{definition(rows)}<details><summary>rules</summary>{rules}</details></section>")


#: Why the projection left an assertion out (``akrelay.kip.projection``), in words.
EXCLUSION_REASONS = {"retracted": "retracted by its author", "withheld": "withheld by this relay",
                     "blocked_actor": "its signer is blocked under this policy"}


def _exclusion(item: object, assertion: Callable[[str], str]) -> str:
    """One excluded assertion: which one (linked to its event) and why, not the ledger's raw object."""
    aid = item.get("assertion_id") if isinstance(item, Mapping) else None
    if not isinstance(item, Mapping) or not isinstance(aid, str):
        return h(item)
    reason = str(item.get("reason", ""))
    return f"{assertion(aid)}: {h(EXCLUSION_REASONS.get(reason, reason) or 'excluded')}"


def _assessments(records: Sequence[Document], retracted: frozenset[str] = frozenset()) -> str:
    """Assessments with their verdicts; one its author retracted is struck through and marked so."""
    rows = []
    for r in records:
        event = event_of(r)
        payload = as_object(event.get("payload"))
        actor = as_text(event.get("actor"))
        verdict = f'<span class="verdict verdict-{h(payload.get("verdict"))}">{h(payload.get("verdict"))}</span>'
        if event_id(r) in retracted:
            verdict = f'<del class="retracted">{verdict}</del> <span class="warning">retracted by its author</span>'
        rows.append(f'{verdict} '
                    f'by {link(agent_url(actor), short(actor))}: '
                    f'{h(payload.get("summary", ""))} <span class="muted">{link(capsule_url(event_id(r)), "event")}'
                    f" · {when(event.get('created_at'))}</span>")
    return items(rows)


class Belief(NamedTuple):
    """A capsule's belief under one policy: its projection and the sources of its assertions, or why none."""

    policy: str
    projection: Document | None
    error: str | None = None
    sources: AssertionSources | None = None


def capsule_page(record: Document, *, outgoing: Sequence[tuple[str, str, str | None]],
                 incoming: Sequence[Document], beliefs: Sequence[Belief],
                 retractions: Sequence[Document], assessments: Sequence[Document],
                 retracted: frozenset[str] = frozenset()) -> str:
    """A capsule (or any event) with its relations both ways, assessments and beliefs.

    ``outgoing`` is ``(relation, target id, target title or None)``; ``incoming`` the
    publications that name this one in their relations.
    """
    event = event_of(record)
    payload = as_object(event.get("payload"))
    eid = event_id(record)
    etype = event.get("type", "")
    actor = as_text(event.get("actor"))
    parts = [f"<h1>{h(_title(record) or eid)}</h1>"]
    if retractions:
        parts.append('<p class="warning">Retracted by its author.</p>')
    meta = [("event ID", f"<code>{h(eid)}</code>"), ("seq", h(record.get("seq"))), ("type", h(etype)),
            ("author", link(agent_url(actor), actor)),
            ("created", when(event.get("created_at"))), ("accepted", when(record.get("accepted_at"))),
            ("licence", h(payload.get("license", ""))),
            ("raw envelope", link(f"/v1/knowledge/events/{eid}", "signed envelope (JSON)"))]
    if payload.get("kind"):
        meta.insert(3, ("kind", h(payload["kind"])))
    if payload.get("language"):
        meta.append(("language", h(payload["language"])))
    target = payload.get("target")
    if target:
        meta.append(("target", link(capsule_url(as_text(target)), target)))
    parts.append(definition(meta))
    for label, key in (("Statement", "statement"), ("Summary", "summary"), ("Reason", "reason"), ("Basis", "basis")):
        if payload.get(key) is not None:
            parts.append(f'<h2>{label}</h2><p class="text">{h(payload[key])}</p>')
    if "context" in payload:
        parts.append("<h2>Context</h2>" + _context(payload.get("context")))
    parts.append("<h2>Evidence</h2>" + _evidence(payload.get("evidence")))
    parts.append("<h2>Reproduction</h2>" + _reproduction(payload.get("reproduction")))
    tags = " ".join(link(search_url(tag=str(t)), t, "tag") for t in as_list(payload.get("tags")))
    parts.append("<h2>Tags</h2>" + (f"<p>{tags}</p>" if tags else '<p class="muted">none</p>'))
    parts.append("<h2>Relations</h2><h3>From this capsule</h3>" + items(
        f'<span class="rel">{h(rel)}</span> {link(capsule_url(target), title or target, "relation")}'
        for rel, target, title in outgoing))
    incoming_rows = []
    for r in incoming:
        for rel in map(as_object, as_list(as_object(event_of(r).get("payload")).get("relations"))):
            if rel.get("target") == eid:
                incoming_rows.append(f'{link(capsule_url(event_id(r)), _title(r), "relation")} '
                                     f'<span class="rel">{h(rel.get("relation"))}</span> this capsule')
    parts.append("<h3>To this capsule</h3>" + items(incoming_rows))
    parts.append("<h2>Assessments</h2>" + _assessments(assessments, retracted))
    if beliefs:
        parts.append("<h2>Belief</h2>" + "".join(belief_block(*belief) for belief in beliefs))
    return page(_title(record) or eid, "".join(parts))


def agent_page(agent_id: str, capsules: Sequence[Document], assessments: Sequence[Document],
               more: bool, retracted: frozenset[str] = frozenset()) -> str:
    body = (f"<h1>Agent</h1><p><code>{h(agent_id)}</code></p>"
            f"<h2>Capsules</h2>{items(record_row(r) for r in capsules)}"
            f"<h2>Assessments</h2>{_assessments(assessments, retracted)}")
    if more:
        body += f'<p class="muted">Showing the first ones; {link(search_url(actor=agent_id), "search for more")}.</p>'
    return page("Agent", body)


def search_page(params: dict[str, str], records: Sequence[Document] | None, error: str | None,
                next_cursor: str | None) -> str:
    fields = [f'<label>words <input type="search" name="q" value="{h(params.get("q", ""))}" autofocus></label>']
    for name in SEARCH_FILTERS:
        fields.append(f'<label>{h(name)} <input name="{h(name)}" value="{h(params.get(name, ""))}"></label>')
    form = f'<form class="search" method="get" action="{BASE}/search">{"".join(fields)}<button>Search</button></form>'
    result = ""
    if error:
        result = f'<p class="error">{h(error)}</p>'
    elif records is not None:
        result = f"<h2>{len(records)} result(s)</h2>" + items(record_row(r) for r in records)
        if next_cursor:
            keep = {k: v for k, v in params.items() if v and k != "cursor"}
            result += f"<p>{link(search_url(**keep, cursor=next_cursor), 'next page')}</p>"
    return page("Search", f"<h1>Search</h1>{form}{result}")


def ask_page(policies: Sequence[str], *, ask: str = "", policy: str | None = None,
             answer: Document | None = None, error: str | None = None) -> str:
    """The question box; without script it posts the form and shows the synchronous answer."""
    options = "".join(f'<option value="{h(p)}"{" selected" if p == policy else ""}>{h(p)}</option>' for p in policies)
    form = (f'<form id="ask-form" method="post" action="{BASE}/ask">'
            f'<textarea name="ask" rows="3" maxlength="4000" required>{h(ask)}</textarea>'
            f'<label>policy <select name="policy">{options}</select></label> <button>Ask</button></form>')
    text, cites, status = "", "", ""
    if answer is not None:
        status = str(answer.get("status", ""))
        for out in map(as_object, as_list(answer.get("output"))):
            for content in map(as_object, as_list(out.get("content"))):
                text += str(content.get("text", ""))
        if answer.get("error"):
            text = text or str(answer["error"])
        cites = "".join(citation_item(i, c) for i, c in enumerate(map(as_object, as_list(answer.get("citations"))), 1))
    # The answer's first line is its lead (the fact, its citation and belief): shown above the evidence.
    lead, _, text = text.partition("\n")
    text = text.lstrip("\n")
    err = f'<p class="error">{h(error)}</p>' if error else ""
    body = (f"<h1>Ask</h1><p class=\"muted\">A question over this relay's knowledge (KnowQL); the answer cites "
            f"capsules with their belief status.</p>{form}{err}"
            f'<section id="answer-box"><p id="ask-status" class="muted">{h(status)}</p>'
            f'<p id="lead-answer">{h(lead)}</p>'
            f'<pre id="answer">{h(text)}</pre><ol id="citations">{cites}</ol></section>')
    return page("Ask", body, scripts=("ask.js",))


def citation_item(number: int, citation: Document) -> str:
    source = str(citation.get("source", ""))
    belief = citation.get("belief", "")
    return (f'<li value="{number}">{link(capsule_url(source), citation.get("title") or source, "citation")} '
            f'<span class="status status-{h(belief)}">{h(belief)}</span></li>')


def status_page(status: RelayStatus, origin: str) -> str:
    def lag(value: object) -> str:
        return h(value) if value is not None else '<span class="muted">not running</span>'

    rows = [("origin", h(origin)), ("checkpoint", h(status.checkpoint)),
            ("search index seq", lag(status.index_seq)), ("search index lag", lag(status.index_lag)),
            ("q text index lag", lag(status.text_index_lag)),
            ("KIP nexus head", lag(status.kip_head)), ("KIP import lag", lag(status.kip_lag)),
            ("store size", lag(f"{status.store_bytes:,} bytes" if status.store_bytes is not None else None))]
    peers = "".join(
        f"<tr><td>{h(p.origin)}</td><td>{h(p.checkpoint)}</td><td>{h(p.peer_checkpoint)}</td><td>{h(p.lag)}</td>"
        f"<td>{h(p.passes)}</td><td>{h(p.failed_passes)}</td><td>{when(p.last_success) if p.last_success else ''}</td>"
        f"<td>{h(p.last_error or '')}</td></tr>" for p in status.peers)
    table = ("<table><thead><tr><th>peer</th><th>synced to</th><th>peer checkpoint</th><th>lag</th><th>passes</th>"
             f"<th>failed</th><th>last success</th><th>last error</th></tr></thead><tbody>{peers}</tbody></table>"
             if peers else '<p class="muted">no peers configured</p>')
    return page("Status", f"<h1>Operator status</h1>{definition(rows)}<h2>Peers</h2>{table}"
                          f'<p class="muted">Metrics for scraping: <a href="/metrics">/metrics</a>.</p>')


def not_found_page(what: str) -> str:
    return page("Not found", f"<h1>Not found</h1><p>{h(what)}</p>")


def method_not_allowed_page(allowed: str | None) -> str:
    which = f"answers {h(allowed)} only" if allowed else "does not answer this request method"
    return page("Method not allowed", f"<h1>Method not allowed</h1><p>This explorer page {which}.</p>")
