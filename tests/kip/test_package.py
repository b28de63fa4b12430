"""The schema package artifact, the Schema Environment and the operator configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from akrelay.kip import KipConfig, KipError
from akrelay.kip.package import DEFAULT_PACKAGE_PATH, SchemaEnvironment, load_package

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "schemas" / "kip-akrelay-agent-knowledge-1.0.0.json"


def test_artifact_declares_exactly_the_issue_symbols() -> None:
    pkg = load_package(ARTIFACT)
    assert pkg.ref == "kip://akrelay/agent-knowledge@1.0.0"
    by_kind: dict[str, set[str]] = {}
    for name, sym in pkg.symbols.items():
        by_kind.setdefault(sym["kind"], set()).add(name)
    assert by_kind == {
        "ConceptType": {"Agent", "KnowledgeCapsule"},
        "StructuralField": {"ak_published_by"},
        "Predicate": {"ak_holds", "ak_derived_from", "ak_addresses", "ak_tests", "ak_extends", "ak_supports",
                      "ak_contradicts", "ak_supersedes", "ak_contains"},
        "Facet": {"AkEvent", "AkAssessment"},
    }
    holds = pkg.symbols["ak_holds"]
    assert holds["object"] == {"literal_types": ["boolean"]} and holds["functional"] is False
    assert set(pkg.symbols["KnowledgeCapsule"]["attributes"]["fields"]) == {
        "kind", "title", "statement", "language", "licence", "context_scope", "conditions", "limitations", "basis",
        "tags", "created_at"}
    assert set(pkg.symbols["AkAssessment"]["fields"]) == {"verdict", "summary"}


def test_installed_copy_is_identical() -> None:
    data_copy = ROOT / "src" / "akrelay" / "data" / ARTIFACT.name
    assert data_copy.read_bytes() == ARTIFACT.read_bytes()
    assert Path(DEFAULT_PACKAGE_PATH).read_bytes() == ARTIFACT.read_bytes()
    request = ROOT / "src" / "akrelay" / "data" / "kip-request.schema.json"
    assert request.read_bytes() == (ROOT / "tests" / "kip" / "schemas" / "kip-request.schema.json").read_bytes()


def _write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_bad_packages_are_refused(tmp_path: Path) -> None:
    base = json.loads(ARTIFACT.read_text())
    with pytest.raises(ValueError, match="shadows"):
        load_package(_write(tmp_path, "a.json", {**base, "symbols": {"Assertion": {"kind": "ConceptType"}}}))
    with pytest.raises(ValueError, match="ref"):
        load_package(_write(tmp_path, "b.json", {**base, "ref": "akrelay/agent-knowledge"}))
    with pytest.raises(ValueError, match="unknown kind"):
        load_package(_write(tmp_path, "c.json", {**base, "symbols": {"X": {"kind": "Macro"}}}))


def test_ambiguous_local_names_fail(tmp_path: Path) -> None:
    other = _write(tmp_path, "other.json", {"ref": "kip://example/other@2.0.0",
                                           "symbols": {"Agent": {"kind": "ConceptType", "description": "x"}}})
    env = SchemaEnvironment([load_package(ARTIFACT), load_package(other)])
    with pytest.raises(KipError) as exc:
        env.resolve("Agent", "ConceptType")
    assert exc.value.code == "SchemaSymbolAmbiguous"
    assert env.resolve("kip://example/other@2.0.0/Agent")[0] == "kip://example/other@2.0.0/Agent"
    assert env.resolve("kip://akrelay/agent-knowledge/Agent")[0] == "kip://akrelay/agent-knowledge@1.0.0/Agent"


def test_operator_configuration_file(tmp_path: Path) -> None:
    (tmp_path / "kip-config.json").write_text(json.dumps(
        {"trust": {"did:agent:abc": "blocked", "did:agent:def": "trusted"}, "default_policy": "kip:structural"}))
    config = KipConfig.load(tmp_path, origin="https://relay.example.org")
    assert config.trust.of("did:agent:abc") == "blocked" and config.trust.of("did:agent:zzz") == "unknown"
    assert config.default_policy == "kip:structural" and config.space_id == "akrelay:relay.example.org"
    (tmp_path / "kip-config.json").write_text(json.dumps({"trust": {"did:agent:abc": "root"}}))
    with pytest.raises(ValueError):
        KipConfig.load(tmp_path)
    (tmp_path / "kip-config.json").write_text(json.dumps({"install_from_events": True}))
    with pytest.raises(ValueError, match="unknown"):
        KipConfig.load(tmp_path)
    assert KipConfig.load(tmp_path / "absent", origin="https://x.example").space_id == "akrelay:x.example"


def test_runtime_refuses_a_configuration_without_the_package_or_with_an_unknown_policy(tmp_path: Path) -> None:
    from akrelay.kip.runtime import KipRuntime

    other = _write(tmp_path, "other.json", {"ref": "kip://example/other@2.0.0",
                                           "symbols": {"Thing": {"kind": "ConceptType", "description": "x"}}})
    with pytest.raises(ValueError, match="agent-knowledge"):
        KipRuntime(KipConfig(package_paths=(str(other),)))
    with pytest.raises(ValueError, match="policy"):
        KipRuntime(KipConfig(default_policy="kip:optimistic"))
