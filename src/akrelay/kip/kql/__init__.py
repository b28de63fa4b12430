"""KQL and META for the KIP gateway: grammar, AST, checks and evaluation.

Public entry points:

* ``parse_meta(text) -> MetaCommand`` (``meta``): one META statement.
* ``parse_kql(text) -> Query`` (``query``): one KQL query with its semantic checks.
* ``classify(text) -> "KQL" | "KML" | "META" | None`` and ``is_kml(text)``
  (``classify``): language classification (§73.1); KML is refused by the
  read-only runtime with ``ReadonlyViolation``.
* ``execute_kql(runtime, command, parameters, seq) -> (result, context)``
  (``evaluate``): the evaluator entry point the KIP runtime calls.
* ``KqlError``: every error carries a KIP §87 code and the §86.1 shape.
* ``Param``/``Literal``/``resolve``: structural parameter binding (§74).
"""

from akrelay.kip.kql.classify import classify, is_kml
from akrelay.kip.kql.errors import KqlError
from akrelay.kip.kql.evaluate import execute_kql
from akrelay.kip.kql.meta import MetaCommand, parse_meta
from akrelay.kip.kql.nodes import Query
from akrelay.kip.kql.query import parse_kql
from akrelay.kip.kql.values import Literal, Param, resolve

__all__ = [
    "KqlError",
    "Literal",
    "MetaCommand",
    "Param",
    "Query",
    "classify",
    "execute_kql",
    "is_kml",
    "parse_kql",
    "parse_meta",
    "resolve",
]
