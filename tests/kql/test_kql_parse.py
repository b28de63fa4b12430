"""KQL grammar: every known trap of issue 7, the seed's changes, and InvalidSyntax positions."""

from __future__ import annotations

import pytest

from akrelay.kip.kql import KqlError, Literal, Param, parse_kql
from akrelay.kip.kql import nodes as A


def where(text: str) -> tuple:
    return parse_kql(f"FIND(?x) WHERE {{ ?x {{}} {text} }}").where[1:]


# ---- trap: variable vs field_access -------------------------------------------------------

def test_variable_and_field_access_in_find_and_filter() -> None:
    q = parse_kql('FIND(?x, ?x.name, ?x["k.y"], ?x.attributes.tags) WHERE { ?x {} FILTER(?x == ?x.id) }')
    assert q.find == (A.Var("x"), A.Path("x", ("name",)), A.Path("x", ("k.y",)),
                      A.Path("x", ("attributes", "tags")))
    assert q.where[1] == A.Filter(A.Binary("==", A.Var("x"), A.Path("x", ("id",))))


def test_variable_and_field_access_in_data_values() -> None:
    q = parse_kql('FIND(?x) WHERE { ?x {} FILTER(IN(?x.name, [?x.key, ?x, "a"])) }')
    call = q.where[1].expr
    assert call.args[1] == A.ArrayExpr((A.Path("x", ("key",)), A.Var("x"), Literal("a")))


# ---- trap: COUNT( aggregate vs function ------------------------------------------------------

def test_count_is_an_aggregate_in_find_and_order_by() -> None:
    q = parse_kql("FIND(?x.kind, count(distinct ?y), COUNT(?y)) WHERE { ?x {} OPTIONAL { (?x, \"p\", ?y) } } "
                  "ORDER BY COUNT(?y) DESC")
    assert q.find[1] == A.Aggregate("COUNT", True, A.Var("y"))
    assert q.find[2] == A.Aggregate("COUNT", False, A.Var("y"))
    assert q.order_by == (A.OrderItem(A.Aggregate("COUNT", False, A.Var("y")), True),)


@pytest.mark.parametrize("text", [
    "FIND(?x) WHERE { ?x {} FILTER(COUNT(?x) > 0) }",
    "FIND(IS_NULL(COUNT(?x))) WHERE { ?x {} }",
    "FIND(?x) WHERE { ?x {} FILTER(max(?x.n) > 0) }",
])
def test_count_call_outside_find_is_rejected(text: str) -> None:
    with pytest.raises(KqlError) as info:
        parse_kql(text)
    assert info.value.code == "InvalidSyntax"
    assert "aggregate" in info.value.message


# ---- trap: id keyword vs field name -------------------------------------------------------------

def test_id_keyword_in_proposition_slot_and_field_elsewhere() -> None:
    q = parse_kql('FIND(?p, ?x.id) WHERE { ?x {id: :cid, "id": "also"} ?p (id: :pid) '
                  '?m (?x, "ak_tests", (id: "P1")) ?b BELIEF (id: :pid) }')
    assert q.where[0].pattern.members == (("id", Param("cid")), ("id", Literal("also")))
    assert q.where[1] == A.PropositionPattern("p", A.IdTuple(Param("pid")))
    assert q.where[2].tuple.object == A.IdTuple(Literal("P1"))
    assert q.where[3] == A.BeliefPattern("b", A.IdTuple(Param("pid")))
    assert q.find[1] == A.Path("x", ("id",))


# ---- trap: keywords as field names ---------------------------------------------------------------

@pytest.mark.parametrize("field", ["type", "limit", "order", "find", "where", "filter", "not", "union",
                                   "optional", "belief", "search", "with", "mode", "as", "of", "seq",
                                   "count", "distinct", "asc", "desc", "cursor", "id", "concept"])
def test_keywords_are_field_names(field: str) -> None:
    q = parse_kql(f'FIND(?x.{field}) WHERE {{ ?x {{{field}: "v"}} FILTER(?x.{field} != null) }} '
                  f"ORDER BY ?x.{field}")
    assert q.where[0].pattern.members == ((field, Literal("v")),)
    assert q.find == (A.Path("x", (field,)),)


def test_keywords_are_case_insensitive() -> None:
    a = parse_kql('find(?x) where { ?x concept {type: "A"} } order by ?x.name desc limit 2')
    b = parse_kql('FIND(?x) WHERE { ?x CONCEPT {type: "A"} } ORDER BY ?x.name DESC LIMIT 2')
    assert (a.find, a.where, a.order_by, a.limit) == (b.find, b.where, b.order_by, b.limit)


