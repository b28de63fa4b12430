"""A real relay app with the KnowQL routes, and signed knowledge to ask it about."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.protocol.signer import Signer, assess_event, publish_event, retract_event
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay, open_relay
from akrelay.settings import defaults
from akrelay.store.memory import MemoryStore

ORIGIN = "https://localhost:8443"
NOW = 1_790_553_600_000
LICENSE = "https://creativecommons.org/licenses/by/4.0/"
JSON_HEADERS = {"content-type": "application/json"}


class Corpus:
    """Signed events from a few agents; each call returns the envelope dict."""

    def __init__(self) -> None:
        self.signers = {name: Signer.from_seed(name.encode().ljust(32, b"\0")[:32])
                        for name in ("alice", "bob", "carol", "dave")}
        self.nonce = 0

    def did(self, name: str) -> str:
        return self.signers[name].agent_id

    def _sign(self, name: str, build: Any, payload: dict[str, Any]) -> dict[str, Any]:
        self.nonce += 1
        event = build(self.signers[name].agent_id, NOW - 100_000 + self.nonce, self.nonce, payload)
        return self.signers[name].sign(event)

    def publish(self, name: str, title: str, statement: str, *, kind: str = "observation", tags: tuple = (),
                language: str = "en", relations: tuple = ()) -> dict[str, Any]:
        payload: dict[str, Any] = {"license": LICENSE, "kind": kind, "title": title, "statement": statement,
                                   "language": language, "context": {"scope": "test", "conditions": [],
                                                                      "limitations": []}, "basis": "A basis."}
        if tags:
            payload["tags"] = list(tags)
        if relations:
            payload["relations"] = [{"relation": r, "target": t} for r, t in relations]
        return self._sign(name, publish_event, payload)

    def assess(self, name: str, target: str, verdict: str, summary: str = "Checked.") -> dict[str, Any]:
        payload = {"license": LICENSE, "target": target, "verdict": verdict, "summary": summary,
                   "context": {"scope": "test", "conditions": [], "limitations": []}, "basis": "A basis."}
        return self._sign(name, assess_event, payload)

    def retract(self, name: str, target: str, reason: str = "Withdrawn.") -> dict[str, Any]:
        return self._sign(name, retract_event, {"license": LICENSE, "target": target, "reason": reason})


@dataclass
class KQ:
    client: TestClient
    relay: Relay
    corpus: Corpus
    node: Any

    def submit(self, *envelopes: dict[str, Any]) -> list[str]:
        for env in envelopes:
            r = self.client.post("/v1/knowledge/events", content=json.dumps(env), headers=JSON_HEADERS)
            assert r.status_code == 200, r.text
        self.node.search.engine.wait_indexed()
        return [e["hash"] for e in envelopes]

    def ask(self, body: Any, headers: dict[str, str] | None = None):
        content = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return self.client.post("/query", content=content, headers={**JSON_HEADERS, **(headers or {})})


@contextlib.contextmanager
def knowql_app(data: Path | None = None, **overrides: Any) -> Iterator[KQ]:
    settings = defaults(**({"write_rate": 0.0, "read_rate": 0.0, "knowql_rate": 0.0} | overrides))
    config = RelayConfig(origin=ORIGIN)
    if data is None:
        relay = Relay(MemoryStore(), config, clock=lambda: NOW, cursor_secret=b"k" * 32)
    else:
        relay = open_relay(data, config, clock=lambda: NOW)
    app = create_app(relay, settings)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield KQ(client, relay, Corpus(), app.state.node)
    finally:
        relay.close()


def sse_frames(text: str) -> list[dict[str, Any]]:
    """Parse an SSE body into frames ``{"id", "event", "data"}`` (comments dropped)."""
    frames = []
    for block in text.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        frame: dict[str, Any] = {"id": None}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            frame[name] = json.loads(value) if name == "data" else value
        frames.append(frame)
    return frames
