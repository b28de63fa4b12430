"""JSON Canonicalization Scheme (RFC 8785).

The event ID is a hash of these bytes, so every implementation must produce
them identically. Two serializers live here:

* :func:`canonicalize_reference` follows RFC 8785 step by step: member names
  sorted by UTF-16 code units, ECMAScript ``Number::toString`` for numbers,
  the minimal JSON string escaping.
* :func:`dumps_sorted` is msgspec's C encoder with sorted keys. It equals the
  reference exactly when the value holds no non-integral number (its float
  format is not ECMAScript's) and no member name with an astral character
  (code-point order and UTF-16 order differ only there). The equality is
  checked on the vectors and by property tests.

:func:`canonicalize` picks the fast path when it is provably equal.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

MAX_SAFE_INTEGER = 2**53 - 1

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
for _code in range(0x20):
    _ESCAPES.setdefault(chr(_code), f"\\u{_code:04x}")
del _code
_RAW_SURROGATE = re.compile("[\ud800-\udfff]")
_NEEDS_ESCAPE = re.compile('[\x00-\x1f"\\\\]')

# msgspec's sorted encoder writes the same bytes as JCS for strings, integers,
# booleans and null (every character's escaping is checked in the tests); it
# sorts member names by code point and formats floats its own way, hence the
# conditions below.
_FAST = msgspec.json.Encoder(order="sorted")


class JCSError(ValueError):
    """The value is outside the JSON data model JCS is defined over."""


def number_to_string(value: float | int) -> str:
    """ECMAScript ``Number::toString`` (ECMA-262 §7.1.12.1) of a finite double."""
    if type(value) is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return str(value)
        value = float(value)
    if not math.isfinite(value):
        raise JCSError("JCS cannot represent NaN or Infinity")
    if value == 0:
        return "0"
    if value < 0:
        return "-" + number_to_string(-value)
    # repr() gives the shortest round-tripping digits, as ECMAScript requires.
    mantissa, _, exponent = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    # value = 0.digits × 10^n
    n = len(whole) + (int(exponent) if exponent else 0) - (len(whole + fraction) - len(digits))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    sign = "+" if e >= 0 else "-"
    head = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(e)}"


def _string(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise JCSError("JCS strings must be valid Unicode (unpaired surrogate)") from None
    return '"' + _NEEDS_ESCAPE.sub(lambda match: _ESCAPES[match.group()], value) + '"'


def _utf16_key(name: str) -> bytes:
    return name.encode("utf-16-be")


def _serialize(value: object, out: list[str], depth: int) -> None:
    # ``type(v) is ...``, not isinstance: bool must not pass as int, nor a subclass as its base. This is the
    # reference path (canonicalize takes the fast one whenever it is exact), so it narrows at each test.
    if depth > 1000:
        raise JCSError("value nests too deeply")
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif type(value) is str:
        out.append(_string(value))
    elif type(value) is int or type(value) is float:
        out.append(number_to_string(value))
    elif type(value) is dict:
        for key in value:
            if type(key) is not str:
                raise JCSError("JCS member names must be strings")
            if not key.isascii() and _RAW_SURROGATE.search(key):
                raise JCSError("JCS member names must be valid Unicode (unpaired surrogate)")
        out.append("{")
        first = True
        for key in sorted(value, key=_utf16_key):
            if not first:
                out.append(",")
            first = False
            out.append(_string(key))
            out.append(":")
            _serialize(value[key], out, depth + 1)
        out.append("}")
    elif type(value) is list or type(value) is tuple:
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _serialize(item, out, depth + 1)
        out.append("]")
    else:
        raise JCSError(f"JCS cannot serialize a {type(value).__name__}")


def canonicalize_reference(value: object) -> bytes:
    """RFC 8785 canonical UTF-8 bytes of a JSON value, written out rule by rule."""
    out: list[str] = []
    _serialize(value, out, 0)
    return "".join(out).encode("utf-8")


def dumps_sorted(value: object) -> bytes:
    """The fast serializer; equal to JCS only under the conditions in the module docstring."""
    try:
        return _FAST.encode(value)
    except (TypeError, ValueError, OverflowError, UnicodeError) as exc:
        raise JCSError(f"value is outside the JSON model: {exc}") from None


def fast_path_applies(value: object) -> bool:
    """True when :func:`dumps_sorted` is exactly JCS for ``value``."""
    stack: list[Any] = [value]  # Any: the hot loop dispatches on ``kind = type(item)`` once, which mypy cannot narrow by
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
                if not key.isascii() and (max(key) > "\uffff" or _RAW_SURROGATE.search(key)):
                    return False
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float:
            return False
        elif kind is int:
            if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                return False
        elif kind is str:
            if not item.isascii() and _RAW_SURROGATE.search(item):
                return False
        elif item is not None and kind is not bool:
            return False
    return True


def canonicalize(value: object) -> bytes:
    """RFC 8785 canonical bytes of ``value``; raises :class:`JCSError` outside the JSON model."""
    if fast_path_applies(value):
        return dumps_sorted(value)
    return canonicalize_reference(value)
