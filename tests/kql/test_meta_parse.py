"""parse_meta: every META command of issue 6, the unsupported families, and errors."""

from __future__ import annotations

import pytest

from akrelay.kip.kql import KqlError, Literal, Param, parse_meta
from akrelay.kip.kql import meta as m


def test_describe_primer_default_and_modes() -> None:
    assert parse_meta("DESCRIBE PRIMER") == m.DescribePrimer(mode=None)
    assert parse_meta('DESCRIBE PRIMER MODE "compact"') == m.DescribePrimer(mode=Literal("compact"))
    assert parse_meta('describe primer mode "full"') == m.DescribePrimer(mode=Literal("full"))
    assert parse_meta("DESCRIBE PRIMER MODE :m") == m.DescribePrimer(mode=Param("m"))


def test_describe_primer_rejects_unknown_literal_mode() -> None:
    with pytest.raises(KqlError) as info:
        parse_meta('DESCRIBE PRIMER MODE "tiny"')
    assert info.value.code == "InvalidSyntax"
    assert "compact" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("DESCRIBE PROTOCOL", m.DescribeProtocol()),
        ("DESCRIBE CAPABILITIES", m.DescribeCapabilities()),
        ("DESCRIBE SPACE", m.DescribeSpace()),
        ("DESCRIBE SPACE :s", m.DescribeSpace(space=Param("s"))),
        ("DESCRIBE SCHEMA ENVIRONMENT", m.DescribeSchemaEnvironment()),
        ("DESCRIBE SCHEMA ENVIRONMENT AS OF SEQ 3", m.DescribeSchemaEnvironment(as_of_seq=Literal(3))),
        ('DESCRIBE TYPE "Agent"', m.DescribeType(name=Literal("Agent"))),
        ("DESCRIBE PREDICATE :p", m.DescribePredicate(name=Param("p"))),
        ("DESCRIBE EPISTEMIC POLICY", m.DescribeEpistemicPolicy()),
        ('DESCRIBE EPISTEMIC POLICY "kip:structural"', m.DescribeEpistemicPolicy(policy=Literal("kip:structural"))),
        ("DESCRIBE SNAPSHOT", m.DescribeSnapshot()),
        ("DESCRIBE SNAPSHOT AS OF SEQ :s", m.DescribeSnapshot(as_of_seq=Param("s"))),
        ('DESCRIBE SNAPSHOT AT TIME "2026-01-01T00:00:00Z"',
         m.DescribeSnapshot(at_time=Literal("2026-01-01T00:00:00Z"))),
        ("LIST TYPES", m.ListTypes()),
        ("LIST PREDICATES LIMIT 10 CURSOR :c", m.ListPredicates(limit=Literal(10), cursor=Param("c"))),
        ("LIST EPISTEMIC POLICIES CURSOR \"abc\"", m.ListEpistemicPolicies(cursor=Literal("abc"))),
    ],
)
def test_served_commands_parse_to_their_nodes(text: str, expected: m.MetaCommand) -> None:
    assert parse_meta(text) == expected


@pytest.mark.parametrize("kind", ["CONCEPT", "PROPOSITION", "ASSERTION", "EVIDENCE"])
def test_search_with_every_modifier(kind: str) -> None:
    cmd = parse_meta(
        f'SEARCH {kind.lower()} :term WITH TYPE "KnowledgeCapsule" MODE "keyword" THRESHOLD 0.25 LIMIT 5 CURSOR :c'
    )
    assert cmd == m.Search(
        kind=kind, term=Param("term"), with_type=Literal("KnowledgeCapsule"), mode=Literal("keyword"),
        threshold=Literal(0.25), limit=Literal(5), cursor=Param("c"),
    )
    assert cmd.family == "SEARCH" and cmd.target == kind
    assert cmd.parameter_names() == {"term", "c"}


def test_search_minimal_and_string_term() -> None:
    assert parse_meta('SEARCH CONCEPT "alice"') == m.Search(kind="CONCEPT", term=Literal("alice"))


def test_search_rejects_unknown_literal_mode() -> None:
    with pytest.raises(KqlError) as info:
        parse_meta('SEARCH CONCEPT :t MODE "fuzzy"')
    assert info.value.code == "InvalidSyntax"


def test_search_modifier_order_is_fixed() -> None:
    with pytest.raises(KqlError) as info:
        parse_meta('SEARCH CONCEPT :t LIMIT 3 WITH TYPE "x"')
    assert info.value.code == "InvalidSyntax"


