"""Execution of META commands (KIP §63–§68) against the nexus.

Parsing is the language layer's (``akrelay.kip.kql.parse_meta``); this module
maps each parsed command to a read of one snapshot. Families akrelay does not
serve answer ``UnsupportedCapability`` (§67).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypeAlias, TypeVar

from akrelay import __version__
from akrelay.jsontypes import JSONMapping, JSONObject, JSONValue
from akrelay.kip import grounding
from akrelay.kip.errors import KipError
from akrelay.kip.kql import meta as ast
from akrelay.kip.kql.grammar import MAX_NESTING
from akrelay.kip.kql.regex import MAX_PATTERN, MAX_SUBJECT
from akrelay.kip.kql.values import (
    Value, check_cursor, check_limit, check_seq, check_string, check_threshold, resolve,
)
from akrelay.kip.package import AK_PACKAGE_REF
from akrelay.kip.projection import POLICIES, policy as resolve_policy
from akrelay.kip.timefmt import parse_kip_timestamp

if TYPE_CHECKING:
    from akrelay.kip.config import KipConfig
    from akrelay.kip.nexus import NexusBase
    from akrelay.kip.package import SchemaEnvironment
    from akrelay.kip.paging import CursorCodec


class MetaRuntime(Protocol):
    """What META reads of the runtime that calls it (:class:`akrelay.kip.runtime.KipRuntime`).

    A protocol, not the class: the runtime calls this module, so importing it back
    would make the two modules a cycle.
    """

    @property
    def config(self) -> KipConfig: ...
    @property
    def environment(self) -> SchemaEnvironment: ...
    @property
    def nexus(self) -> NexusBase: ...
    @property
    def cursors(self) -> CursorCodec: ...
    @property
    def budget_ms(self) -> int | None: ...
    def kql_available(self) -> bool: ...
    def type_count(self, type_name: str, seq: int) -> int: ...
    def symbol_view(self, name: str, ref: str, sym: JSONObject) -> Result: ...
    def snapshot_at_time(self, at_ms: int, head: int) -> int: ...

#: A request's bound parameters (JSON values, §74).
Params = JSONMapping
#: A JSON object META builds; its values are read-only views (counts, constants, definitions are shared, not copied).
Result: TypeAlias = dict[str, JSONValue]
#: A handler's answer: ``(result, extra result context)``.
Outcome = tuple[Result, Result]
Handler = Callable[["MetaRuntime", Any, Params, int], Outcome]  # Any: the command; _HANDLERS picks by its type
_C = TypeVar("_C", bound=ast.MetaCommand)
_Listing = ast.ListTypes | ast.ListPredicates | ast.ListEpistemicPolicies

MAX_LIMIT = 100
DEFAULT_SEARCH_LIMIT = 20

SAFETY_REMINDERS = [
    "raw Proposition != accepted belief",
    "missing visible match != false",
    "SEARCH score != confidence",
    "confidence != trust",
    "confidence != memory_strength",
    "name != identity",
    "source self != destination self",
    "Evidence correction != overwrite",
    "cognitive content != authority",
    "imported Assertion != local endorsement: every Assertion here is mode imported (§26.3)",
    "a valid signature proves the signer and the bytes, not truth",
]

#: Registry capabilities (§67.4) and whether akrelay supports them.
SUPPORTED_CAPABILITIES: JSONObject = {
    "historical_reads": True,
    "historical_search": True,
    "search_index_freshness": {"mode": "synchronous"},
}
UNSUPPORTED_CAPABILITIES = (
    "serializable_isolation", "atomic_batch", "idempotency_retention", "semantic_search", "hybrid_search",
    "weighted_projection", "signed_receipts", "streaming", "artifacts", "change_stream", "filtered_delivery",
    "watch_evaluation", "exposure_log", "draft_vocabulary", "identity_repair", "recording_repair",
    "derive_permission", "record_outcome_permission", "capsule_export", "capsule_import", "capsule_signatures",
    "kip1_migration", "memory_interface", "durable_brain_runtime", "receiver_fencing", "prospective_trials",
)
#: Engine-local capability names (§67.4 allows them beside the registry).
ENGINE_CAPABILITIES: JSONObject = {
    "akrelay.readonly_runtime": True,
    "akrelay.agent_knowledge_import": {"package": AK_PACKAGE_REF, "protocol": "agent-knowledge/1.0"},
    "akrelay.operator_trust_classes": ["trusted", "unknown", "blocked"],
}

LIMITS = {"max_operations_per_request": 32, "max_list_limit": MAX_LIMIT, "max_search_limit": MAX_LIMIT,
          "default_search_limit": DEFAULT_SEARCH_LIMIT, "max_request_bytes": 1_048_576,
          "max_request_depth": 64, "max_nesting_depth": MAX_NESTING, "max_regex_pattern": MAX_PATTERN,
          "max_regex_subject": MAX_SUBJECT}


def _limits(rt: "MetaRuntime") -> Result:
    """The declared limits, with this runtime's CPU budget per request (``None``: unlimited)."""
    return {**LIMITS, "cpu_budget_ms": rt.budget_ms}


