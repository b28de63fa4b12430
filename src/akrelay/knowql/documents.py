"""The documents a KnowQL turn store keeps: sessions, queries (turns) and their events (seed 003).

Both stores (:mod:`akrelay.knowql.store`, :mod:`akrelay.knowql.redis_store`) write these as JSON
and read them back by fixed keys; :mod:`akrelay.knowql.engine` builds them and
:mod:`akrelay.knowql.runner` fills in a turn's answer. Types only: a TypedDict costs nothing at
run time, and the stored JSON is trusted as what this module describes (only this code writes it).

A stored query carries private members (``_started``, ``_timeout``, ``_owner``) that
:func:`akrelay.knowql.lifecycle.public` strips before the document leaves the relay.
Values the turn store only keeps and hands back (a shaped answer's ``output_json``, a
citation, ``provenance``) are ``object`` or read-only mappings: their own modules type them.
"""

from __future__ import annotations

from typing import Mapping, NotRequired, Required, Sequence, TypedDict


class Usage(TypedDict):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cost_usd: float


class InputMessage(TypedDict):
    role: str
    content: str


class OutputText(TypedDict):
    type: str
    text: str


class OutputMessage(TypedDict):
    role: str
    content: list[OutputText]


class Step(TypedDict):
    """One step of a turn (``retrieve``, ``compose``) as its ``steps`` list and its ``response.step`` event say."""

    step_id: str
    status: str
    commentary: str
    fns: list[str]


class Owner(TypedDict):
    """The process that runs a turn (:func:`akrelay.knowql.recovery.owner`)."""

    host: str
    pid: int
    boot: str


class QueryExtension(TypedDict, total=False):
    """A query's ``akrelay`` member: set when the turn is accepted, replaced when it completes."""

    api_version: str
    policy: str
    scope: list[str]
    warnings: list[str]
    snapshot_seq: int
    index_seq: int
    provenance: object


class QueryFields(TypedDict, total=False):
    """The members a terminal status change merges into a query (:func:`akrelay.knowql.lifecycle.finished`)."""

    model: str | None
    error: str | None
    output: list[OutputMessage]
    output_json: object
    citations: Sequence[Mapping[str, object]]
    steps: list[Step]
    usage: Usage
    akrelay: QueryExtension


class PublicQuery(TypedDict):
    """A Query document as the wire shows it (seed 003)."""

    id: str
    object: str
    session_id: str
    model: str | None
    created: int
    status: str
    error: str | None
    previous_query_id: str | None
    input: list[InputMessage]
    output: list[OutputMessage]
    output_json: object
    citations: Sequence[Mapping[str, object]]
    steps: list[Step]
    usage: Usage
    runtime_ms: int
    akrelay: QueryExtension


class QueryDoc(PublicQuery):
    """A query as stored: the public document and the private members the relay reads."""

    #: when the turn was accepted (``time.time()``): its run time is measured from here
    _started: NotRequired[float]
    #: the turn's timeout in seconds, named in the error of a turn that ran out of time
    _timeout: NotRequired[int]
    #: absent in documents stored before owners were recorded
    _owner: NotRequired[Owner]


class Pinned(TypedDict):
    """What a new session pins (seed 000 §2.3), from :meth:`akrelay.knowql.request.QueryDocument.pinned`."""

    scope: list[str]
    system_prompt: str | None
    guardrails: str | None
    models: list[str]
    tools: list[str]
    vars: Mapping[str, object]
    workflow: str | None


class NewSession(Pinned):
    """A session as :mod:`akrelay.knowql.engine` creates it (and a store keeps it): what it pins, and its identity."""

    id: str
    object: str
    project_id: str
    created_by: str
    title: str


class SessionDoc(NewSession):
    """A session as a store returns it: with its last query and its timestamps (RFC 3339)."""

    last_query_id: str | None
    created_at: str | None
    updated_at: str | None


class PageInfo(TypedDict):
    total: int
    offset: int
    limit: int
    next_offset: int | None


class SessionExtension(TypedDict):
    queries: PageInfo


class SessionPage(SessionDoc):
    """``GET /sessions/{id}``: the session with one page of its queries."""

    queries: list[PublicQuery]
    akrelay: SessionExtension


class Event(TypedDict, total=False):
    """A turn's event as stored and streamed (``event:`` is its ``type``); each kind sets its own members."""

    type: Required[str]
    query_id: str
    session_id: str
    error: str
    delta: str
    step_id: str
    status: str
    commentary: str
    fns: list[str]
    n_steps: int
    n_tool_calls: int
    by_category: dict[str, int]
    total_hits: int
    duration_ms: int
