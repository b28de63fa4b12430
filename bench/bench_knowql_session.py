"""A long KnowQL session: does turn N cost more than turn 10, and how big is ``GET /sessions/{id}``?

Runs the app in-process (Litestar's test client, a SQLite turn store in a temporary
data directory), publishes one capsule, asks ``--turns`` turns in one session and
reports the median latency of turns 10-29 and of the last twenty, and the size of the
session document (issue 24, item 6: before, turn 200 took 340 ms and 260 turns gave 15 MB).

Usage: python bench/bench_knowql_session.py [--turns 260]
Last line: ``knowql_session_last_vs_early: <ratio> ratio``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from litestar.testing import TestClient

from akrelay.process.worker import create_app
from akrelay.protocol.signer import Signer, publish_event
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import open_relay
from akrelay.settings import defaults

HEADERS = {"content-type": "application/json"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=260)
    args = parser.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="akrelay-bench-session-"))
    relay = open_relay(data, RelayConfig(origin="https://localhost:8443"))
    app = create_app(relay, defaults(write_rate=0.0, read_rate=0.0, knowql_rate=0.0))
    signer = Signer.from_seed(b"s" * 32)
    payload = {"license": "https://creativecommons.org/licenses/by/4.0/", "kind": "observation",
               "title": "Cache clears on restart", "statement": "Restarting the worker clears the cache. " * 40,
               "language": "en", "context": {"scope": "bench", "conditions": [], "limitations": []},
               "basis": "Synthetic."}
    envelope = signer.sign(publish_event(signer.agent_id, time.time_ns() // 1_000_000 - 1000, 1, payload))
    try:
        with TestClient(app) as client:
            assert client.post("/v1/knowledge/events", content=json.dumps(envelope), headers=HEADERS).status_code == 200
            app.state.node.search.engine.wait_indexed()
            first = client.post("/query", content=json.dumps({"ask": "cache restart", "scope": ["knowledge"]}),
                                headers=HEADERS).json()
            times = []
            for n in range(1, args.turns):
                body = json.dumps({"ask": f"cache restart {n}", "session_id": first["session_id"]})
                started = time.perf_counter()
                answer = client.post("/query", content=body, headers=HEADERS)
                times.append(time.perf_counter() - started)
                assert answer.status_code == 200, answer.text
            size = len(client.get(f"/sessions/{first['session_id']}").content)
    finally:
        relay.close()
    # Medians of 20 turns: one WAL checkpoint or a loaded machine's stall must not decide the figure.
    early, last = statistics.median(times[9:29]) * 1000, statistics.median(times[-20:]) * 1000
    print(f"turns 10-29: {early:.1f} ms median; last 20 of {args.turns}: {last:.1f} ms median")
    print(f"GET /sessions/{{id}} (first page): {size} bytes")
    print(f"knowql_session_last_vs_early: {last / early:.2f} ratio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
