"""The explorer's routes (mounted by the node's web component, ``akrelay.web``): thin handlers over views.

Each handler gathers plain data from the relay (and the KIP runtime, the search
index, the KnowQL engine) in a worker thread and renders a page from
:mod:`akrelay.explorer.views`. GET only, except the Ask form's POST, which runs a
KnowQL turn like ``POST /query`` does. Handlers carry no ``rate`` option, so the
shared middleware charges them to the *read* bucket like every API read.
"""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from typing import TYPE_CHECKING, Callable, Sequence
from urllib.parse import parse_qsl

import anyio.to_thread
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.handlers import HTTPRouteHandler
from litestar.response.base import ASGIResponse

import akrelay.explorer.options  # noqa: F401  (declares --no-explorer)
from akrelay.explorer import views
from akrelay.explorer.html import BASE, SECURITY_HEADERS
from akrelay.explorer.views import Belief, Document, as_list, as_object, as_text, event_id, event_of
from akrelay.http.querystring import query_pairs
from akrelay.jsontypes import JSONObject
from akrelay.observability.sources import Sources
from akrelay.protocol.errors import ProtocolError
from akrelay.relay.core import QueryPage, Relay
from akrelay.protocol.payload import ASSESS, PUBLISH, RETRACT

if TYPE_CHECKING:
    from akrelay.settings import Settings

#: Litestar adds ``; charset=utf-8`` to a ``text/`` media type itself (naming it here doubled it).
HTML = "text/html"
#: Assets served from the package (no CDN); anything else under static/ is 404.
STATIC = {"explorer.css": "text/css", "ask.js": "text/javascript"}
RECENT = 50
#: How far back (in seq) the Recent page looks for publications.
RECENT_WINDOW = 2000
LIST_LIMIT = 100
ASK_TIMEOUT_S = 60


def html_response(body: str, status: int = 200, headers: dict[str, str] | None = None) -> ASGIResponse:
    return ASGIResponse(body=body.encode("utf-8"), status_code=status, media_type=HTML,
                        headers={**SECURITY_HEADERS, **(headers or {})})


def error_page(path: str, status: int, allow: str | None) -> Response[bytes] | None:
    """The HTML 404 or 405 page for a path in the explorer's URL space, with its security headers.

    The app's own 404 and 405 are JSON (Identity §8.1) without a CSP; a person who
    mistypes an explorer URL or sends a form to the wrong place gets a page instead.
    ``None`` outside the explorer (the API keeps its JSON errors).
    """
    if status not in (404, 405) or not (path == BASE or path.startswith(BASE + "/")):
        return None
    if status == 404:
        body = views.not_found_page("There is no explorer page at this address.")
        headers = dict(SECURITY_HEADERS)
    else:
        body = views.method_not_allowed_page(allow)
        headers = {**SECURITY_HEADERS, **({"Allow": allow} if allow else {})}
    return Response(content=body.encode("utf-8"), status_code=status, media_type=HTML, headers=headers)


def _records(page: QueryPage) -> list[Document]:
    return [r.to_dict() for r in page.records]


def _policies(sources: Sources) -> list[str]:
    """The offered projection policies, the relay's default first."""
    from akrelay.kip import POLICIES

    default = sources.kip_default_policy()
    return sorted(POLICIES, key=lambda p: (p != default, p))


def recent(relay: Relay) -> str:
    checkpoint = relay.checkpoint()
    after = max(0, checkpoint - RECENT_WINDOW)
    page = relay.query([("type", PUBLISH), ("after_seq", str(after)), ("limit", "1000")])
    records = _records(page)[-RECENT:][::-1]
    return views.recent_page(records, checkpoint)


