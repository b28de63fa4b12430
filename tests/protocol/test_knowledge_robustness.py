"""Bad input to every knowledge-layer entry point gets a ProtocolError with the
specified code, never another exception (hypothesis-generated inputs)."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akrelay.protocol.discovery import validate_discovery
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.query import PARAMETER_NAMES, parse_query
from akrelay.protocol.reads import parse_batch_request, parse_read_json, parse_search_request
from akrelay.protocol.records import validate_batch_response, validate_query_response, validate_search_response
from knowledge_model import FixtureService
from knowledge_vectors import SERVICE

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**60, 2**60), st.floats(allow_nan=False, allow_infinity=False),
                 st.text(max_size=8), st.sampled_from(["lexical", "semantic", "A" * 43, SERVICE, "https://x.example",
                                                       "ranked-search", "knowledge.publish", "en"]))
JSON = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                  st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=8)


def _code(fn, *args):
    try:
        fn(*args)
        return "valid"
    except ProtocolError as exc:
        return exc.code


@SETTINGS
@given(st.lists(st.tuples(st.one_of(st.sampled_from(sorted(PARAMETER_NAMES)), st.text(max_size=6)),
                          st.one_of(st.text(max_size=12), st.sampled_from(["1", "0", "9007199254740991", "A" * 43]))),
                max_size=5))
def test_parse_query_never_crashes(pairs):
    assert _code(parse_query, pairs) in ("valid", "invalid_request")


@SETTINGS
@given(st.one_of(st.binary(max_size=40), st.text(max_size=40)))
def test_parse_read_json_never_crashes(raw):
    assert _code(parse_read_json, raw) in ("valid", "invalid_request")


@SETTINGS
@given(JSON)
def test_batch_request_never_crashes(value):
    assert _code(parse_batch_request, value) in ("valid", "invalid_request")


@SETTINGS
@given(st.one_of(JSON, st.fixed_dictionaries({"text": JSON, "mode": JSON},
                                             optional={"filters": JSON, "limit": JSON})))
def test_search_request_never_crashes(value):
    assert _code(parse_search_request, value, ("lexical", "semantic")) in (
        "valid", "invalid_request", "unsupported_search_mode")


@SETTINGS
@given(st.one_of(JSON, st.fixed_dictionaries(
    {"protocol": st.just("agent-knowledge/1.0"), "service": st.just(SERVICE)},
    optional={"features": JSON, "endpoints": JSON, "search_modes": JSON, "peers": JSON, "limits": JSON})))
def test_discovery_never_crashes(doc):
    assert _code(validate_discovery, doc, SERVICE) in ("valid", "invalid_discovery")


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _mutate(data, response):
    response = copy.deepcopy(response)
    paths = [p for p in _paths(response) if p]
    path = data.draw(st.sampled_from(paths))
    parent = response
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()):
        parent[path[-1]] = data.draw(JSON)
    else:
        del parent[path[-1]]
    return response


SERVICE_MODEL = FixtureService(["text_publication", "text_regional", "text_assessment", "text_retraction"])
HASHES = [r["envelope"]["hash"] for r in SERVICE_MODEL.records.values()]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_response_checks_never_crash(data):
    which = data.draw(st.sampled_from(["query", "batch", "search"]))
    if which == "query":
        request = parse_query([("limit", "3")])
        response = _mutate(data, SERVICE_MODEL.query(request))
        code = _code(validate_query_response, response, request, SERVICE)
    elif which == "batch":
        response = _mutate(data, SERVICE_MODEL.batch(HASHES))
        code = _code(validate_batch_response, response, HASHES, SERVICE)
    else:
        request = parse_search_request({"text": "alpha", "mode": "lexical"})
        response = _mutate(data, SERVICE_MODEL.search(request, HASHES, {"mode": "lexical", "id": "x"},
                                                      {"exhaustive": True, "reasons": []}))
        code = _code(validate_search_response, response, request, SERVICE)
    assert code in ("valid", "invalid_response")
