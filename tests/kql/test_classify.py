"""Language classification (§73.1): KML is recognised so the read-only runtime refuses it."""

from __future__ import annotations

import pytest

from akrelay.kip.kql import classify, is_kml

KML = [
    'MUTATE { CREATE CONCEPT ?x {type: "A"} }',
    'CREATE CONCEPT ?c {type: "Person", name: "A"}',
    'UPSERT CONCEPT ?c {type: "Person", key: "a"}',
    'ENSURE PROPOSITION ?p (:a, "knows", :b)',
    'ASSERT (:a, "knows", :b) {stance: "support"}',
    'UPDATE ?x SET {name: "b"} WHERE { ?x {id: :i} }',
    'TRANSITION :a TO "retracted"',
    "SET RETENTION :x {until: null}",
    'PURGE :x CONFIRM "PURGE"',
    'PURGE PAYLOAD :x CONFIRM "PURGE"',
    "MERGE CONCEPT :a INTO :b",
    'DEFINE PREDICATE "p" {}',
    "// leading comment\n  mutate {",  # malformed, still KML
    "create",
]


@pytest.mark.parametrize("text", KML)
def test_kml_statements_are_recognised(text: str) -> None:
    assert classify(text) == "KML"
    assert is_kml(text)


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("FIND(?x) WHERE { ?x {} }", "KQL"),
        ("  find(", "KQL"),
        ("DESCRIBE PRIMER", "META"),
        ("PREVIEW KML :cmd", "META"),
        ("SEARCH CONCEPT :t", "META"),
        ("EXPORT CAPSULE ?r WHERE {}", "META"),
        ("SET x", None),
        ("", None),
        ("// only a comment", None),
        ("?x {}", None),
    ],
)
def test_other_languages(text: str, language: str | None) -> None:
    assert classify(text) == language
    assert not is_kml(text)
