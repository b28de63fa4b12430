"""Strict I-JSON parsing and RFC 8785 JCS, checked against independent implementations.

The PyPI ``rfc8785`` package is the independent JCS oracle (test-only).
"""

from __future__ import annotations

import json
import math

import pytest
import rfc8785
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.ijson import MAX_SAFE_INTEGER, parse_strict, parse_strict_for_jcs
from akrelay.protocol.jcs import (
    JCSError,
    canonicalize,
    canonicalize_reference,
    dumps_sorted,
    fast_path_applies,
    number_to_string,
)

SAFE_INTS = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
FLOATS = st.floats(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER, allow_nan=False)
# Keys deliberately mix ASCII, BMP above U+E000 and astral characters: that is
# exactly where code-point order and UTF-16 order disagree.
KEYS = st.text(alphabet=st.sampled_from("aAzZ_09é！\ue000\uffff😀\U0001f600\U00010000\x00\x1f\"\\"), max_size=4) | st.text(
    max_size=6
)
SCALARS = st.none() | st.booleans() | SAFE_INTS | FLOATS | st.text()
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=30,
)
JSON_NO_FLOATS = st.recursive(
    st.none() | st.booleans() | SAFE_INTS | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=30,
)


# -- JCS ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_jcs_equals_the_independent_rfc8785_package(value):
    expected = rfc8785.dumps(value)
    assert canonicalize_reference(value) == expected
    assert canonicalize(value) == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_jcs_is_idempotent_through_the_strict_parser(value):
    once = canonicalize(value)
    assert canonicalize(parse_strict(once)) == once
    assert canonicalize_reference(parse_strict(once)) == once


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_fast_path_equals_the_full_implementation_whenever_it_is_taken(value):
    if fast_path_applies(value):
        assert dumps_sorted(value) == canonicalize_reference(value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON_NO_FLOATS.filter(fast_path_applies))
def test_fast_path_is_taken_for_typical_values(value):
    assert dumps_sorted(value) == rfc8785.dumps(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_parser_flag_is_only_set_when_the_fast_path_is_exact(value):
    text = json.dumps(value, ensure_ascii=False)
    parsed, plain_is_jcs = parse_strict_for_jcs(text.encode("utf-8"))
    if plain_is_jcs:
        assert dumps_sorted(parsed) == canonicalize_reference(parsed)
    ascii_text = json.dumps(value, ensure_ascii=True)
    parsed, plain_is_jcs = parse_strict_for_jcs(ascii_text)
    if plain_is_jcs:
        assert dumps_sorted(parsed) == canonicalize_reference(parsed)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"a": 1.5e-07}, "a non-integral number: float formats differ between encoders"),
        ({"a": 1e21}, "msgspec writes 1e21, ECMAScript 1e+21"),
        ({"a": 1e16}, "msgspec writes 1e16, ECMAScript 10000000000000000"),
        ({"\ue000": 1, "😀": 2}, "UTF-16 order puts the astral key first"),
    ],
)
def test_fast_path_is_refused_where_it_would_be_wrong(value, why):
    assert not fast_path_applies(value), why
    assert canonicalize(value) == rfc8785.dumps(value)


def test_the_plain_dump_really_differs_in_those_cases():
    assert dumps_sorted({"\ue000": 1, "😀": 2}) != rfc8785.dumps({"\ue000": 1, "😀": 2})
    assert dumps_sorted([1e16]) != rfc8785.dumps([1e16])
    assert dumps_sorted([1e21]) != rfc8785.dumps([1e21])


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (0.0, "0"), (-0.0, "0"), (1.0, "1"), (-1.5, "-1.5"), (1e21, "1e+21"), (1e20, "100000000000000000000"),
        (1e-6, "0.000001"), (1e-7, "1e-7"), (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"),
        (123456789.125, "123456789.125"), (0.1, "0.1"), (2**53, "9007199254740992"), (4.35, "4.35"),
        (333333333.33333329, "333333333.3333333"), (1e23, "1e+23"),
    ],
)
def test_ecmascript_number_serialization(number, text):
    assert number_to_string(number) == text


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_number_serialization_matches_rfc8785_on_every_double(number):
    assert number_to_string(number) == rfc8785.dumps(number).decode()
    assert float(number_to_string(number)) == number


def test_jcs_refuses_values_outside_the_json_model():
    for bad in (math.nan, math.inf, {1: "x"}, {"a": object()}, "\ud800", {"\udc00": 1}):
        with pytest.raises(JCSError):
            canonicalize(bad)


def test_jcs_string_escaping_is_minimal():
    value = "\"\\\b\f\n\r\t\x00\x1f\x7f\u2028é😀/"
    assert canonicalize([value]) == rfc8785.dumps([value])
    assert canonicalize([value]) == ('["\\"\\\\\\b\\f\\n\\r\\t\\u0000\\u001f\x7f\u2028é😀/"]').encode("utf-8")


# -- strict parsing -------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_every_json_value_round_trips_through_the_strict_parser(value):
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        parsed = parse_strict(text.encode("utf-8"))
        assert parsed == value
        assert canonicalize(parsed) == canonicalize(value)


