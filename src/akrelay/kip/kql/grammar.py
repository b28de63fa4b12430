"""Loading the lark grammars and turning lark failures into ``InvalidSyntax``.

The canonical grammars live in the repository's ``grammar/`` directory; an
identical copy ships as package data under ``akrelay/data/`` so an installed
wheel parses without a source checkout (``tests/kql/test_grammar_files.py``
keeps the two in step). Each language grammar is composed after the shared
``kip_common.lark`` layer, then compiled once as LALR with the contextual lexer.

Compiling both grammars costs about half a second of CPU in every process that runs
KIP; the runtime therefore loads the tables it compiled before from disk
(:mod:`akrelay.kip.grammar_cache`, installed with :func:`use_loader`; issue 25).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from typing import Callable, TypedDict

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from akrelay.kip import budget
from akrelay.kip.kql.errors import KqlError, syntax_error
from akrelay.jsontypes import JSONScalar
from akrelay.kip.kql.values import Literal, Param, Value, decode_number, decode_string

#: The deepest parse tree a KQL or META command may have. Every later stage
#: (AST builder, semantic checks, evaluator, rendering) recurses along the tree,
#: so this one bound keeps all of them far inside Python's recursion limit; the
#: LALR parser itself is iterative and never recurses. Docs: docs/kql.md "Limits".
MAX_NESTING = 128

#: The grammar files, in composition order for each language.
GRAMMAR_FILES = ("kip_common.lark", "kql.lark", "meta.lark")
_COMPOSITION = {"kql": ("kip_common.lark", "kql.lark"), "meta": ("kip_common.lark", "meta.lark")}

_FRIENDLY = {
    "VARIABLE": "a ?variable",
    "PARAMETER": "a :parameter",
    "IDENTIFIER": "a name",
    "STRING": "a string",
    "NUMBER": "a number",
    "UINT": "a non-negative integer",
    "EQ_OP": "== or !=",
    "REL_OP": "a comparison",
    "$END": "the end of the command",
}


def grammar_text(name: str) -> str:
    """The text of one packaged grammar file (e.g. ``"kql.lark"``)."""
    resource = importlib.resources.files("akrelay").joinpath("data", name)
    return resource.read_text(encoding="utf-8")


#: How every grammar is compiled (the cache in :mod:`akrelay.kip.grammar_cache` compiles with these too).
class LarkOptions(TypedDict):
    parser: str
    lexer: str
    maybe_placeholders: bool
    g_regex_flags: int


OPTIONS: LarkOptions = {
    "parser": "lalr",
    "lexer": "contextual",
    "maybe_placeholders": True,
    # keywords are ASCII case-insensitive: without re.ASCII, "(?i)" would also let
    # U+017F (long s) match "s" and U+212A (Kelvin) match "k"
    "g_regex_flags": re.ASCII,
}


def compile_source(source: str) -> Lark:
    """Compile a composed grammar's LALR tables (about a quarter of a second of CPU each)."""
    return Lark(source, **OPTIONS)


#: What turns a composed grammar into a parser: :func:`compile_source`, or the runtime's
#: loader that keeps compiled tables on disk (:func:`use_loader`; the file I/O stays above this layer).
_make: Callable[[str], Lark] = compile_source


def use_loader(make: Callable[[str], Lark]) -> None:
    """Have :func:`parser` build its parsers with ``make`` from now on (``akrelay.kip.runtime.preload``)."""
    global _make
    if make is not _make:
        _make = make
        parser.cache_clear()


@functools.cache
def parser(language: str) -> Lark:
    """The compiled LALR parser for ``"kql"`` or ``"meta"``."""
    return _make("\n".join(grammar_text(name) for name in _COMPOSITION[language]))


#: A parse tree of these grammars: tokens at the leaves (lark puts ``None`` where an optional part is absent).
ParseTree = Tree[Token]


def subtree(node: object) -> ParseTree:
    """``node``, a child the grammar makes a subtree, as one."""
    if not isinstance(node, Tree):
        raise AssertionError(f"expected a subtree, got {node!r}")  # pragma: no cover
    return node


def optional_subtree(node: object) -> ParseTree | None:
    """An optional subtree (``None`` when the command leaves it out)."""
    return None if node is None else subtree(node)


def leaf(node: object) -> Token:
    """``node``, a child the grammar makes a token, as one."""
    if not isinstance(node, Token):
        raise AssertionError(f"expected a token, got {node!r}")  # pragma: no cover
    return node


def parse_tree(text: str, language: str) -> ParseTree:
    """Parse ``text``; any failure becomes ``InvalidSyntax`` with line, column and hint."""
    if not isinstance(text, str):
        raise KqlError("InvalidSyntax", "command must be a string")
    lark = parser(language)
    try:
        tree = lark.parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(lark, text, exc, language) from None
    # Parsing cannot be interrupted, but its time counts: bounded by the body size
    # (about 5 us per character), it is charged to the request's budget here.
    budget.current().check()
    _check_nesting(tree, language)
    return tree


