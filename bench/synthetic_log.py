"""A synthetic acceptance log for the benchmarks that import records directly (KIP, KQL).

Envelopes are well formed but carry a placeholder signature and no JCS bytes:
importing into a nexus trusts what the service verified, so signing is not
what these benchmarks measure. IDs are SHA3-256 of a caller-chosen label, so
a seed gives the same log every run.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Callable

from akrelay.protocol.envelope import Envelope
from akrelay.store.base import Record

BASE_TIME = 1_790_000_000_000


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def agent_ids(label: str, count: int) -> list[str]:
    """``count`` distinct Agent IDs derived from ``label`` and an index."""
    return ["did:agent:" + b64(hashlib.sha256(f"{label}{i}".encode()).digest()) for i in range(count)]


class SyntheticLog:
    """Records in ``seq`` order with per-actor nonces and a clock that moves ``step`` ms per event."""

    def __init__(self, actors: list[str], *, step: int, accepted_delay: int,
                 id_label: Callable[[int, str, str], str]) -> None:
        self.records: list[Record] = []
        self._nonces = dict.fromkeys(actors, 0)
        self._t = BASE_TIME
        self._step, self._delay, self._id_label = step, accepted_delay, id_label

    def add(self, etype: str, actor: str, payload: dict[str, Any]) -> str:
        """Append one event; return its ID."""
        self._t += self._step
        self._nonces[actor] += 1
        event = {"protocol": "agent-knowledge/1.0", "type": etype, "actor": actor, "created_at": self._t,
                 "nonce": self._nonces[actor], "payload": payload}
        eid = b64(hashlib.sha3_256(self._id_label(len(self.records), etype, actor).encode()).digest())
        envelope = Envelope(id=eid, event=event, signature="A" * 86, event_jcs=b"")
        self.records.append(Record(seq=len(self.records) + 1, accepted_at=self._t + self._delay, envelope=envelope))
        return eid
