"""The REGEX dialect of KQL FILTER (KIP §44.2 requires it to be documented).

Dialect: Python ``re`` syntax, matched with ``search`` semantics (unanchored;
use ``^``/``$`` to anchor), Unicode-aware, case-sensitive unless the pattern
starts with the inline flag ``(?i)``. To keep matching time linear-ish on
hostile input, these constructs are rejected with ``InvalidSyntax``:

* backreferences (``\\1``, ``(?P=name)``) and conditional groups;
* lookahead/lookbehind assertions;
* an unbounded repetition nested inside another unbounded repetition
  (``(a+)+``, ``(a*)*``), the classic catastrophic-backtracking shape;
* inline flags other than ``i``, ``m``, ``s``.

Limits: a pattern is at most ``MAX_PATTERN`` characters; a subject string
longer than ``MAX_SUBJECT`` characters fails ``ResourceExhausted`` rather than
being truncated. A non-string subject is unknown (the filter does not pass).
"""

from __future__ import annotations

import functools
import re
from typing import Any

try:  # Python 3.11 moved the parser; keep the old name as fallback.
    import re._parser as _sre_parse  # type: ignore[import-not-found]
    from re import _constants as _sre_c  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse as _sre_parse  # type: ignore[no-redef]
    import sre_constants as _sre_c  # type: ignore[no-redef]

from akrelay.kip.kql.errors import KqlError

MAX_PATTERN = 512
MAX_SUBJECT = 65536
_ALLOWED_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL
_UNBOUNDED = _sre_c.MAXREPEAT


def _walk(parsed: Any, inside_unbounded: bool) -> None:
    for op, arg in parsed:
        if op in (_sre_c.GROUPREF, _sre_c.GROUPREF_EXISTS):
            raise KqlError("InvalidSyntax", "REGEX does not support backreferences or conditional groups",
                           hint="see the REGEX dialect in docs/kql.md")
        if op in (_sre_c.ASSERT, _sre_c.ASSERT_NOT):
            raise KqlError("InvalidSyntax", "REGEX does not support lookahead/lookbehind",
                           hint="see the REGEX dialect in docs/kql.md")
        if op in (_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT, getattr(_sre_c, "POSSESSIVE_REPEAT", None)):
            lo, hi, sub = arg
            unbounded = hi == _UNBOUNDED or hi > 1000
            if unbounded and inside_unbounded:
                raise KqlError("InvalidSyntax", "REGEX rejects nested unbounded repetition such as (a+)+",
                               hint="rewrite the pattern without a repeated group of repeats")
            _walk(sub, inside_unbounded or unbounded)
        elif op == _sre_c.SUBPATTERN:
            _walk(arg[-1], inside_unbounded)
        elif op == _sre_c.BRANCH:
            for branch in arg[1]:
                _walk(branch, inside_unbounded)
        elif op == getattr(_sre_c, "ATOMIC_GROUP", None):
            _walk(arg, inside_unbounded)


@functools.lru_cache(maxsize=256)
def compile_regex(pattern: str) -> re.Pattern[str]:
    """Validate ``pattern`` against the dialect and compile it."""
    if not isinstance(pattern, str):
        raise KqlError("TypeMismatch", "REGEX pattern must be a string")
    if len(pattern) > MAX_PATTERN:
        raise KqlError("InvalidSyntax", f"REGEX pattern longer than {MAX_PATTERN} characters")
    try:
        parsed = _sre_parse.parse(pattern)
    except re.error as exc:
        raise KqlError("InvalidSyntax", f"invalid REGEX pattern: {exc}") from None
    if parsed.state.flags & ~(_ALLOWED_FLAGS | re.UNICODE):
        raise KqlError("InvalidSyntax", "REGEX allows only the inline flags i, m and s")
    _walk(parsed, False)
    return re.compile(pattern)


def regex_match(text: str, pattern: str) -> bool:
    compiled = compile_regex(pattern)
    if len(text) > MAX_SUBJECT:
        raise KqlError("ResourceExhausted", f"REGEX subject longer than {MAX_SUBJECT} characters")
    return compiled.search(text) is not None
