"""Text from a relay, made safe to print on a terminal.

Capsule titles, answers, error messages and whole records come from a service
(and, through it, from any signer), and a terminal acts on what it prints: ESC
and CSI (U+009B) sequences can retitle the window, clear the screen or move the
cursor, a carriage return can overwrite a line with a fake one, and bidi
overrides can reorder what is shown. Every character that is not printable
(``str.isprintable``: C0 and C1 controls, DEL, format characters such as the
bidi controls, line and paragraph separators) is shown as an escape instead,
the way ``repr`` shows it; only newline and tab pass, where text has lines.
"""

from __future__ import annotations

import json

from akrelay.jsontypes import JSON, JSONArray, JSONObject


def _escape(ch: str) -> str:
    return repr(ch)[1:-1]  # only ever called for a non-printable character, which repr escapes


def printable(text: str, *, keep: str = "\n\t") -> str:
    """``text`` with every non-printable character but those in ``keep`` shown as a backslash escape."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in keep else _escape(ch) for ch in text)


def dumps(value: object, *, indent: int | None = None, separators: tuple[str, str] | None = None) -> str:
    """JSON (``ensure_ascii=False``) in which every non-printable character is a ``\\uXXXX`` escape.

    The result is the same JSON value: JSON already escapes C0 controls inside
    strings, and the rest are escaped here the JSON way. Newlines outside strings
    (``indent``) are the layout, so they stay.
    """
    text = json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch == "\n":
            out.append(ch)
        else:
            out.append("".join(f"\\u{unit:04x}" for unit in _utf16(ch)))
    return "".join(out)


def members(value: JSON | None) -> JSONObject:
    """A member of a relay's answer read as an object: what is not one reads as an empty one (nothing to print)."""
    return value if isinstance(value, dict) else {}


def elements(value: JSON | None) -> JSONArray:
    """A member of a relay's answer read as an array: what is not one reads as an empty one (nothing to print)."""
    return value if isinstance(value, list) else []


def _utf16(ch: str) -> list[int]:
    data = ch.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]
