"""Signed capsules for the search tests: real envelopes with chosen eligible text."""

from __future__ import annotations

import json
from typing import Any, Sequence

from akrelay.protocol.envelope import Envelope, verify_envelope
from akrelay.protocol.signer import Signer, assess_event, publish_event, retract_event

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
SIGNERS = [Signer.from_seed(bytes([i + 1]) * 32) for i in range(3)]
T0 = 1_790_553_600_000
ORIGIN = "https://knowledge.example.com"


def _context(scope: str, conditions: Sequence[str], limitations: Sequence[str]) -> dict[str, Any]:
    return {"scope": scope, "conditions": list(conditions), "limitations": list(limitations)}


def publication(title: str, statement: str = "s", basis: str = "b", *, scope: str = "sc",
                conditions: Sequence[str] = (), limitations: Sequence[str] = (), kind: str = "observation",
                language: str = "en", tags: Sequence[str] = (), signer: int = 0, created_at: int = T0,
                nonce: int = 1) -> Envelope:
    payload: dict[str, Any] = {
        "license": LICENSE, "kind": kind, "title": title, "statement": statement, "language": language,
        "context": _context(scope, conditions, limitations), "basis": basis,
    }
    if tags:
        payload["tags"] = list(tags)
    return sign(publish_event(SIGNERS[signer].agent_id, created_at, nonce, payload), signer)


def assessment(target: str, summary: str, basis: str = "b", *, verdict: str = "supports", scope: str = "sc",
               signer: int = 1, created_at: int = T0, nonce: int = 1) -> Envelope:
    payload = {"license": LICENSE, "target": target, "verdict": verdict, "summary": summary,
               "context": _context(scope, (), ()), "basis": basis}
    return sign(assess_event(SIGNERS[signer].agent_id, created_at, nonce, payload), signer)


def retraction(target: str, reason: str, *, signer: int = 0, created_at: int = T0 + 1, nonce: int = 2,
               legacy: bool = True) -> Envelope:
    """``legacy``: the earlier draft's form without ``license``, which the reference SDK validates."""
    payload = {"target": target, "reason": reason} if legacy else {"license": LICENSE, "target": target,
                                                                     "reason": reason}
    return sign(retract_event(SIGNERS[signer].agent_id, created_at, nonce, payload), signer)


def sign(event: dict[str, Any], signer: int) -> Envelope:
    raw = json.dumps(SIGNERS[signer].sign(event), ensure_ascii=False).encode()
    return verify_envelope(raw)