@pytest.mark.parametrize("word", ["True", "FALSE", "Null", "NULL"])
def test_true_false_null_are_case_sensitive(word: str) -> None:
    with pytest.raises(KqlError) as info:
        parse_kql(f"FIND(?x) WHERE {{ ?x {{flag: {word}}} }}")
    assert info.value.code == "InvalidSyntax"
    assert "lowercase" in (info.value.hint or "")


def test_lowercase_literals() -> None:
    q = parse_kql("FIND(?x) WHERE { ?x {a: true, b: false, c: null} }")
    assert q.where[0].pattern.members == (("a", Literal(True)), ("b", Literal(False)), ("c", Literal(None)))


# ---- numbers (§9.3), strings, comments --------------------------------------------------------

def test_numbers() -> None:
    q = parse_kql("FIND(?x) WHERE { ?x {a: -0, b: 1.0, c: 1e2, d: 0.5, e: -2.5e-3} }")
    values = [v.value for _, v in q.where[0].pattern.members]
    assert values == [0, 1, 100, 0.5, -0.0025]
    assert isinstance(values[1], int)


@pytest.mark.parametrize("number", ["9007199254740992", "-9007199254740992", "1e16", "1e400", "1e-400", "01", "1.", ".5", "+1"])
def test_numbers_outside_the_rules_are_invalid(number: str) -> None:
    with pytest.raises(KqlError) as info:
        parse_kql(f"FIND(?x) WHERE {{ ?x {{a: {number}}} }}")
    assert info.value.code == "InvalidSyntax"


def test_unary_minus_and_negative_literal() -> None:
    q = parse_kql("FIND(?x) WHERE { ?x {} FILTER(-?x.n < -1 && - 2 < 0) }")
    expr = q.where[1].expr
    assert expr.left == A.Binary("<", A.Unary("-", A.Path("x", ("n",))), Literal(-1))
    assert expr.right.left == A.Unary("-", Literal(2))


def test_comments_anywhere() -> None:
    q = parse_kql("// head\nFIND(?x) // after find\nWHERE { // open\n ?x {} // pattern\n}\n// tail")
    assert q.find == (A.Var("x"),)


def test_string_escapes_and_placeholder_text_is_data() -> None:
    q = parse_kql(r'FIND(?x) WHERE { ?x {name: "Hello :name \"?x\" \u00e9"} }')
    assert q.where[0].pattern.members[0][1] == Literal('Hello :name "?x" é')


# ---- operator precedence ----------------------------------------------------------------------------

def test_precedence_or_and_equality_relational_unary() -> None:
    q = parse_kql("FIND(?x) WHERE { ?x {} FILTER(!?x.a || ?x.b == 1 && ?x.c < 2) }")
    expr = q.where[1].expr
    assert expr.op == "||"
    assert expr.left == A.Unary("!", A.Path("x", ("a",)))
    assert expr.right.op == "&&"
    assert expr.right.left == A.Binary("==", A.Path("x", ("b",)), Literal(1))
    assert expr.right.right == A.Binary("<", A.Path("x", ("c",)), Literal(2))


def test_relational_is_not_associative() -> None:
    with pytest.raises(KqlError):
        parse_kql("FIND(?x) WHERE { ?x {} FILTER(1 < 2 < 3) }")


# ---- pattern families and clauses ---------------------------------------------------------------

def test_every_pattern_family() -> None:
    clauses = where(
        '?p PROPOSITION (?x, "ak_holds", true) ?a ASSERTION {proposition: ?p, stance: "support"} '
        '?e EVIDENCE {evidence_class: "agent_statement"} ?act ACTIVITY {activity_class: "import"} '
        '?edge STRUCTURAL (?x, "ak_published_by", ?author) STRUCTURAL (?x, :f, ?o) '
        '?b BELIEF (?p) ?s BELIEF SLOT (?x, "ak_holds") '
        '?h SEARCH EVIDENCE "capsule" WITH TYPE "T" WITH PREDICATE "p" MODE "keyword" THRESHOLD 0.5 LIMIT 7'
    )
    kinds = [type(c).__name__ for c in clauses]
    assert kinds == ["PropositionPattern", "AssertionPattern", "EvidencePattern", "ActivityPattern",
                     "StructuralPattern", "StructuralPattern", "BeliefPattern", "BeliefSlotPattern", "SearchPattern"]
    assert clauses[5] == A.StructuralPattern(None, A.Var("x"), Param("f"), A.Var("o"))
    assert clauses[8] == A.SearchPattern("h", "EVIDENCE", Literal("capsule"), Literal("T"), Literal("p"),
                                         Literal("keyword"), Literal(0.5), Literal(7))


