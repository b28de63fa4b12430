"""Builders for KIP tests: signed envelopes and acceptance records, no store needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from akrelay.kip import KipConfig, NexusBase, import_record
from akrelay.protocol.envelope import Envelope
from akrelay.protocol.jcs import canonicalize
from akrelay.protocol.signer import Signer, assess_event, publish_event, retract_event
from akrelay.store.base import Record

from nexus_backends import new_nexus, nexus_backend  # noqa: F401  (autouse: every test runs on both backends)

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "agent-knowledge-1.0.vectors.json"
LICENSE = "https://creativecommons.org/licenses/by/4.0/"
T0 = 1_790_553_600_000
ORIGIN = "https://relay.example.org"


def envelope_from_dict(env: dict[str, Any]) -> Envelope:
    return Envelope(id=env["hash"], event=env["event"], signature=env["signature"],
                    event_jcs=canonicalize(env["event"]))


def context(scope: str = "A unit-test fixture.") -> dict[str, Any]:
    return {"scope": scope, "conditions": [], "limitations": []}


class World:
    """A log under construction: agents sign, ``records`` grow with increasing seq."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.signers: dict[str, Signer] = {}
        self.nonces: dict[str, int] = {}
        self.clock = T0

    def agent(self, name: str) -> Signer:
        if name not in self.signers:
            self.signers[name] = Signer.from_seed(name.encode().ljust(32, b"\0")[:32])
        return self.signers[name]

    def did(self, name: str) -> str:
        return self.agent(name).agent_id

    def _sign(self, name: str, build: Any, payload: dict[str, Any]) -> Envelope:
        signer = self.agent(name)
        self.nonces[name] = self.nonces.get(name, 0) + 1
        self.clock += 1000
        event = build(signer.agent_id, self.clock, self.nonces[name], payload)
        return envelope_from_dict(signer.sign(event))

    def accept(self, envelope: Envelope) -> Record:
        record = Record(seq=len(self.records) + 1, accepted_at=self.clock + 5, envelope=envelope)
        self.records.append(record)
        return record

    def publish(self, name: str, kind: str = "observation", title: str = "A title", *,
                relations: list[tuple[str, str]] | None = None, statement: str = "A statement.",
                tags: list[str] | None = None) -> Envelope:
        payload: dict[str, Any] = {"license": LICENSE, "kind": kind, "title": title, "statement": statement,
                                   "language": "en", "context": context(), "basis": "A basis."}
        if relations:
            payload["relations"] = [{"relation": r, "target": t} for r, t in relations]
        if tags:
            payload["tags"] = tags
        env = self._sign(name, publish_event, payload)
        self.accept(env)
        return env

    def assess(self, name: str, target: str, verdict: str, summary: str = "An assessment.") -> Envelope:
        payload: dict[str, Any] = {"license": LICENSE, "target": target, "verdict": verdict, "summary": summary,
                                   "context": context(), "basis": "A basis."}
        if verdict in ("reproduced", "not_reproduced", "applied"):
            payload["reproduction"] = {"environment": "env", "steps": ["step"], "expected": "x", "observed": "y"}
        env = self._sign(name, assess_event, payload)
        self.accept(env)
        return env

    def retract(self, name: str, target: str, reason: str = "Withdrawn.") -> Envelope:
        env = self._sign(name, retract_event, {"license": LICENSE, "target": target, "reason": reason})
        self.accept(env)
        return env

    def nexus(self, upto: int | None = None) -> NexusBase:
        nexus = new_nexus(KipConfig(origin=ORIGIN).space_id)
        for record in self.records[:upto]:
            import_record(nexus, record)
        return nexus


@pytest.fixture
def world() -> World:
    return World()


def vector_fixtures() -> dict[str, Any]:
    return json.loads(VECTORS.read_text(encoding="utf-8"))["fixtures"]