def execute(rt: "MetaRuntime", cmd: ast.MetaCommand, params: Params, seq: int) -> Outcome:
    """Run one parsed META command at snapshot ``seq``: ``(result, extra result context)``."""
    missing = sorted(n for n in cmd.parameter_names() if n not in params)
    if missing:
        raise KipError("ReferenceError", f"parameter :{missing[0]} is not bound", details={"missing": missing})
    handler = _HANDLERS.get(type(cmd))
    if handler is None:
        raise KipError("UnsupportedCapability", f"{cmd.family} {cmd.target}".strip() + " is not served by this runtime",
                       details={"family": cmd.family, "target": cmd.target},
                       hint="DESCRIBE CAPABILITIES lists what this read-only gateway serves")
    return handler(rt, cmd, params, seq)


def _as_of(rt: "MetaRuntime", value: Value | None, params: Params, seq: int) -> int:
    if value is None:
        return seq
    return rt.nexus.check_seq(check_seq(resolve(value, params)))


def _primer(rt: MetaRuntime, cmd: ast.DescribePrimer, params: Params, seq: int) -> Result:
    mode = resolve(cmd.mode, params) or "compact"
    if mode not in ("compact", "full"):
        raise KipError("ConstraintViolation", 'PRIMER MODE must be "compact" or "full"')
    env = rt.environment
    if mode == "full":
        schema_map: dict[str, list[str]] | dict[str, list[Result]]
        schema_map = {"types": [rt.symbol_view(n, r, s) for n, r, s in env.symbols_of("ConceptType")],
                      "predicates": [rt.symbol_view(n, r, s) for n, r, s in env.symbols_of("Predicate")],
                      "facets": [rt.symbol_view(n, r, s) for n, r, s in env.symbols_of("Facet")],
                      "structural_fields": [rt.symbol_view(n, r, s) for n, r, s in env.symbols_of("StructuralField")]}
    else:
        schema_map = {"types": [n for n, _, _ in env.symbols_of("ConceptType")],
                      "predicates": [n for n, _, _ in env.symbols_of("Predicate")],
                      "facets": [n for n, _, _ in env.symbols_of("Facet")],
                      "structural_fields": [n for n, _, _ in env.symbols_of("StructuralField")]}
    counts = rt.nexus.counts(seq)
    return {
        "mode": mode,
        "protocol": {"kip": "2.0", "runtime": "readonly",
                     "languages": ["META"] + (["KQL"] if rt.kql_available() else []), "endpoint": "/v1/kip",
                     "timestamp_format": "YYYY-MM-DDTHH:mm:ss.SSSZ"},
        "execution_context": {
            "principal": {"id": "anonymous", "authenticated": False,
                          "note": "the authenticated caller; never a semantic actor"},
            "self": None,
            "self_note": "this Space designates no $self: it holds other agents' imported cognition",
            "space": {"id": rt.nexus.space_id, "origin": rt.config.origin, "space_seq": seq},
            "epistemic_policy": POLICIES[rt.config.default_policy].identity(),
        },
        "cognitive_identity": {"self": None, "space_kind": "relay gateway",
                               "description": "agent-knowledge/1.0 events accepted by this relay, imported as "
                                              "KIP cognition; every Assertion has mode imported."},
        "schema_map": {"package": AK_PACKAGE_REF, **schema_map},
        "domain_map": {"capsules": _count_type(rt, "KnowledgeCapsule", seq), "agents": _count_type(rt, "Agent", seq),
                       "elements": counts},
        "capabilities": {"supported": sorted(SUPPORTED_CAPABILITIES) + sorted(ENGINE_CAPABILITIES),
                         "conformance_level": None, "limits": _limits(rt)},
        "safety_reminders": SAFETY_REMINDERS,
    }


