"""JSON values as Python types, for the code that builds or reads wire documents.

``JSON`` is what ``json.loads`` can return and ``json.dumps`` accepts: a recursive union, so mypy
checks every access (a value read from a document must be narrowed with ``isinstance`` before it is
used as a string, a number, a list or an object). Input that has not been validated yet is typed
``object``, not ``JSON``: validation is what turns one into the other.

The mutable aliases (``JSON``, ``JSONObject``, ``JSONArray``) are for documents a function builds
and returns; a parameter that only reads a document takes ``JSONMapping`` (read-only and covariant,
so a ``dict[str, str]`` is accepted where a ``dict[str, JSON]`` would not be).
"""

from __future__ import annotations

from typing import Mapping, Sequence, TypeAlias, Union

JSONScalar: TypeAlias = Union[None, bool, int, float, str]
JSON: TypeAlias = Union[JSONScalar, list["JSON"], dict[str, "JSON"]]
JSONObject: TypeAlias = dict[str, JSON]
JSONArray: TypeAlias = list[JSON]

#: Read-only views: what a function that only reads a document accepts.
JSONValue: TypeAlias = Union[JSONScalar, Sequence["JSONValue"], Mapping[str, "JSONValue"]]
JSONMapping: TypeAlias = Mapping[str, JSONValue]

__all__ = ["JSON", "JSONArray", "JSONMapping", "JSONObject", "JSONScalar", "JSONValue"]
