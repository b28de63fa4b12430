"""Vector loading and small helpers for the service tests."""

from __future__ import annotations

from vector_mutations import apply_changes  # noqa: F401  (re-exported for the tests here)

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from akrelay.protocol.envelope import Envelope
from akrelay.relay.core import Relay

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[1] / "vectors" / "agent-knowledge-1.0.vectors.json").read_text(encoding="utf-8")
)
FIXTURES: dict[str, Any] = VECTORS["fixtures"]
NOW: int = VECTORS["now"]
SERVICE = "https://knowledge.example.com"
SECRET = b"service-tests-cursor-secret-0001"


class Clock:
    """A settable millisecond clock."""

    def __init__(self, now: int = NOW) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def raw(name: str) -> bytes:
    """The fixture envelope as submitted bytes."""
    return json.dumps(FIXTURES[name]["envelope"], ensure_ascii=False).encode("utf-8")


def hash_of(name: str) -> str:
    return FIXTURES[name]["envelope"]["hash"]


def signed(name: str) -> dict[str, Any]:
    return copy.deepcopy(FIXTURES[name]["envelope"])


@lru_cache(maxsize=None)
def envelope(name: str) -> Envelope:
    from akrelay.protocol.envelope import verify_envelope

    return verify_envelope(raw(name))


def state(relay: Relay) -> tuple[int, list[tuple[str, int, int, bool]]]:
    """Everything a rejected step must leave unchanged."""
    records = relay.store.iter_records(0, 10**6)
    return relay.store.checkpoint(), [(r.envelope.id, r.seq, r.accepted_at, r.withheld) for r in records]


