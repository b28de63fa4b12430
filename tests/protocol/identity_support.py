"""Helpers for the identity-layer envelope tests: vector fixtures, JSON-pointer changes, re-signing."""

from __future__ import annotations

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


def _tokens(path: str) -> list[str]:
    assert path.startswith("/")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def apply_changes(value: Any, changes: list[dict[str, Any]]) -> Any:
    """Apply the vectors' ``changes`` ({op: set|remove, path, value}) to a deep copy."""
    result = copy.deepcopy(value)
    for change in changes:
        *parents, last = _tokens(change["path"])
        node = result
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        if change["op"] == "set":
            if isinstance(node, list):
                index = int(last)
                if index == len(node):
                    node.append(copy.deepcopy(change["value"]))
                else:
                    node[index] = copy.deepcopy(change["value"])
            else:
                node[last] = copy.deepcopy(change["value"])
        elif change["op"] == "remove":
            if isinstance(node, list):
                del node[int(last)]
            else:
                del node[last]
        else:  # pragma: no cover - the vectors only use these two
            raise ValueError(change["op"])
    return result


def resign(envelope: dict[str, Any], signer: Signer) -> dict[str, Any]:
    """Re-sign a (mutated) event so that its hash and signature are valid again."""
    return signer.sign(envelope["event"])