def _has_object(value):
    if isinstance(value, dict):
        return True
    if isinstance(value, list):
        return any(_has_object(v) for v in value)
    return False


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, JSON, min_size=1, max_size=4), st.data())
def test_duplicate_member_names_are_rejected_at_any_depth(obj, data):
    key = data.draw(st.sampled_from(sorted(obj)))
    duplicate = json.dumps(key) + ":" + json.dumps(obj[key])
    inner = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in obj.items()) + "," + duplicate + "}"
    depth = data.draw(st.integers(min_value=0, max_value=3))
    text = inner
    for level in range(depth):
        text = '{"level%d":[%s]}' % (level, text)
    with pytest.raises(ProtocolError) as err:
        parse_strict(text)
    assert err.value.code == "invalid_event"
    assert "duplicate member name" in err.value.message


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(min_value=MAX_SAFE_INTEGER + 1, max_value=10**400).flatmap(lambda n: st.sampled_from([n, -n])),
    st.integers(min_value=0, max_value=2),
)
def test_integers_outside_the_safe_range_are_rejected(number, depth):
    text = "[" * depth + json.dumps({"n": number}) + "]" * depth
    with pytest.raises(ProtocolError) as err:
        parse_strict(text, code="invalid_request")
    assert err.value.code == "invalid_request"


@pytest.mark.parametrize(
    "text",
    [
        "[NaN]", "[Infinity]", "[-Infinity]", "[1e400]", "[-1e400]", "[1e16]", "[9007199254740992.0]",
        '{"a":1} x', "[1,]", "{'a':1}", "", " ", "[01]", '["\\ud800"]', '["\\udc00x"]', '{"\\ud83d":1}',
        '["a\\ud83d\\ud83d"]', '["\x01"]', "\ufeff[]", "[" * 5000 + "]" * 5000, "[1" + "0" * 5000 + "]",
    ],
)
def test_strict_parser_rejections(text):
    with pytest.raises(ProtocolError) as err:
        parse_strict(text)
    assert err.value.code == "invalid_event"
    assert err.value.message.startswith("invalid JSON")


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"[\"\xff\"]", "invalid UTF-8"),
        (b"[\"\xed\xa0\x80\"]", "UTF-8 encoded surrogate"),
        (b"[\"\xc0\xaf\"]", "overlong encoding"),
        (b"\xef\xbb\xbf[]", "UTF-8 byte order mark"),
        (b"\xff\xfe[\x00]\x00", "UTF-16 text is not accepted"),
    ],
)
def test_strict_parser_rejects_bad_bytes(data, why):
    with pytest.raises(ProtocolError) as err:
        parse_strict(data)
    assert err.value.code == "invalid_event", why


def test_raw_surrogates_in_str_input_are_rejected():
    with pytest.raises(ProtocolError):
        parse_strict('["\ud800"]')


def test_numbers_are_values_integral_doubles_become_integers():
    assert parse_strict("[1.0, 1e2, -0.0, 0.5, 1E-2, 9007199254740991.0]") == [1, 100, 0, 0.5, 0.01, MAX_SAFE_INTEGER]
    assert [type(x) for x in parse_strict("[1.0, 1e2, 0.5]")] == [int, int, float]
    assert parse_strict("[1e-400]") == [0]  # underflow is rounding, not overflow


def test_non_json_input_types_are_rejected_with_the_code():
    for bad in (None, 12, ["[]"]):
        with pytest.raises(ProtocolError) as err:
            parse_strict(bad, code="invalid_request")
        assert err.value.code == "invalid_request"


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=60) | st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_arbitrary_bytes_only_ever_raise_protocol_errors(data):
    try:
        value = parse_strict(data)
    except ProtocolError as err:
        assert err.code == "invalid_event"
        return
    assert value == json.loads(data.decode("utf-8"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON, st.integers(min_value=0, max_value=10_000), st.sampled_from(["\\ud800", "\\udfff", "\\uDBFF", "\\ud83d"]))
def test_unpaired_surrogate_escapes_are_rejected_wherever_they_appear(value, where, escape):
    text = json.dumps(value)
    # Put the escape inside some string literal (a key or a value), if there is one.
    starts = [i for i, ch in enumerate(text) if ch == '"' and (i == 0 or text[i - 1] != "\\")][::2]
    assume(starts)
    position = starts[where % len(starts)] + 1
    mutated = text[:position] + escape + "x" + text[position:]
    with pytest.raises(ProtocolError):
        parse_strict(mutated)


def test_fast_serializer_escapes_every_character_like_jcs():
    # Every Unicode scalar value, one string each (in chunks to keep it quick).
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for start in range(0, len(chars), 4096):
        chunk = chars[start : start + 4096]
        assert dumps_sorted(chunk) == rfc8785.dumps(chunk)


def test_fast_serializer_refuses_lone_surrogates():
    with pytest.raises(JCSError):
        dumps_sorted(["\ud800"])