def capsule(relay: Relay, sources: Sources, capsule_id: str) -> str:
    """Everything the capsule page shows; a ProtocolError (not found, malformed) propagates."""
    record: Document = relay.get(capsule_id).to_dict()
    event = event_of(record)
    payload = as_object(event.get("payload"))
    related = _records(relay.query([("target", capsule_id), ("limit", "1000")]))
    incoming = [r for r in related if event_of(r)["type"] == PUBLISH]
    assessments = [r for r in related if event_of(r)["type"] == ASSESS]
    retractions = [r for r in related if event_of(r)["type"] == RETRACT
                   and event_of(r)["actor"] == event.get("actor")]
    outgoing: list[tuple[str, str, str | None]] = []
    for rel in map(as_object, as_list(payload.get("relations"))):
        target_id = as_text(rel["target"])
        title = None
        try:
            target: Document = relay.get(target_id).to_dict()
            found = as_object(event_of(target).get("payload")).get("title")
            title = found if isinstance(found, str) else None
        except ProtocolError:
            pass
        outgoing.append((as_text(rel["relation"]), target_id, title))
    beliefs: list[Belief] = []
    if event.get("type") == PUBLISH:
        beliefs = _beliefs(sources, capsule_id)
    return views.capsule_page(record, outgoing=outgoing, incoming=incoming, beliefs=beliefs,
                              retractions=retractions, assessments=assessments,
                              retracted=_retracted(relay, assessments))


def _retracted(relay: Relay, records: Sequence[Document]) -> frozenset[str]:
    """The IDs of ``records`` that their own author retracted (shown, but marked as withdrawn).

    One indexed query per record (``target``, ``type``, ``actor``, ``limit=1``); the
    lists shown are bounded already.
    """
    out = set()
    for r in records:
        record_id, actor = event_id(r), as_text(event_of(r).get("actor", ""))
        page = relay.query([("target", record_id), ("type", RETRACT), ("actor", actor), ("limit", "1")])
        if page.records:
            out.add(record_id)
    return frozenset(out)


def _beliefs(sources: Sources, capsule_id: str) -> list[Belief]:
    """The belief per policy (the projection, or why there is none), with the sources of the ledger's
    assertions: assertion id -> (the event it was imported from, its signer, its stance), for its links."""
    from akrelay.kip.elements import Assertion

    try:
        runtime = sources.kip_runtime()
    except Exception as exc:  # noqa: BLE001 - KIP not available: the page still renders
        return [Belief(p, None, f"the KIP runtime is not available ({type(exc).__name__})") for p in _policies(sources)]
    out: list[Belief] = []
    for policy in _policies(sources):
        try:
            projection: Document = runtime.project_capsule(capsule_id, policy=policy)
        except Exception as exc:  # noqa: BLE001 - KipError (not imported yet, retracted) or a closing nexus
            out.append(Belief(policy, None, getattr(exc, "message", None) or str(exc)))
            continue
        ledger = as_object(as_object(projection.get("explanation")).get("ledger"))
        ids = {aid for name in ("contributing", "opposing", "uncertain") for aid in as_list(ledger.get(name))}
        ids |= {x.get("assertion_id") for x in as_list(ledger.get("eligibility_exclusions")) if isinstance(x, dict)}
        origins: dict[str, tuple[str, str, str]] = {}
        with runtime.lock:
            for aid in ids:
                element = runtime.nexus.get(aid) if isinstance(aid, str) else None
                if isinstance(aid, str) and isinstance(element, Assertion):
                    origins[aid] = (element.import_id, element.actor, element.stance)
        out.append(Belief(policy, projection, None, origins))
    return out


def agent(relay: Relay, agent_id: str) -> str:
    capsules = _records(relay.query([("actor", agent_id), ("type", PUBLISH), ("limit", str(LIST_LIMIT))]))
    assessed = _records(relay.query([("actor", agent_id), ("type", ASSESS), ("limit", str(LIST_LIMIT))]))
    more = len(capsules) >= LIST_LIMIT or len(assessed) >= LIST_LIMIT
    return views.agent_page(agent_id, capsules, assessed, more, retracted=_retracted(relay, assessed))


def search(relay: Relay, raw_query: bytes) -> tuple[str, int]:
    allowed = {"q", "cursor", *views.SEARCH_FILTERS}
    try:
        pairs = query_pairs(raw_query)
    except ProtocolError as exc:
        return views.search_page({}, None, exc.message, None), 400
    params = {k: v for k, v in pairs if k in allowed}
    wanted = [(k, v) for k, v in params.items() if v.strip()]
    if not wanted:
        return views.search_page(params, None, None, None), 200
    try:
        page = relay.query(wanted + [("limit", "50")])
    except ProtocolError as exc:
        return views.search_page(params, None, exc.message, None), 400
    return views.search_page(params, _records(page), None, page.next_cursor), 200


def status(relay: Relay, settings: Settings, sources: Sources) -> str:
    from akrelay.observability.status import relay_status

    return views.status_page(relay_status(relay, settings, sources), relay.config.origin)


