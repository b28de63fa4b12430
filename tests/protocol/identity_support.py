"""Helpers for the identity-layer envelope tests: vector fixtures, JSON-pointer changes, re-signing."""

from __future__ import annotations

from vector_mutations import apply_changes  # noqa: F401  (re-exported for the tests here)

import copy
import json
from pathlib import Path
from typing import Any

from akrelay.protocol.signer import Signer

VECTORS_DIR = Path(__file__).resolve().parents[1] / "vectors"
KNOWLEDGE = json.loads((VECTORS_DIR / "agent-knowledge-1.0.vectors.json").read_text(encoding="utf-8"))
FIXTURES: dict[str, Any] = KNOWLEDGE["fixtures"]
SIGNERS = {name: Signer.from_seed(bytes.fromhex(seed)) for name, seed in KNOWLEDGE["seeds"].items()}


def fixture_envelope(name: str) -> dict[str, Any]:
    return copy.deepcopy(FIXTURES[name]["envelope"])


def fixture_signer(name: str) -> Signer:
    return SIGNERS[FIXTURES[name]["signer"]]


def to_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def resign(envelope: dict[str, Any], signer: Signer) -> dict[str, Any]:
    """Re-sign a (mutated) event so that its hash and signature are valid again."""
    return signer.sign(envelope["event"])
