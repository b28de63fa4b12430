"""Static semantic checks of parse_kql (issue 7 list): every error path."""

from __future__ import annotations

import pytest

from akrelay.kip.kql import KqlError, parse_kql
from akrelay.kip.kql.check import parameter_names


def code_of(text: str) -> str:
    with pytest.raises(KqlError) as info:
        parse_kql(text)
    return info.value.code


# ---- binding sites (§42.4, §44.5) ---------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "FIND(?y) WHERE { ?x {} }",
    "FIND(?x) WHERE { ?x {} FILTER(?nope == 1) }",
    "FIND(?y) WHERE { ?x {} NOT { (?x, \"p\", ?y) } }",
    "FIND(?x) WHERE { ?x {} } ORDER BY ?y.name",
    'FIND(?x) WHERE { ?x {id: :a} UNION { FILTER(?x.name == "Alice") } }',
    'FIND(?x) WHERE { ?x {} OPTIONAL { NOT { ?y {} } } FILTER(IS_NULL(?y)) }',
])
def test_expression_variable_without_visible_binding_site(text: str) -> None:
    assert code_of(text) == "InvalidSyntax"


@pytest.mark.parametrize("text", [
    "FIND(?y) WHERE { ?x {} OPTIONAL { (?x, \"p\", ?y) } }",
    "FIND(?x, ?y) WHERE { ?x {} UNION { ?y {} } }",
    "FIND(?x) WHERE { ?x {} NOT { (?x, \"p\", ?y) FILTER(?y.n > ?x.n) } }",
    "FIND(?x) WHERE { FILTER(IS_NULL(?x)) ?x {} }",
    "FIND(?t) WHERE { ?c {attributes: {tags: [?t]}} }",
    "FIND(?pred) WHERE { (?s, ?pred, ?o) }",
])
def test_visible_binding_sites(text: str) -> None:
    parse_kql(text)


# ---- quantified predicate variables (§45) --------------------------------------------------------

@pytest.mark.parametrize("text", [
    "FIND(?x) WHERE { (?x, ?p{1,3}, ?y) }",
    "FIND(?x) WHERE { (?x, ?p | \"q\", ?y) }",
    "FIND(?x) WHERE { (?x, \"q\" | ?p, ?y) }",
    "FIND(?x) WHERE { (?x, \"q\"{4,2}, ?y) }",
    "FIND(?x) WHERE { ?r (?x, \"q\"{2}, ?y) }",
    "FIND(?x) WHERE { ?r (?x, \"q\"{0,1}, ?y) }",
    "FIND(?x) WHERE { (?x, \"m\", (?a, \"q\"{1,2}, ?b)) }",
])
def test_path_rules(text: str) -> None:
    assert code_of(text) == "InvalidSyntax"


def test_single_hop_alternatives_may_bind_a_proposition() -> None:
    parse_kql('FIND(?r) WHERE { ?r (?x, "a" | "b", ?y) }')
    parse_kql('FIND(?r) WHERE { ?r (?x, "a"{1}, ?y) }')


# ---- BELIEF bounds (§46.3) ---------------------------------------------------------------------------

def test_belief_on_unbound_proposition_variable() -> None:
    assert code_of("FIND(?b) WHERE { ?b BELIEF (?p) }") == "ProjectionTargetUnbound"
    # bound only later is still unbound at the BELIEF
    assert code_of('FIND(?b) WHERE { ?b BELIEF (?p) ?p (?s, "x", ?o) }') == "ProjectionTargetUnbound"
    # NOT-local bindings do not bind it outside
    assert code_of('FIND(?b) WHERE { ?s {} NOT { ?p (?s, "x", ?o) } ?b BELIEF (?p) }') == "ProjectionTargetUnbound"


@pytest.mark.parametrize("text", [
    'FIND(?b) WHERE { ?b BELIEF (?s, "ak_holds", true) }',
    'FIND(?b) WHERE { ?b BELIEF SLOT (?s, "ak_holds") }',
    'FIND(?b) WHERE { ?s {} ?b BELIEF (?s, ?pred, true) }',
])
def test_unbounded_belief(text: str) -> None:
    assert code_of(text) == "ProjectionTargetUnbounded"


@pytest.mark.parametrize("text", [
    'FIND(?b) WHERE { ?p (?s, "ak_holds", true) ?b BELIEF (?p) }',
    'FIND(?b) WHERE { ?b BELIEF (id: :pid) }',
    'FIND(?b) WHERE { ?b BELIEF (:cid, "ak_holds", true) }',
    'FIND(?b) WHERE { ?b BELIEF ({type: "KnowledgeCapsule", key: :k}, "ak_holds", true) }',
    'FIND(?b) WHERE { ?s {type: "Agent"} ?b BELIEF SLOT (?s, "ak_holds") }',
    'FIND(?b) WHERE { ?s {} OPTIONAL { ?p (?s, "ak_holds", true) } ?b BELIEF (?p) }',
])
def test_bounded_belief(text: str) -> None:
    parse_kql(text)