def _check_nesting(tree: ParseTree, language: str) -> None:
    """``ResourceExhausted`` when ``tree`` is deeper than :data:`MAX_NESTING` (walked without recursion)."""
    stack: list[tuple[ParseTree, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            where = "KQL query" if language == "kql" else "META command"
            position = _first_token_position(node)
            raise KqlError(
                "ResourceExhausted",
                f"the {where} nests deeper than this runtime allows ({MAX_NESTING} levels)",
                hint="flatten nested blocks and literals; use IN(...) instead of a long chain of || or &&",
                details={"limit": "max_nesting_depth", "max": MAX_NESTING, **position},
            )
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


def _first_token_position(node: ParseTree) -> dict[str, int]:
    """Line and column of the first token under ``node`` (none for an empty subtree)."""
    stack: list[object] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, Token):
            return token_position(item)
        if isinstance(item, Tree):
            stack.extend(reversed(item.children))
    return {}


# ------------------------------------------------------------------- errors


def _describe_expected(lark: Lark, names: set[str]) -> list[str]:
    shown: list[str] = []
    for name in sorted(names):
        if name in _FRIENDLY:
            shown.append(_FRIENDLY[name])
            continue
        try:
            pattern = lark.get_terminal(name).pattern
        except KeyError:
            shown.append(name)
            continue
        shown.append(f'"{pattern.value}"' if pattern.type == "str" else name)
    return sorted(set(shown))


def _syntax_error(lark: Lark, text: str, exc: UnexpectedInput, language: str) -> KqlError:
    line = getattr(exc, "line", None)
    column = getattr(exc, "column", None)
    at_end = isinstance(exc, UnexpectedEOF) or (
        isinstance(exc, UnexpectedToken) and exc.token.type == "$END")
    if at_end or line is None or line < 1:
        line, column = _end_position(text)
    hint: str | None = None
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream
        char = text[pos] if pos is not None and pos < len(text) else ""
        message = f"unexpected character {char!r}"
        if char == "'":
            hint = "strings use double quotes (JSON strings)"
        elif char == "$":
            hint = "write variables as ?name and parameters as :name"
        else:
            hint = _expected_hint(lark, set(exc.allowed or ()))
    elif isinstance(exc, UnexpectedEOF):
        message = "the command ended early"
        hint = _expected_hint(lark, set(exc.expected or ()))
    elif isinstance(exc, UnexpectedToken):
        token = exc.token
        if token.type == "$END":
            message = "the command ended early"
        else:
            message = f"unexpected {token.value!r}"
        expected = set(exc.expected or ())
        hint = _token_hint(token, expected) or _expected_hint(lark, expected)
    else:  # pragma: no cover - lark raises only the three above
        message = str(exc)
    where = "KQL query" if language == "kql" else "META command"
    return syntax_error(f"{message} in {where} at line {line}, column {column}",
                        line=line, column=column, hint=hint)


def _token_hint(token: Token, expected: set[str]) -> str | None:
    value = str(token.value)
    if value.upper() in {"TX", "TIME"} and "SEQ" in expected:
        return "KIP 2.0 reads history only with AS OF SEQ (§48.1); resolve an instant with DESCRIBE SNAPSHOT AT TIME"
    if value in {"True", "TRUE", "False", "FALSE", "Null", "NULL", "None"}:
        return "true, false and null are lowercase"
    if value.upper() == "CURSOR" and "LIMIT" in expected:
        return "a Search Pattern takes a required LIMIT and no CURSOR (§43.8)"
    if "LIMIT" in expected and "MODE" in expected:
        return "a Search Pattern requires LIMIT <k> (§43.8)"
    return None


def _expected_hint(lark: Lark, expected: set[str]) -> str | None:
    if not expected:
        return None
    shown = _describe_expected(lark, expected)
    if len(shown) > 12:
        shown = shown[:12] + ["…"]
    return "expected " + ", ".join(shown)


def _end_position(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


# -------------------------------------------------------- value conversion


def token_position(token: Token) -> dict[str, int]:
    line = token.line
    column = token.column
    return {"line": line, "column": column} if line is not None and column is not None else {}


def literal_value(tree: ParseTree) -> JSONScalar:
    """The Python value of a ``literal`` subtree (string/number/true/false/null)."""
    kind = tree.data
    if kind == "true":
        return True
    if kind == "false":
        return False
    if kind == "null":
        return None
    token = leaf(tree.children[0])
    pos = token_position(token)
    if kind == "string":
        return decode_string(str(token), **pos)
    if kind == "number":
        return decode_number(str(token), **pos)
    raise AssertionError(f"not a literal: {kind}")  # pragma: no cover


LITERAL_KINDS = frozenset({"string", "number", "true", "false", "null"})


def scalar(node: object) -> Value | None:
    """A ``scalar_value``/``meta_value`` subtree as a :class:`Param` or :class:`Literal`."""
    tree = optional_subtree(node)
    if tree is None:
        return None
    if tree.data == "param":
        return Param(str(tree.children[0])[1:])
    if tree.data in LITERAL_KINDS:
        return Literal(literal_value(tree))
    raise AssertionError(f"not a scalar value: {tree.data}")  # pragma: no cover


def required_scalar(node: object) -> Value:
    """A ``scalar_value`` the grammar requires (never absent)."""
    value = scalar(node)
    if value is None:
        raise AssertionError("a required value is absent")  # pragma: no cover
    return value