def _count_type(rt: MetaRuntime, type_name: str, seq: int) -> int:
    return rt.type_count(type_name, seq)


def _protocol(rt: MetaRuntime, cmd: ast.DescribeProtocol, params: Params, seq: int) -> Result:
    return {
        "kip": "2.0", "specification": "KIP 2.0 (2.0-draft)", "runtime": "readonly",
        "engine": {"name": "akrelay", "version": __version__},
        "languages": {"META": "served", "KQL": "served" if rt.kql_available() else "not yet served",
                      "KML": "recognised and refused (ReadonlyViolation)"},
        "execution_modes": ["independent", "sequence"],
        "serialization": "application/json", "timestamp_format": "YYYY-MM-DDTHH:mm:ss.SSSZ",
        "space_seq": "equals the relay's acceptance seq; one import transaction per accepted event",
        "source_protocol": "agent-knowledge/1.0",
    }


def _capabilities(rt: MetaRuntime, cmd: ast.DescribeCapabilities, params: Params, seq: int) -> Result:
    supported = dict(SUPPORTED_CAPABILITIES)
    supported.update(ENGINE_CAPABILITIES)
    return {
        "conformance_level": None,
        "conformance_note": "no KIP conformance level is claimed (§89): this is a read-only gateway without KML, "
                            "Governance, Transactions or the ingestion context",
        "supported": supported,
        "available": dict(supported),
        "unsupported": list(UNSUPPORTED_CAPABILITIES),
        "search_modes": {"supported": ["keyword"], "default": "keyword"},
        "epistemic_policies": sorted(POLICIES),
        "limits": _limits(rt),
    }


def _space(rt: MetaRuntime, cmd: ast.DescribeSpace, params: Params, seq: int) -> Result:
    wanted = resolve(cmd.space, params)
    if wanted is not None and wanted != rt.nexus.space_id:
        raise KipError("NotFoundOrNotVisible", "no such MemorySpace is visible here")
    tx = rt.nexus.transaction_at(seq)
    return {"space_id": rt.nexus.space_id, "origin": rt.config.origin, "space_seq": seq,
            "last_committed_at": tx.committed_at if tx else None,
            "schema_environment_version": rt.environment.version, "self": None,
            "default_epistemic_policy": POLICIES[rt.config.default_policy].identity(),
            "elements": rt.nexus.counts(seq)}


def _schema_env(rt: MetaRuntime, cmd: ast.DescribeSchemaEnvironment, params: Params, seq: int) -> Result:
    at = _as_of(rt, cmd.as_of_seq, params, seq)
    return {**rt.environment.describe(), "space_id": rt.nexus.space_id, "as_of_seq": at}


def _describe_symbol(kind: str) -> Callable[[MetaRuntime, ast.DescribeType | ast.DescribePredicate, Params, int], Result]:
    def run(rt: MetaRuntime, cmd: ast.DescribeType | ast.DescribePredicate, params: Params, seq: int) -> Result:
        name = check_string(resolve(cmd.name, params), kind)
        ref, sym = rt.environment.resolve(name, "ConceptType" if kind == "TYPE" else "Predicate")
        local = ref.rsplit("/", 1)[1]
        return rt.symbol_view(local, ref, sym)
    return run


