"""The REGEX dialect of KQL FILTER (KIP §44.2 requires it to be documented).

Dialect: RE2 syntax (``google-re2``), matched with *search* semantics
(unanchored; use ``^``/``$``), on Unicode text, case-sensitive unless the
pattern sets ``(?i)``. RE2 matches in time linear in the subject whatever the
pattern, so no pattern can stall a worker: ``(a|a)*c``, ``(a+)+`` or
``^(a|a){1,27}c`` cost what ``a*c`` costs. Measured (bench/kql_regex.py): the
hostile patterns of issue 11 take microseconds with RE2; Python ``re`` took 11 s,
and the ``regex`` package's timeout could only stop each match at its budget.
The constructs that need backtracking (backreferences, lookaround, atomic or
possessive groups, conditionals) are not RE2 syntax and fail ``InvalidSyntax``.

Limits: a pattern is at most ``MAX_PATTERN`` characters and each counted
repetition at most ``{1000}`` (RE2's own bound); a pattern whose compiled program
outgrows ``MAX_PROGRAM_BYTES`` fails ``ResourceExhausted``, as does a subject
longer than ``MAX_SUBJECT`` characters (never truncated). Every match is linear,
but a long subject costs tens of milliseconds (21 ms measured on 64 KiB with a
thrashing DFA), so it is preceded by a check of the request's CPU budget. A
non-string subject is unknown (the filter does not pass).
"""

from __future__ import annotations

import functools
from typing import Protocol

# google-re2 ships no type information; the three names below type the part of it used here and in
# akrelay.knowql.shape, so the untyped module goes no further than this file.
import re2  # type: ignore[import-untyped]

from akrelay.kip import budget
from akrelay.kip.kql.errors import KqlError

MAX_PATTERN = 512
MAX_SUBJECT = 65536
#: RE2's memory budget for one compiled pattern (program and DFA cache). A hostile
#: pattern fills its DFA cache, and compiled patterns are cached (``CACHED``), so
#: this bounds the memory REGEX can hold: about 0.7 MiB measured per such pattern.
MAX_PROGRAM_BYTES = 2 << 20
CACHED = 64
#: Subjects at least this long are matched after an immediate budget check: one
#: such match costs tens of milliseconds when RE2's DFA cache thrashes, too much to
#: leave to the amortised tick.
LONG_SUBJECT = 4096
_HINT = "REGEX uses RE2 syntax; see the REGEX dialect in docs/kql.md"



class RE2Pattern(Protocol):
    """A compiled RE2 pattern (``re2._Regexp``)."""

    def search(self, text: str) -> object:
        """The first match in ``text`` (a match object), or ``None``."""


#: What RE2 raises for a pattern it refuses.
RE2_ERROR: type[Exception] = re2.error


def re2_options(max_mem: int) -> object:
    """RE2 compile options: a memory budget per pattern, and no logging of refused patterns."""
    options = re2.Options()
    options.max_mem = max_mem
    options.log_errors = False  # a refused pattern is the client's error, not a log line
    return options


def re2_compile(pattern: str, options: object) -> RE2Pattern:
    compiled: RE2Pattern = re2.compile(pattern, options)
    return compiled


_OPTIONS = re2_options(MAX_PROGRAM_BYTES)


@functools.lru_cache(maxsize=CACHED)
def compile_regex(pattern: str) -> RE2Pattern:
    """Check ``pattern`` against the dialect and compile it once (cached)."""
    if not isinstance(pattern, str):
        raise KqlError("TypeMismatch", "REGEX pattern must be a string")
    if len(pattern) > MAX_PATTERN:
        raise KqlError("InvalidSyntax", f"REGEX pattern longer than {MAX_PATTERN} characters", hint=_HINT)
    try:
        return re2_compile(pattern, _OPTIONS)
    except UnicodeEncodeError:
        raise KqlError("InvalidSyntax", "REGEX pattern is not Unicode scalar values", hint=_HINT) from None
    except RE2_ERROR as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if "pattern too large" in reason:
            raise KqlError("ResourceExhausted", "REGEX pattern compiles to more than this runtime allows",
                           details={"max_program_bytes": MAX_PROGRAM_BYTES}, hint=_HINT) from None
        raise KqlError("InvalidSyntax", f"invalid REGEX pattern: {reason}", hint=_HINT) from None


def regex_match(text: str, pattern: str) -> bool:
    compiled = compile_regex(pattern)
    if len(text) > MAX_SUBJECT:
        raise KqlError("ResourceExhausted", f"REGEX subject longer than {MAX_SUBJECT} characters")
    if len(text) >= LONG_SUBJECT:
        budget.current().check()
    try:
        return compiled.search(text) is not None
    except UnicodeEncodeError:
        raise KqlError("TypeMismatch", "REGEX subject is not Unicode scalar values") from None
