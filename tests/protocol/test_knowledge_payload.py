"""Payload structure and semantic rules: every error path, and agreement with the
JSON Schema on hypothesis-generated mutations of every fixture payload."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.options import ValidationOptions
from akrelay.protocol.payload import (
    check_payload_rules, check_payload_structure, https_url_problem, is_canonical_id,
)
from knowledge_vectors import FIXTURES, SCHEMA_PATH, from_dict, raw_envelope

SCHEMA = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
STRICT = ValidationOptions(allow_legacy_retract=False)
DEFINITION = {"knowledge.publish": "publishPayload", "knowledge.assess": "assessPayload",
              "knowledge.retract": "retractPayload"}
VALIDATORS = {t: jsonschema.Draft202012Validator({"$ref": "#/$defs/" + d, "$defs": SCHEMA["$defs"]})
              for t, d in DEFINITION.items()}


def structure_code(event_type, payload, options=STRICT):
    try:
        check_payload_structure(event_type, payload, options)
        return "valid"
    except ProtocolError as exc:
        return exc.code


def rules_code(item, options=STRICT):
    try:
        check_payload_structure(item["event"]["type"], item["event"]["payload"], options)
        check_payload_rules(from_dict(item), options)
        return "valid"
    except ProtocolError as exc:
        return exc.code


# -- every named rule, one failing example each ----------------------------

def _publish():
    return raw_envelope("original")


def _resource():
    return raw_envelope("research_data")


def _collection():
    return raw_envelope("research_collection")


def _applied():
    return raw_envelope("research_applied")


def _set(item, path, value):
    parent = item["event"]["payload"]
    for key in path[:-1]:
        parent = parent[key]
    if value is _REMOVE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return item


_REMOVE = object()
STRUCTURE_ERRORS = [
    ("payload not an object", _publish, (), None),
    ("unknown member", _publish, ("truth",), True),
    ("missing title", _publish, ("title",), _REMOVE),
    ("title not a string", _publish, ("title",), 1),
    ("empty basis", _publish, ("basis",), ""),
    ("unknown kind", _publish, ("kind",), "fact"),
    ("kind as list", _publish, ("kind",), ["question"]),
    ("language underscore", _publish, ("language",), "en_US"),
    ("language one letter", _publish, ("language",), "e"),
    ("context not object", _publish, ("context",), "ctx"),
    ("context missing scope", _publish, ("context", "scope"), _REMOVE),
    ("conditions not list", _publish, ("context", "conditions"), "c"),
    ("conditions empty item", _publish, ("context", "conditions"), [""]),
    ("limitations repeated", _publish, ("context", "limitations"), ["x", "x"]),
    ("tags not list", _publish, ("tags",), "cache"),
    ("tag uppercase", _publish, ("tags",), ["Cache"]),
    ("tag too long", _publish, ("tags",), ["a" * 65]),
    ("tags repeated", _publish, ("tags",), ["a", "a"]),
    ("evidence not list", _publish, ("evidence",), {}),
    ("evidence item not object", _publish, ("evidence",), ["https://example.com/"]),
    ("evidence http url", _publish, ("evidence",), [{"url": "http://example.com/", "description": "d"}]),
    ("evidence missing description", _publish, ("evidence",), [{"url": "https://example.com/"}]),
    ("evidence bad digest shape", _publish, ("evidence",), [{"url": "https://e.com/", "description": "d", "digest": "x"}]),
    ("evidence empty media type", _publish, ("evidence",), [{"url": "https://e.com/", "description": "d", "media_type": ""}]),
    ("evidence unknown role", _publish, ("evidence",), [{"url": "https://e.com/", "description": "d", "role": "artifact"}]),
    ("output without digest", _publish, ("evidence",), [{"url": "https://e.com/", "description": "d", "role": "output"}]),
    ("evidence repeated", _publish, ("evidence",), [{"url": "https://e.com/", "description": "d"}] * 2),
    ("reproduction not object", _publish, ("reproduction",), []),
    ("steps empty", _publish, ("reproduction", "steps"), []),
    ("steps item empty", _publish, ("reproduction", "steps"), [""]),
    ("observed empty", _publish, ("reproduction", "observed"), ""),
    ("relations not list", _publish, ("relations",), {}),
    ("relation unknown", _publish, ("relations",), [{"relation": "endorses", "target": "A" * 43}]),
    ("relation target shape", _publish, ("relations",), [{"relation": "supports", "target": "A" * 42}]),
    ("relation pair repeated", _publish, ("relations",), [{"relation": "supports", "target": "A" * 43}] * 2),
    ("contains outside collection", _publish, ("relations",), [{"relation": "contains", "target": "A" * 43}]),
    ("profiles not list", _publish, ("profiles",), {}),
    ("profile data not object", _publish, ("profiles",), [{"profile": {"url": "https://e.com/", "digest": "A" * 43}, "data": []}]),
    ("profile reference closed", _publish, ("profiles",), [{"profile": {"url": "https://e.com/", "digest": "A" * 43, "v": 1}, "data": {}}]),
    ("identical profiles", _publish, ("profiles",), [{"profile": {"url": "https://e.com/", "digest": "A" * 43}, "data": {"a": [1]}}] * 2),
    ("extra not object", _publish, ("extra",), []),
    ("license http", _publish, ("license",), "http://example.com/"),
    ("resource without output", _resource, ("evidence",), [{"url": "https://e.com/", "description": "d", "digest": "A" * 43}]),
    ("resource without evidence", _resource, ("evidence",), _REMOVE),
    ("collection without contains", _collection, ("relations",), [{"relation": "derived_from", "target": "A" * 43}]),
    ("applied without reproduction", _applied, ("reproduction",), _REMOVE),
    ("applied without observed", _applied, ("reproduction", "observed"), _REMOVE),
    ("unknown verdict", _applied, ("verdict",), "true"),
    ("assessment target shape", _applied, ("target",), "nope"),
    ("assessment kind member", _applied, ("kind",), "question"),
]


@pytest.mark.parametrize("name,make,path,value", STRUCTURE_ERRORS, ids=[e[0] for e in STRUCTURE_ERRORS])
def test_structure_error(name, make, path, value):
    item = make()
    if path:
        _set(item, path, value)
        payload = item["event"]["payload"]
    else:
        payload = "not an object"
    assert structure_code(item["event"]["type"], payload) == "invalid_event"
    # and the bundled schema agrees that it is invalid
    assert not VALIDATORS[item["event"]["type"]].is_valid(payload)


def test_unknown_event_type():
    assert structure_code("knowledge.vote", {}) == "invalid_event"


RULE_ERRORS = [
    ("license with userinfo-free but bad port", _publish, ("license",), "https://example.com:65536/"),
    ("license with space", _publish, ("license",), "https://exa mple.com/"),
    ("license with backslash", _publish, ("license",), "https://example.com\\x/"),
    ("long uncached url with bad port", _publish, ("license",), "https://example.com:70000/" + "a" * 600),
    ("evidence bad ipv6", _publish, ("evidence",), [{"url": "https://[zz]/", "description": "d"}]),
    ("evidence noncanonical digest", _publish, ("evidence",), [{"url": "https://e.com/", "description": "d", "digest": "A" * 42 + "B"}]),
    ("relation noncanonical target", _publish, ("relations",), [{"relation": "supports", "target": "A" * 42 + "B"}]),
    ("profile noncanonical digest", _publish, ("profiles",), [{"profile": {"url": "https://e.com/", "digest": "A" * 42 + "B"}, "data": {}}]),
    ("profile url port", _publish, ("profiles",), [{"profile": {"url": "https://e.com:99999/", "digest": "A" * 43}, "data": {}}]),
    ("duplicate profile digest", _publish, ("profiles",), [
        {"profile": {"url": "https://e.com/a", "digest": "A" * 43}, "data": {}},
        {"profile": {"url": "https://e.com/b", "digest": "A" * 43}, "data": {}}]),
    ("assessment noncanonical target", _applied, ("target",), "A" * 42 + "B"),
]


@pytest.mark.parametrize("name,make,path,value", RULE_ERRORS, ids=[e[0] for e in RULE_ERRORS])
def test_rule_error(name, make, path, value):
    item = _set(make(), path, value)
    assert structure_code(item["event"]["type"], item["event"]["payload"]) == "valid"  # schema-level valid
    assert rules_code(item) == "invalid_event"


def test_retraction_target_must_be_canonical():
    item = raw_envelope("retract_original")
    item["event"]["payload"]["target"] = "A" * 42 + "B"
    assert rules_code(item) == "invalid_event"


def test_legacy_retraction_switch_in_rules():
    item = raw_envelope("retract_original")
    del item["event"]["payload"]["license"]
    assert rules_code(item, ValidationOptions()) == "valid"
    assert rules_code(item, STRICT) == "invalid_event"
    # the switch does not relax a present licence
    item["event"]["payload"]["license"] = "http://example.com/"
    assert rules_code(item, ValidationOptions()) == "invalid_event"


@pytest.mark.parametrize("url", ["https://example.com", "https://example.com:8443/a?b#c", "https://[::1]/",
                                 "https://xn--bcher-kva.example/", "https://a{b}.example/", "https://example.com:/"])
def test_good_urls(url):
    assert https_url_problem(url) is None


def test_canonical_id_trailing_bits():
    assert is_canonical_id("A" * 43)
    assert not is_canonical_id("A" * 42 + "B")
    assert all(is_canonical_id(f["envelope"]["hash"]) for f in FIXTURES.values())


# -- agreement with the schema on generated mutations -----------------------

JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 1.0]),
    st.text(max_size=4), st.sampled_from([
        "", "en", "en-US", "en_US", "https://example.com/x", "http://example.com", "A" * 43, "question",
        "resource", "collection", "contains", "supports", "output", "reproduced", "applied", "cache", "Cache",
    ]),
)
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["url", "description", "digest", "role", "relation",
                                                                    "target", "x"]), inner, max_size=3)), max_leaves=6)
PAYLOAD_NAMES = sorted(n for n in FIXTURES if "payload" in FIXTURES[n]["envelope"]["event"])


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_structure_matches_schema_on_mutations(data):
    name = data.draw(st.sampled_from(PAYLOAD_NAMES))
    event = FIXTURES[name]["envelope"]["event"]
    payload = copy.deepcopy(event["payload"])
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(payload) if p]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = payload
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["set", "remove", "add", "dup"]))
        if action == "remove":
            del parent[path[-1]]
        elif action == "set":
            parent[path[-1]] = data.draw(JSON_VALUE)
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.sampled_from(["extra_member", "evidence", "relations", "tags", "observed"]))] = data.draw(JSON_VALUE)
        elif action == "dup" and isinstance(parent[path[-1]], list) and parent[path[-1]]:
            parent[path[-1]].append(copy.deepcopy(parent[path[-1]][0]))
    expected = VALIDATORS[event["type"]].is_valid(payload)
    assert (structure_code(event["type"], payload) == "valid") is expected, payload
    if expected:  # the semantic layer must answer with a code too, never crash
        item = {"hash": "A" * 43, "signature": "A" * 86, "event": {**event, "payload": payload}}
        assert rules_code(item) in ("valid", "invalid_event")


def test_repeated_profile_digest_with_pathological_nesting_gets_a_code():
    root = cur = {}
    for _ in range(5000):
        cur["a"] = {}
        cur = cur["a"]
    binding = {"profile": {"url": "https://e.com/", "digest": "A" * 43}, "data": root}
    item = _set(_publish(), ("profiles",), [binding, dict(binding)])
    assert structure_code("knowledge.publish", item["event"]["payload"]) == "invalid_event"
