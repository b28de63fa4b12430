"""Test-only fixture loader: nexus state seeded from signed agent-knowledge events.

Every fixture is a log of real signed envelopes (Ed25519, via the project's
signer) turned into acceptance records and imported one transaction per event,
exactly as the relay's follower does; the tests then read it through KQL.
"""

from __future__ import annotations

from typing import Any

from akrelay.kip import KipConfig, TrustState, import_record
from akrelay.kip.kql.evaluate import run
from akrelay.kip.runtime import KipRuntime
from akrelay.protocol.envelope import Envelope
from akrelay.protocol.jcs import canonicalize
from akrelay.protocol.signer import Signer, assess_event, publish_event, retract_event
from akrelay.store.base import Record

from nexus_backends import new_nexus

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
ORIGIN = "https://kql.relay.example"
T0 = 1_790_000_000_000
NOW = T0 + 10_000_000  # a fixed "now" for cursor expiry


class Log:
    """Agents sign events; each accepted event becomes one record with the next seq."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.signers: dict[str, Signer] = {}
        self.nonces: dict[str, int] = {}
        self.clock = T0

    def signer(self, name: str) -> Signer:
        if name not in self.signers:
            self.signers[name] = Signer.from_seed(("kql-" + name).encode().ljust(32, b"\0")[:32])
        return self.signers[name]

    def did(self, name: str) -> str:
        return self.signer(name).agent_id

    def _emit(self, name: str, build: Any, payload: dict[str, Any]) -> str:
        signer = self.signer(name)
        self.nonces[name] = self.nonces.get(name, 0) + 1
        self.clock += 1000
        signed = signer.sign(build(signer.agent_id, self.clock, self.nonces[name], payload))
        envelope = Envelope(id=signed["hash"], event=signed["event"], signature=signed["signature"],
                            event_jcs=canonicalize(signed["event"]))
        self.records.append(Record(seq=len(self.records) + 1, accepted_at=self.clock + 7, envelope=envelope))
        return envelope.id

    def publish(self, name: str, title: str, *, kind: str = "observation", statement: str = "A statement.",
                tags: list[str] | None = None, relations: list[tuple[str, str]] | None = None) -> str:
        payload: dict[str, Any] = {"license": LICENSE, "kind": kind, "title": title, "statement": statement,
                                   "language": "en", "basis": "A basis.",
                                   "context": {"scope": "KQL tests.", "conditions": [], "limitations": []}}
        if tags:
            payload["tags"] = tags
        if relations:
            payload["relations"] = [{"relation": r, "target": t} for r, t in relations]
        return self._emit(name, publish_event, payload)

    def assess(self, name: str, target: str, verdict: str, summary: str = "An assessment.") -> str:
        payload: dict[str, Any] = {"license": LICENSE, "target": target, "verdict": verdict, "summary": summary,
                                   "basis": "A basis.",
                                   "context": {"scope": "KQL tests.", "conditions": [], "limitations": []}}
        if verdict in ("reproduced", "not_reproduced", "applied"):
            payload["reproduction"] = {"environment": "env", "steps": ["step"], "expected": "x", "observed": "y"}
        return self._emit(name, assess_event, payload)

    def retract(self, name: str, target: str, reason: str = "Withdrawn.") -> str:
        return self._emit(name, retract_event, {"license": LICENSE, "target": target, "reason": reason})

    # ---- nexus and runtime ---------------------------------------------------------------

    def runtime(self, *, upto: int | None = None, trust: dict[str, str] | None = None,
                policy: str | None = None) -> KipRuntime:
        config = KipConfig(origin=ORIGIN, trust=TrustState(dict(trust or {})),
                           **({"default_policy": policy} if policy else {}))
        nexus = new_nexus(config.space_id)
        for record in self.records[:upto]:
            import_record(nexus, record)
        return KipRuntime(config, nexus, cursor_secret=b"kql-tests-cursor-secret")

    def relay_data(self, path: Any, origin: str = ORIGIN) -> Any:
        """A relay data directory (SQLite store) in which a real relay accepted every event."""
        import json

        from akrelay.relay.config import RelayConfig
        from akrelay.relay.core import open_relay

        relay = open_relay(path, RelayConfig(origin=origin), clock=lambda: self.clock + 1000)
        try:
            for record in self.records:
                env = record.envelope
                assert relay.submit(json.dumps({"hash": env.id, "event": env.event,
                                                "signature": env.signature}).encode())
        finally:
            relay.close()
        return path

    def extend(self, rt: KipRuntime) -> None:
        """Import records the runtime has not seen yet (the follower catching up)."""
        for record in self.records:
            if record.seq > rt.nexus.head:
                import_record(rt.nexus, record)


def kql(rt: KipRuntime, command: str, **params: Any) -> dict[str, Any]:
    """Run one query at the head; returns ``{"result", "context"}``."""
    return run(rt, command, params, now_ms=NOW)


def rows(rt: KipRuntime, command: str, **params: Any) -> list[list[Any]]:
    return kql(rt, command, **params)["result"]["rows"]


def request(rt: KipRuntime, *ops: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    """A KIP request envelope through the runtime (the POST /v1/kip path, in process)."""
    body = {"kip": "2.0", "operations": list(ops), **envelope}
    status, response = rt.execute(body)
    response["_http_status"] = status
    return response
