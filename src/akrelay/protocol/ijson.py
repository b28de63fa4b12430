"""Strict I-JSON parsing (RFC 7493; Agent Identity §4.1).

JCS is only defined over I-JSON, and a lenient parser is a signature-confusion
hazard (one component hashes the last duplicate, another acts on the first), so
signed text is parsed with every ambiguity rejected.

Numbers. I-JSON numbers are IEEE doubles, so a number's *value* is what counts:

* integer literals must lie in ±(2^53−1);
* a literal with a fraction or exponent is read as a double: it must be finite
  (``1e400`` is rejected, underflow to a subnormal or zero is ordinary rounding);
  if its value is integral (``1.0``, ``1e2``, ``-0.0``) it must lie in ±(2^53−1)
  and it is returned as that ``int``. JCS writes ``1.0`` and ``1`` identically,
  so both spellings carry the same event ID and the parsed value says so;
* ``NaN``/``Infinity`` are not JSON and are rejected.

Only non-integral numbers come back as ``float``.
"""

from __future__ import annotations

import json
import re
from typing import NoReturn

from akrelay.jsontypes import JSON
from akrelay.protocol.errors import ProtocolError

MAX_SAFE_INTEGER = 2**53 - 1

# An escaped surrogate (``\uD800``–``\uDFFF``): only then can a parsed string hold one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# An escaped high surrogate: the only way an ASCII text can spell an astral character.
_HIGH_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_RAW_SURROGATE = re.compile("[\ud800-\udfff]")


class _Reject(Exception):
    """Raised inside decoder hooks; turned into a ProtocolError with the caller's code."""


class _NonIntegral(Exception):
    """The fast decoder met a non-integral number: JCS needs the full serializer."""


def _object(pairs: list[tuple[str, JSON]]) -> dict[str, JSON]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Reject(f"duplicate member name {json.dumps(key)}")
            seen.add(key)
    return result


def _integer(text: str) -> int:
    if len(text) <= 15:
        return int(text)
    if len(text) > 17:
        raise _Reject(f"integer {text[:20]}... is outside ±(2^53-1)")
    value = int(text)
    if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        return value
    raise _Reject(f"integer {text} is outside ±(2^53-1)")


def _number(text: str) -> int | float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise _Reject(f"number {text[:40]} overflows an IEEE double")
    if value.is_integer():
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return int(value)
        raise _Reject(f"number {text[:40]} is an integer outside ±(2^53-1)")
    return value


def _number_fast(text: str) -> int | float:
    value = _number(text)
    if type(value) is float:
        raise _NonIntegral
    return value


def _constant(name: str) -> NoReturn:
    raise _Reject(f"{name} is not a JSON value")


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object, parse_int=_integer, parse_float=_number, parse_constant=_constant
)
_FAST_DECODER = json.JSONDecoder(
    object_pairs_hook=_object, parse_int=_integer, parse_float=_number_fast, parse_constant=_constant
)


def _has_lone_surrogate(value: JSON) -> bool:
    # Only reached when the text escapes a surrogate (rare), so isinstance narrowing costs nothing that matters.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _text(data: object, code: str) -> str:
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(code, f"invalid JSON: not valid UTF-8 at byte {exc.start}") from None
    elif isinstance(data, str):
        text = data
        if not text.isascii() and _RAW_SURROGATE.search(text):
            raise ProtocolError(code, "invalid JSON: text contains an unpaired surrogate")
    else:
        raise ProtocolError(code, "invalid JSON: expected JSON text as bytes or str")
    if text.startswith("\ufeff"):
        raise ProtocolError(code, "invalid JSON: a byte order mark is not allowed")
    return text


def _decode(decoder: json.JSONDecoder, text: str, code: str) -> JSON:
    try:
        value: JSON = decoder.decode(text)
    except _Reject as exc:
        raise ProtocolError(code, f"invalid JSON: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ProtocolError(code, f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ProtocolError(code, "invalid JSON: nesting too deep") from None
    except ValueError as exc:  # e.g. int() digit limits
        raise ProtocolError(code, f"invalid JSON: {exc}") from None
    if "\\u" in text and _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise ProtocolError(code, "invalid JSON: string contains an unpaired surrogate escape")
    return value


def parse_strict(data: bytes | bytearray | memoryview | str, *, code: str = "invalid_event") -> JSON:
    """Parse one strict I-JSON text; any defect raises ``ProtocolError(code)``."""
    return _decode(_DECODER, _text(data, code), code)


def parse_strict_for_jcs(data: bytes | bytearray | memoryview | str, *, code: str = "invalid_event") -> tuple[JSON, bool]:
    """Like :func:`parse_strict`, and also tell whether a sorted plain dump is already JCS.

    The flag is true when the value holds no non-integral number and no astral
    character could appear in a member name: then ``jcs.dumps_sorted`` equals
    the full RFC 8785 serialization (see ``jcs``). It is conservative: false
    only means the caller must use ``jcs.canonicalize``.
    """
    text = _text(data, code)
    try:
        value = _decode(_FAST_DECODER, text, code)
    except ProtocolError:
        raise
    except _NonIntegral:
        return _decode(_DECODER, text, code), False
    if text.isascii():
        simple = "\\u" not in text or not _HIGH_SURROGATE_ESCAPE.search(text)
    else:
        simple = not _ASTRAL.search(text) and not _HIGH_SURROGATE_ESCAPE.search(text)
    return value, simple