# ---- Search Pattern inside NOT (§43.8) ----------------------------------------------------------------

@pytest.mark.parametrize("text", [
    'FIND(?x) WHERE { ?x {} NOT { ?h SEARCH CONCEPT "a" LIMIT 5 } }',
    'FIND(?x) WHERE { ?x {} NOT { OPTIONAL { ?h SEARCH CONCEPT "a" LIMIT 5 } } }',
    'FIND(?x) WHERE { ?x {} NOT { UNION { ?h SEARCH CONCEPT "a" LIMIT 5 } } }',
])
def test_search_inside_not(text: str) -> None:
    assert code_of(text) == "InvalidSyntax"


def test_search_inside_optional_and_union_is_fine() -> None:
    parse_kql('FIND(?x, ?h) WHERE { ?x {} OPTIONAL { ?h SEARCH CONCEPT "a" LIMIT 5 } '
              'UNION { ?h SEARCH EVIDENCE "b" LIMIT 1 } }')


@pytest.mark.parametrize(("mods", "code"), [
    ('MODE "fuzzy" LIMIT 3', "InvalidSyntax"),
    ("THRESHOLD 1.5 LIMIT 3", "ConstraintViolation"),
    ('THRESHOLD "high" LIMIT 3', "TypeMismatch"),
    ("LIMIT -3", "ConstraintViolation"),
    ("LIMIT 2.5", "TypeMismatch"),
])
def test_search_literal_modifiers(mods: str, code: str) -> None:
    assert code_of(f'FIND(?h) WHERE {{ ?h SEARCH CONCEPT "a" {mods} }}') == code


# ---- aggregates ----------------------------------------------------------------------------------------

def test_aggregate_ordering_rules() -> None:
    parse_kql('FIND(?x.kind, COUNT(?y)) WHERE { ?x {} OPTIONAL { (?x, "p", ?y) } } ORDER BY COUNT(?y) DESC, ?x.kind')
    assert code_of('FIND(?x) WHERE { ?x {} } ORDER BY COUNT(?x)') == "InvalidSyntax"
    assert code_of('FIND(?x.kind, COUNT(?x)) WHERE { ?x {} } ORDER BY ?x.name') == "InvalidSyntax"


# ---- functions, literals, epistemic --------------------------------------------------------------------

@pytest.mark.parametrize(("filter_", "code"), [
    ("NOPE(?x)", "InvalidSyntax"),
    ("IS_NULL(?x, ?x)", "InvalidSyntax"),
    ("REGEX(?x.name)", "InvalidSyntax"),
    ('REGEX(?x.name, "[")', "InvalidSyntax"),
    (r'REGEX(?x.name, "(a)\\1")', "InvalidSyntax"),
    ('REGEX(?x.name, "(?=a)")', "InvalidSyntax"),
    ('IN(?x.name, "a")', "TypeMismatch"),
])
def test_function_errors(filter_: str, code: str) -> None:
    assert code_of(f"FIND(?x) WHERE {{ ?x {{}} FILTER({filter_}) }}") == code


@pytest.mark.parametrize(("tail", "code"), [
    ("LIMIT -1", "ConstraintViolation"),
    ("LIMIT 1.5", "TypeMismatch"),
    ('LIMIT "3"', "TypeMismatch"),
    ('CURSOR ""', "CursorInvalid"),
    ("CURSOR 5", "CursorInvalid"),
    ("AS OF SEQ -1", "ConstraintViolation"),
    ("FOR TIME 5", "TypeMismatch"),
    ("WITH EPISTEMIC {colour: 1}", "InvalidSyntax"),
    ('WITH EPISTEMIC {explanation: "all"}', "InvalidSyntax"),
    ("WITH EPISTEMIC {policy: ?x}", "InvalidSyntax"),
])
def test_literal_tail_errors(tail: str, code: str) -> None:
    assert code_of(f"FIND(?x) WHERE {{ ?x {{}} }} {tail}") == code


def test_id_form_requires_a_string() -> None:
    assert code_of("FIND(?p) WHERE { ?p (id: 5) }") == "TypeMismatch"


def test_parameter_names_are_collected_everywhere() -> None:
    q = parse_kql('FIND(?x) WHERE { ?x {id: :a} ?p (?x, :pred, (id: :b)) ?h SEARCH CONCEPT :t LIMIT :k '
                  'FILTER(IN(?x.name, [:c])) } AS OF SEQ :s FOR TIME :ft WITH EPISTEMIC {policy: :pol} '
                  'LIMIT :l CURSOR :cur')
    assert parameter_names(q) == {"a", "pred", "b", "t", "k", "c", "s", "ft", "pol", "l", "cur"}
