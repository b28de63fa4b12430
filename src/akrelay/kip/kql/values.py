"""Command values: literals (§9) and structurally bound parameters (§74).

A value position in KQL/META holds either a :class:`Literal` or a
:class:`Param`. Parameters are data, never text: they are resolved only by
:func:`resolve`, which fails ``ReferenceError`` for a missing binding instead of
treating it as ``null``, and then pass the same checks as a literal would.
"""

from __future__ import annotations

import json
import math
import unicodedata
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TypeGuard

from akrelay.jsontypes import JSONMapping, JSONScalar, JSONValue

from akrelay.kip.kql.errors import KqlError, syntax_error

#: §9.3: the largest integral magnitude a portable number may carry.
MAX_SAFE_INTEGER = 9007199254740991


@dataclass(frozen=True, slots=True)
class Param:
    """A ``:name`` placeholder; ``name`` excludes the colon."""

    name: str

    def resolve(self, params: JSONMapping) -> JSONValue:
        return resolve(self, params)


@dataclass(frozen=True, slots=True)
class Literal:
    """A JSON literal from the command text: str, int, float, bool or None."""

    value: JSONScalar

    def resolve(self, params: JSONMapping) -> JSONValue:
        return self.value


Value = Param | Literal


def resolve(value: Value | None, params: JSONMapping) -> JSONValue:
    """The bound value of ``value``; a missing parameter is ``ReferenceError``."""
    if value is None:
        return None
    if isinstance(value, Literal):
        return value.value
    if value.name not in params:
        raise KqlError(
            "ReferenceError",
            f"parameter :{value.name} is not bound",
            hint=f'supply "{value.name}" in the operation or request parameters',
            details={"parameter": value.name},
        )
    return params[value.name]


# ------------------------------------------------------------ literal decoding


def decode_number(text: str, *, line: int | None = None, column: int | None = None) -> int | float:
    """A §9.3 number: finite binary64, safe-range integral values, no underflow.

    Integral values (``1``, ``1.0``, ``1e0``) come back as ``int`` so that equal
    values are one Literal (§9.6); ``-0`` is ``0``.
    """
    try:
        exact = Decimal(text)
    except InvalidOperation:  # pragma: no cover - the lexer only admits JSON numbers
        raise syntax_error(f"invalid number {text!r}", line=line, column=column) from None
    if not exact.is_finite():  # pragma: no cover - JSON grammar excludes these
        raise syntax_error(f"number {text} is not finite", line=line, column=column)
    if exact == exact.to_integral_value():
        if abs(exact) > MAX_SAFE_INTEGER:
            raise syntax_error(
                f"number {text} is outside the safe integer range",
                line=line, column=column,
                hint="integral values must lie within ±9007199254740991 (§9.3); "
                     "use a string for larger exact values",
            )
        return int(exact)
    as_float = float(exact)
    if math.isinf(as_float):
        raise syntax_error(f"number {text} overflows binary64", line=line, column=column)
    if as_float == 0.0:
        raise syntax_error(
            f"number {text} underflows to zero", line=line, column=column,
            hint="nonzero values that round to zero are rejected (§9.3)",
        )
    return as_float


def decode_string(text: str, *, line: int | None = None, column: int | None = None) -> str:
    """A JSON string token as Unicode scalar values, NFC-normalized (§9.6)."""
    value = json.loads(text)
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        raise syntax_error(
            "string contains a lone surrogate escape", line=line, column=column,
            hint="strings must be Unicode scalar values; encode astral characters as a surrogate pair",
        )
    return unicodedata.normalize("NFC", value)


# -------------------------------------------------------- bound value checks


def is_safe_integer(value: object) -> TypeGuard[int | float]:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_SAFE_INTEGER
    if isinstance(value, float) and value.is_integer():
        return abs(value) <= MAX_SAFE_INTEGER
    return False


def check_number(value: object, what: str) -> int | float:
    """A bound parameter that must be a §9.3 number (not a bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KqlError("TypeMismatch", f"{what} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise KqlError("TypeMismatch", f"{what} must be finite")
    if (isinstance(value, int) or value.is_integer()) and abs(value) > MAX_SAFE_INTEGER:
        raise KqlError("ConstraintViolation", f"{what} is outside the safe integer range (§9.3)")
    return value


def check_limit(value: object, what: str = "LIMIT") -> int:
    """§44.8: a non-negative safe integer."""
    if not is_safe_integer(value):
        raise KqlError("TypeMismatch", f"{what} must be a non-negative safe integer, got {value!r}")
    number = int(value)
    if number < 0:
        raise KqlError("ConstraintViolation", f"{what} must not be negative, got {number}")
    return number


def check_seq(value: object, what: str = "AS OF SEQ") -> int:
    """A Space sequence: a non-negative safe integer."""
    return check_limit(value, what)


def check_threshold(value: object) -> float:
    """§66.4: THRESHOLD is a number in [0, 1]."""
    number = check_number(value, "THRESHOLD")
    if not 0 <= number <= 1:
        raise KqlError("ConstraintViolation", f"THRESHOLD must lie in [0, 1], got {number}")
    return float(number)


def check_cursor(value: object) -> str:
    """§44.8: a cursor is an opaque non-empty string."""
    if not isinstance(value, str) or not value:
        raise KqlError(
            "CursorInvalid", "CURSOR must be a non-empty string",
            details={"reason": "malformed"},
        )
    return value


def check_string(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise KqlError("TypeMismatch", f"{what} must be a string, got {type(value).__name__}")
    return value