def test_raw_paths_and_alternatives() -> None:
    clauses = where('(?x, "a"{0,5}, ?y) (?x, "b"{2}, ?z) (?x, "c"{1,} | :d, ?w) ?r (?x, "e" | "f", ?v)')
    assert clauses[0].tuple.path == (A.PathStep(Literal("a"), 0, 5, True),)
    assert clauses[1].tuple.path == (A.PathStep(Literal("b"), 2, 2, True),)
    assert clauses[2].tuple.path == (A.PathStep(Literal("c"), 1, None, True), A.PathStep(Param("d")))
    assert clauses[3].var == "r" and len(clauses[3].tuple.path) == 2


def test_query_tail_clauses() -> None:
    q = parse_kql('FIND(?x) WHERE { ?x {} } AS OF SEQ :s FOR TIME "2026-01-01T00:00:00Z" '
                  'WITH EPISTEMIC {policy: "kip:structural", explanation: "ledger"} ORDER BY ?x.name, ?x.id DESC '
                  "LIMIT 10 CURSOR :c")
    assert q.as_of_seq == Param("s") and q.for_time == Literal("2026-01-01T00:00:00Z")
    assert q.epistemic == A.ObjectExpr((("policy", Literal("kip:structural")), ("explanation", Literal("ledger"))))
    assert q.order_by == (A.OrderItem(A.Path("x", ("name",))), A.OrderItem(A.Path("x", ("id",)), True))
    assert (q.limit, q.cursor) == (Literal(10), Param("c"))


@pytest.mark.parametrize("axis", ["TX", "TIME"])
def test_as_of_only_seq(axis: str) -> None:
    with pytest.raises(KqlError) as info:
        parse_kql(f"FIND(?x) WHERE {{ ?x {{}} }} AS OF {axis} 3")
    assert info.value.code == "InvalidSyntax"
    assert "AS OF SEQ" in (info.value.hint or "")


def test_search_pattern_requires_limit_and_takes_no_cursor() -> None:
    with pytest.raises(KqlError) as info:
        parse_kql('FIND(?h) WHERE { ?h SEARCH CONCEPT "a" }')
    assert info.value.code == "InvalidSyntax" and "LIMIT" in (info.value.hint or "")
    with pytest.raises(KqlError) as info:
        parse_kql('FIND(?h) WHERE { ?h SEARCH CONCEPT "a" LIMIT 3 CURSOR :c }')
    assert info.value.code == "InvalidSyntax"


def test_belief_triple_takes_no_path() -> None:
    with pytest.raises(KqlError):
        parse_kql('FIND(?b) WHERE { ?x {} ?b BELIEF (?x, "p"{1,2}, ?y) }')
    with pytest.raises(KqlError):
        parse_kql('FIND(?b) WHERE { ?x {} ?b BELIEF (?x, "p" | "q", ?y) }')


# ---- positions and hints ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "line", "column"), [
    ("FIND(?x) WHERE { ?x {} ", 1, 24),
    ("FIND(?x)\nWHERE {\n  ?x {a: }\n}", 3, 10),
    ("FIND(?x) WHERE { ?x {a: 'b'} }", 1, 25),
    ("FIND ?x WHERE { ?x {} }", 1, 6),
    ("FIND(?x) WHERE { ?x {} } LIMIT 1 ORDER BY ?x", 1, 34),
])
def test_invalid_syntax_has_line_column_and_hint(text: str, line: int, column: int) -> None:
    with pytest.raises(KqlError) as info:
        parse_kql(text)
    err = info.value
    assert err.code == "InvalidSyntax"
    assert (err.line, err.column) == (line, column)
    assert err.hint
    assert err.to_wire()["details"] == {"line": line, "column": column}


def test_kml_text_is_not_a_query() -> None:
    with pytest.raises(KqlError) as info:
        parse_kql('CREATE CONCEPT ?x {type: "A"}')
    assert info.value.code == "InvalidSyntax"


@pytest.mark.parametrize("text", [
    "FIND(?x) WHERE { ?x {} } AS OF \u017fEQ 1",       # LATIN SMALL LETTER LONG S folds to "s" under Unicode
    "FIND(?x) WHERE { ?x {} } ORDER BY ?x A\u017fC",   # LATIN SMALL LETTER LONG S folds to "s"
])
def test_keywords_are_ascii_case_insensitive_only(text: str) -> None:
    with pytest.raises(KqlError) as info:
        parse_kql(text)
    assert info.value.code == "InvalidSyntax"