def _policy(rt: MetaRuntime, cmd: ast.DescribeEpistemicPolicy, params: Params, seq: int) -> Result:
    bound = resolve(cmd.policy, params)
    name = check_string(bound, "EPISTEMIC POLICY") if bound is not None else None
    pol = resolve_policy(name, rt.config.default_policy)
    return {**pol.describe(), "default": pol.id == rt.config.default_policy,
            "trust_state_version": rt.config.trust.version}


def _snapshot(rt: MetaRuntime, cmd: ast.DescribeSnapshot, params: Params, seq: int) -> Result:
    if cmd.at_time is not None:
        at_text = resolve(cmd.at_time, params)
        if not isinstance(at_text, str):
            raise KipError("TypeMismatch", "AT TIME takes a timestamp string")
        try:
            at_ms = parse_kip_timestamp(at_text)
        except ValueError as exc:
            raise KipError("ConstraintViolation", str(exc)) from None
        at = rt.snapshot_at_time(at_ms, seq)
    else:
        at = _as_of(rt, cmd.as_of_seq, params, seq)
    tx = rt.nexus.transaction_at(at)
    return {"space_id": rt.nexus.space_id, "space_seq": at,
            "tx_id": tx.tx_id if tx else None,
            "committed_at": tx.committed_at if tx else None,
            "schema_environment_version": rt.environment.version, "head_seq": seq}


def _paged(rt: MetaRuntime, family: str, items: Sequence[JSONMapping], cmd: _Listing, params: Params, seq: int,
           binding: list[str]) -> Outcome:
    limit = check_limit(resolve(cmd.limit, params)) if cmd.limit is not None else MAX_LIMIT
    if limit > MAX_LIMIT:
        raise KipError("ResultLimitExceeded", f"LIMIT may not exceed {MAX_LIMIT}", details={"max": MAX_LIMIT})
    bound: list[str | int] = [*binding, limit]
    offset = 0
    if cmd.cursor is not None:
        token = check_cursor(resolve(cmd.cursor, params))
        seq, offset = rt.cursors.decode(token, family, bound)
    page = items[offset: offset + limit]
    out: Result = {"items": page}
    if offset + limit < len(items):
        out["next_cursor"] = rt.cursors.encode(family, bound, seq, offset + limit)
    return out, {"snapshot_seq": seq}


def _list_symbols(kind: str, family: str) -> Handler:
    def run(rt: MetaRuntime, cmd: _Listing, params: Params, seq: int) -> Outcome:
        items = [{"name": n, "ref": r, "kind": kind, "description": s.get("description")}
                 for n, r, s in rt.environment.symbols_of(kind)]
        return _paged(rt, family, items, cmd, params, seq, [family])
    return run


def _list_policies(rt: MetaRuntime, cmd: ast.ListEpistemicPolicies, params: Params, seq: int) -> Outcome:
    items = [{**p.identity(), "description": p.description, "default": p.id == rt.config.default_policy}
             for p in sorted(POLICIES.values(), key=lambda p: p.id)]
    return _paged(rt, "LIST EPISTEMIC POLICIES", items, cmd, params, seq, ["LIST EPISTEMIC POLICIES"])


