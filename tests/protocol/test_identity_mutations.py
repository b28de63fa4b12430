"""Random byte and field mutations of valid signed envelopes are rejected with a spec code, never a crash.

Fixtures are the signed envelopes of tests/vectors/agent-knowledge-1.0.vectors.json.
"""

from __future__ import annotations

import copy
import json

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from akrelay.protocol.envelope import verify_envelope
from akrelay.protocol.errors import HTTP_STATUS, ProtocolError
from akrelay.protocol.jcs import canonicalize
from akrelay.protocol.payload import check_payload_rules

from identity_support import FIXTURES, fixture_envelope, fixture_signer, to_bytes

STEP1_CODES = {"invalid_event", "invalid_event_hash", "invalid_signature"}
SPEC_CODES = set(HTTP_STATUS)
def _verifies(name: str) -> bool:
    try:
        verify_envelope(to_bytes(FIXTURES[name]["envelope"]))
    except ProtocolError:
        return False
    return True


VALID = sorted(name for name in FIXTURES if _verifies(name))
SCALARS = st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False) | st.text(max_size=8)
VALUES = st.recursive(
    SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=6
)
# What a signer can sign: no NaN/Infinity (JCS cannot write them), integers of any size.
SIGNABLE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=6,
)
SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _paths(value, prefix=()):
    """Every (container path, key) inside ``value``."""
    out = []
    if isinstance(value, dict):
        for key, item in value.items():
            out.append(prefix + (key,))
            out.extend(_paths(item, prefix + (key,)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out.append(prefix + (index,))
            out.extend(_paths(item, prefix + (index,)))
    return out


def _get(value, path):
    for key in path:
        value = value[key]
    return value


def _same_json(a, b) -> bool:
    try:
        return canonicalize(a) == canonicalize(b)
    except ValueError:
        return False


@SETTINGS
@given(st.sampled_from(VALID), st.data())
def test_single_byte_mutations_are_rejected_or_harmless(name, data):
    raw = to_bytes(FIXTURES[name]["envelope"])
    index = data.draw(st.integers(0, len(raw) - 1))
    how = data.draw(st.sampled_from(["replace", "delete", "insert"]))
    byte = data.draw(st.integers(0, 255))
    if how == "replace":
        assume(raw[index] != byte)
        mutated = raw[:index] + bytes([byte]) + raw[index + 1 :]
    elif how == "delete":
        mutated = raw[:index] + raw[index + 1 :]
    else:
        mutated = raw[:index] + bytes([byte]) + raw[index:]
    try:
        envelope = verify_envelope(mutated)
    except ProtocolError as err:
        assert err.code in STEP1_CODES
        return
    # Only a change that leaves the JSON value identical (e.g. whitespace) may pass.
    assert envelope.id == FIXTURES[name]["envelope"]["hash"]
    assert _same_json(envelope.to_dict(), FIXTURES[name]["envelope"])


@SETTINGS
@given(st.sampled_from(VALID), st.data())
def test_field_mutations_without_resigning_are_always_rejected(name, data):
    original = fixture_envelope(name)
    mutated = copy.deepcopy(original)
    action = data.draw(st.sampled_from(["set", "remove", "add"]))
    paths = _paths(mutated)
    if action == "add":
        paths = [p for p in paths if isinstance(_get(mutated, p), (dict, list))]
    path = data.draw(st.sampled_from(paths))
    parent = _get(mutated, path[:-1])
    if action == "set":
        value = data.draw(VALUES)
        assume(not _same_json(value, parent[path[-1]]))
        parent[path[-1]] = value
    elif action == "remove":
        del parent[path[-1]]
    else:
        target = parent[path[-1]]
        if isinstance(target, dict):
            key = data.draw(st.text(max_size=6))
            assume(key not in target)
            target[key] = data.draw(VALUES)
        else:
            target.insert(data.draw(st.integers(0, len(target))), data.draw(VALUES))
    for raw in (to_bytes(mutated), mutated):
        try:
            verify_envelope(raw)
        except ProtocolError as err:
            assert err.code in STEP1_CODES
        else:
            raise AssertionError(f"mutation at {path} ({action}) was accepted")


@SETTINGS
@given(st.sampled_from(VALID), st.data())
def test_resigned_payload_mutations_get_a_spec_code_or_pass_every_check(name, data):
    original = fixture_envelope(name)
    event = copy.deepcopy(original["event"])
    path = ("payload",) + data.draw(st.sampled_from(_paths(event["payload"]) or [()]))
    assume(len(path) > 1)
    parent = _get(event, path[:-1])
    if data.draw(st.booleans()):
        parent[path[-1]] = data.draw(SIGNABLE)
    else:
        del parent[path[-1]]
    signed = fixture_signer(name).sign(event)
    try:
        envelope = verify_envelope(to_bytes(signed))
        check_payload_rules(envelope)
    except ProtocolError as err:
        assert err.code in SPEC_CODES
        assert err.code != "invalid_event_hash" and err.code != "invalid_signature"
        assert err.message
        return
    assert envelope.id == signed["hash"]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(VALID), st.binary(min_size=1, max_size=8), st.data())
def test_truncated_or_extended_texts_are_rejected(name, junk, data):
    raw = to_bytes(FIXTURES[name]["envelope"])
    cut = data.draw(st.integers(1, len(raw) - 1))
    for mutated in (raw[:cut], raw + junk):
        try:
            envelope = verify_envelope(mutated)
        except ProtocolError as err:
            assert err.code == "invalid_event"
        else:
            assert json.loads(mutated) == FIXTURES[name]["envelope"]  # only trailing whitespace
            assert envelope.id == FIXTURES[name]["envelope"]["hash"]