async def _ask(sources: Sources, ask: str, policy: str | None) -> tuple[Document | None, str | None]:
    """One synchronous KnowQL turn, as ``POST /query`` runs it (the no-script Ask form)."""
    from akrelay.knowql import API_VERSIONS
    from akrelay.knowql.errors import KnowqlError
    from akrelay.knowql.request import parse_document

    doc_value: JSONObject = {"ask": ask, "scope": ["knowledge"]}
    if policy:
        doc_value["vars"] = {"policy": policy}
    try:
        service = sources.knowql_engine()
        doc = parse_document(doc_value)
        _accepted, turn = await anyio.to_thread.run_sync(service.accept, doc, API_VERSIONS[0])
        future = asyncio.wrap_future(service.start(turn))
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout=min(ASK_TIMEOUT_S, max(0.0, turn.deadline - time.time())))
        except asyncio.TimeoutError:
            return None, "the answer took too long; try again"
        return dict(await anyio.to_thread.run_sync(service.query, turn.query_id)), None
    except KnowqlError as exc:
        return None, exc.message


def routes(relay: Relay, settings: Settings, sources: Sources) -> list[HTTPRouteHandler]:
    if settings.explorer.disabled:
        return []
    assets = {name: resources.files("akrelay.explorer").joinpath("static", name).read_bytes() for name in STATIC}

    async def render(call: Callable[..., str], *args: object) -> ASGIResponse:
        try:
            return html_response(await anyio.to_thread.run_sync(call, relay, *args))
        except ProtocolError as exc:
            status_code = 404 if exc.code == "not_found" else 400
            return html_response(views.not_found_page(exc.message), status_code)

    @get("/", sync_to_thread=False, include_in_schema=False)
    def root() -> ASGIResponse:
        return ASGIResponse(body=b"", status_code=302, headers={"location": f"{BASE}/"})

    # litestar's user and auth types are object: this app sets neither
    @get([BASE, f"{BASE}/"], include_in_schema=False)
    async def recent_page() -> ASGIResponse:
        return await render(recent)

    @get(f"{BASE}/capsules/{{event_id:str}}", include_in_schema=False)
    async def capsule_page(request: Request[object, object, State]) -> ASGIResponse:
        return await render(capsule, sources, request.path_params["event_id"])

    @get(f"{BASE}/agents/{{agent_id:str}}", include_in_schema=False)
    async def agent_page(request: Request[object, object, State]) -> ASGIResponse:
        return await render(agent, request.path_params["agent_id"])

    @get(f"{BASE}/search", include_in_schema=False)
    async def search_page(request: Request[object, object, State]) -> ASGIResponse:
        body, code = await anyio.to_thread.run_sync(search, relay, request.scope["query_string"])
        return html_response(body, code)

    @get(f"{BASE}/status", include_in_schema=False)
    async def status_page() -> ASGIResponse:
        return html_response(await anyio.to_thread.run_sync(status, relay, settings, sources))

    @get(f"{BASE}/ask", sync_to_thread=False, include_in_schema=False)
    def ask_form() -> ASGIResponse:
        return html_response(views.ask_page(_policies(sources)))

    @post(f"{BASE}/ask", status_code=200, include_in_schema=False)
    async def ask_post(request: Request[object, object, State]) -> ASGIResponse:
        raw = await request.body()
        try:
            form = dict(parse_qsl(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=8))
        except (UnicodeDecodeError, ValueError):
            form = {}
        ask, policy = form.get("ask", ""), form.get("policy") or None
        answer, error = await _ask(sources, ask, policy)
        page = views.ask_page(_policies(sources), ask=ask, policy=policy, answer=answer, error=error)
        return html_response(page, 200 if error is None else 400)

    @get(f"{BASE}/static/{{name:str}}", sync_to_thread=False, include_in_schema=False)
    def static(request: Request[object, object, State]) -> ASGIResponse:
        name = request.path_params["name"]
        if name not in assets:
            return html_response(views.not_found_page("no such asset"), 404)
        return ASGIResponse(body=assets[name], status_code=200, media_type=STATIC[name],
                            headers={**SECURITY_HEADERS, "Cache-Control": "public, max-age=3600"})

    return [root, recent_page, capsule_page, agent_page, search_page, status_page, ask_form, ask_post, static]