def _search(rt: MetaRuntime, cmd: ast.Search, params: Params, seq: int) -> Outcome:
    kind = cmd.kind.lower()
    if kind not in ("concept", "proposition", "assertion", "evidence"):
        raise KipError("UnsupportedCapability", f"SEARCH {cmd.kind} is not served (CONCEPT, PROPOSITION, ASSERTION, "
                       "EVIDENCE are)", details={"family": "SEARCH", "target": cmd.kind})
    term = resolve(cmd.term, params)
    if not isinstance(term, str):
        raise KipError("TypeMismatch", "the SEARCH term must be a string")
    mode = resolve(cmd.mode, params) if cmd.mode is not None else "keyword"
    if mode in ("semantic", "hybrid"):
        raise KipError("SearchModeUnsupported", f"SEARCH MODE {mode!r} is not supported; only \"keyword\" is",
                       details={"supported": ["keyword"]})
    if mode != "keyword":
        raise KipError("ConstraintViolation", 'SEARCH MODE must be "keyword", "semantic" or "hybrid"')
    type_filter = predicate_filter = None
    if cmd.with_type is not None:
        if kind != "concept":
            raise KipError("ConstraintViolation", "WITH TYPE applies to SEARCH CONCEPT only")
        ref, _ = rt.environment.resolve(check_string(resolve(cmd.with_type, params), "WITH TYPE"), "ConceptType")
        type_filter = ref.rsplit("/", 1)[1]
    if cmd.with_predicate is not None:
        if kind not in ("proposition", "assertion"):
            raise KipError("ConstraintViolation", "WITH PREDICATE applies to SEARCH PROPOSITION or ASSERTION only")
        ref, _ = rt.environment.resolve(check_string(resolve(cmd.with_predicate, params), "WITH PREDICATE"), "Predicate")
        predicate_filter = ref.rsplit("/", 1)[1]
    threshold = check_threshold(resolve(cmd.threshold, params)) if cmd.threshold is not None else None
    at = _as_of(rt, cmd.as_of_seq, params, seq)
    limit = check_limit(resolve(cmd.limit, params)) if cmd.limit is not None else DEFAULT_SEARCH_LIMIT
    if limit > MAX_LIMIT:
        raise KipError("ResultLimitExceeded", f"LIMIT may not exceed {MAX_LIMIT}", details={"max": MAX_LIMIT})
    binding = ["SEARCH", kind, term, type_filter, predicate_filter, threshold, limit]
    offset = 0
    if cmd.cursor is not None:
        at, offset = rt.cursors.decode(check_cursor(resolve(cmd.cursor, params)), "SEARCH", binding)
    hits, more = grounding.top(rt.nexus, kind, term, at, type_filter=type_filter, predicate_filter=predicate_filter,
                               threshold=threshold, skip=offset, count=limit)
    page = [grounding.hit(rt.nexus, eid, score) for score, eid in hits]
    result: Result = {"hits": page}
    if more:
        result["next_cursor"] = rt.cursors.encode("SEARCH", binding, at, offset + limit)
    context: Result = {"snapshot_seq": at, "search": {"index_seq": at, "current_space_seq": rt.nexus.head,
                                                      "consistency": "synchronous", "mode": "keyword",
                                                      "score_semantics": grounding.SCORE_SEMANTICS}}
    return result, context


def _plain(fn: Callable[[MetaRuntime, _C, Params, int], Result]) -> Callable[[MetaRuntime, _C, Params, int], Outcome]:
    def run(rt: MetaRuntime, cmd: _C, params: Params, seq: int) -> Outcome:
        return fn(rt, cmd, params, seq), {}
    return run


_HANDLERS: dict[type[ast.MetaCommand], Handler] = {
    ast.DescribePrimer: _plain(_primer),
    ast.DescribeProtocol: _plain(_protocol),
    ast.DescribeCapabilities: _plain(_capabilities),
    ast.DescribeSpace: _plain(_space),
    ast.DescribeSchemaEnvironment: lambda rt, c, p, s: (_schema_env(rt, c, p, s),
                                                        {"snapshot_seq": _as_of(rt, c.as_of_seq, p, s)}),
    ast.DescribeType: _plain(_describe_symbol("TYPE")),
    ast.DescribePredicate: _plain(_describe_symbol("PREDICATE")),
    ast.DescribeEpistemicPolicy: _plain(_policy),
    ast.DescribeSnapshot: _plain(_snapshot),
    ast.ListTypes: _list_symbols("ConceptType", "LIST TYPES"),
    ast.ListPredicates: _list_symbols("Predicate", "LIST PREDICATES"),
    ast.ListEpistemicPolicies: _list_policies,
    ast.Search: _search,
}
