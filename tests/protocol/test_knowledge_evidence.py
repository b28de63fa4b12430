"""evidence_cases: local digest checks over exact representation bytes."""

from __future__ import annotations

import pytest

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.evidence import digest_of, verify_evidence
from knowledge_vectors import VECTORS, cases

CASES = cases("evidence_cases")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_evidence_case(case):
    raw = bytes.fromhex(case["representation_hex"]) if case.get("representation_hex") is not None else None
    assert verify_evidence(case.get("digest"), raw) == case["expected"]


@pytest.mark.parametrize("name", ["profile", "output"])
def test_research_artifact_digests(name):
    artifact = VECTORS["research_artifacts"][name]
    raw = bytes.fromhex(artifact["representation_hex"])
    assert digest_of(raw) == artifact["digest"]
    assert verify_evidence(artifact["digest"], raw) == "matched"
    assert verify_evidence(artifact["digest"], raw + b"\n") == "mismatched"


def test_noncanonical_digest_is_rejected_not_mismatched():
    digest = VECTORS["research_artifacts"]["output"]["digest"]
    bad = digest[:-1] + ("p" if digest[-1] != "p" else "q")
    with pytest.raises(ProtocolError) as info:
        verify_evidence(bad, b"x")
    assert info.value.code == "invalid_event"


def test_text_is_not_a_representation():
    with pytest.raises(TypeError):
        verify_evidence(VECTORS["research_artifacts"]["output"]["digest"], "text")