@pytest.mark.parametrize(
    ("text", "family", "target"),
    [
        ('DESCRIBE PACKAGE "kip://x@1"', "DESCRIBE", "PACKAGE"),
        ("DESCRIBE FACET :f", "DESCRIBE", "FACET"),
        ('DESCRIBE TRANSACTION BY IDEMPOTENCY KEY "k"', "DESCRIBE", "TRANSACTION"),
        ("DESCRIBE TRUST", "DESCRIBE", "TRUST"),
        ("LIST SPACES", "LIST", "SPACES"),
        ("LIST DEPENDENTS :id DEPTH 2 LIMIT 5", "LIST", "DEPENDENTS"),
        ("VERIFY SCHEMA PACKAGE :p", "VERIFY", "SCHEMA PACKAGE"),
        ("VALIDATE KQL :q", "VALIDATE", "KQL"),
        ("PREVIEW KML :cmd", "PREVIEW", "KML"),
        ("HISTORY SPACE FROM SEQ 1 TO SEQ 4 LIMIT 2", "HISTORY", "SPACE"),
        ("CHANGES AFTER SEQ 4", "CHANGES", "AFTER SEQ"),
        ('EXPORT CAPSULE ?r WHERE { ?r {type: "KnowledgeCapsule", id: :x} }', "EXPORT", "CAPSULE"),
        ("SEARCH ACTIVITY :t", "SEARCH", "ACTIVITY"),
    ],
)
def test_unserved_families_parse_instead_of_failing(text: str, family: str, target: str) -> None:
    cmd = parse_meta(text)
    assert (cmd.family, cmd.target) == (family, target)


def test_other_meta_reports_its_parameters() -> None:
    cmd = parse_meta('EXPORT CAPSULE ?r WHERE { ?r {id: :root} (?r, "ak_tests", :other) }')
    assert isinstance(cmd, m.OtherMeta)
    assert cmd.parameter_names() == {"root", "other"}


@pytest.mark.parametrize(
    "text",
    ["DESCRIBE", "DESCRIBE TYPE", "LIST", "LIST TYPES LIMIT", "SEARCH CONCEPT", "DESCRIBE PRIMER MODE compact",
     "FROB", "", "DESCRIBE PROTOCOL extra"],
)
def test_malformed_meta_is_invalid_syntax_with_position_and_hint(text: str) -> None:
    with pytest.raises(KqlError) as info:
        parse_meta(text)
    err = info.value
    assert err.code == "InvalidSyntax"
    assert err.line == 1 and isinstance(err.column, int) and err.column >= 1
    wire = err.to_wire()
    assert wire["category"] == "syntax" and wire["details"]["line"] == 1


def test_as_of_tx_is_rejected_with_a_seq_hint() -> None:
    with pytest.raises(KqlError) as info:
        parse_meta("DESCRIBE SNAPSHOT AS OF TX :t")
    assert "AS OF SEQ" in (info.value.hint or "")
    assert info.value.column == 25


def test_error_position_on_a_later_line() -> None:
    with pytest.raises(KqlError) as info:
        parse_meta("// grounding\nDESCRIBE\n  TYPE ,")
    assert (info.value.line, info.value.column) == (3, 8)


def test_single_quoted_string_hint() -> None:
    with pytest.raises(KqlError) as info:
        parse_meta("DESCRIBE TYPE 'Agent'")
    assert "double quotes" in (info.value.hint or "")


def test_numbers_follow_the_safe_integer_rule() -> None:
    assert parse_meta("LIST TYPES LIMIT 9007199254740991").limit == Literal(9007199254740991)
    assert parse_meta("LIST TYPES LIMIT 1e2").limit == Literal(100)
    for bad in ("9007199254740992", "1e300000", "1e-400", "9.007199254740993e15"):
        with pytest.raises(KqlError) as info:
            parse_meta(f"LIST TYPES LIMIT {bad}")
        assert info.value.code == "InvalidSyntax", bad


def test_strings_are_json_strings() -> None:
    assert parse_meta(r'DESCRIBE TYPE "A\u00e9\n\"q\""').name == Literal('A\u00e9\n"q"')
    # NFC normalisation of literals (§9.6): e + combining acute == precomposed é.
    assert parse_meta('DESCRIBE TYPE "e\u0301"').name == Literal("\u00e9")
    for bad in (r'"\x41"', '"tab\there"', r'"\ud800"'):
        with pytest.raises(KqlError):
            parse_meta(f"DESCRIBE TYPE {bad}")


def test_true_false_null_are_case_sensitive() -> None:
    assert parse_meta("DESCRIBE SPACE null").space == Literal(None)
    assert parse_meta("DESCRIBE SPACE true").space == Literal(True)
    with pytest.raises(KqlError) as info:
        parse_meta("DESCRIBE SPACE NULL")
    assert info.value.code == "InvalidSyntax"


def test_comments_and_case_insensitive_keywords() -> None:
    assert parse_meta("// startup\nDeScRiBe  pRiMeR // trailing\n") == m.DescribePrimer()
