"""Shared loading of the agent-knowledge/1.0 vectors for the knowledge-layer tests.

Fixtures are real signed envelopes; :func:`envelope` verifies them with
``verify_envelope`` (so every knowledge test also exercises step 1).
"""

from __future__ import annotations

from vector_mutations import apply_changes  # noqa: F401  (re-exported for the tests here)

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from akrelay.protocol.envelope import Envelope, verify_envelope

VECTORS_PATH = Path(__file__).resolve().parents[1] / "vectors" / "agent-knowledge-1.0.vectors.json"
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "agent-knowledge-1.0.schema.json"
DRAFT_SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "agent-knowledge-1.0-draft-sdk.schema.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
FIXTURES: dict[str, Any] = VECTORS["fixtures"]
SERVICE = "https://knowledge.example.com"
NOW = VECTORS["now"]

def cases(group: str) -> list[dict[str, Any]]:
    return VECTORS[group]


def names(group: str) -> list[str]:
    return [c["name"] for c in VECTORS[group]]


def raw_envelope(name: str) -> dict[str, Any]:
    return copy.deepcopy(FIXTURES[name]["envelope"])


@lru_cache(maxsize=None)
def envelope(name: str) -> Envelope:
    """The verified fixture envelope (raises its ProtocolError if the fixture is invalid at step 1)."""
    return verify_envelope(json.dumps(FIXTURES[name]["envelope"], ensure_ascii=False).encode("utf-8"))


def from_dict(item: dict[str, Any]) -> Envelope:
    """An Envelope over an arbitrary (possibly mutated, unsigned) dict, for payload-layer tests."""
    return Envelope(item["hash"], item["event"], item["signature"], b"")


def hash_of(name: str) -> str:
    return FIXTURES[name]["envelope"]["hash"]


