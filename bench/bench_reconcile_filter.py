"""What one ``type``-filtered reconciliation message costs the responder (issue 26).

A ``type`` filter has no precomputed fingerprints (``akrelay.store.recon`` keeps them per
time bucket only), so the endpoint reads the filtered set through the store's term index
for every message (``akrelay.federation.reconcile.filtered_items``), at most
``MAX_FILTERED`` events. This measures that read and one whole answer on a SQLite relay
holding ``--events`` publications and a quarter as many assessments, beside the same
message without a filter (answered from the aggregates), with CPU time next to wall time.

    python bench/bench_reconcile_filter.py [--events 20000]

The last line is ``reconcile_type_filter_message: <seconds> s`` (wall, the largest set).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from typing import Callable, TypeVar

from akrelay.federation.reconcile import MAX_FILTERED, Filter, filtered_items, respond
from akrelay.protocol.reconcile import Reconciler, SortedItems
from akrelay.protocol.signer import Signer, assess_event, publish_event
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import open_relay

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
T = TypeVar("T")
CONTEXT = {"scope": "A benchmark.", "conditions": [], "limitations": []}


def timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0, time.process_time() - c0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=MAX_FILTERED, help="publications (assessments: a quarter)")
    args = parser.parse_args()
    signer = Signer.from_seed(b"bench-reconcile-filter".ljust(32, b"\0"))
    created = int(time.time() * 1000) - 2 * args.events * 1000
    nonce = 0
    with tempfile.TemporaryDirectory() as data:
        relay = open_relay(data, RelayConfig(origin="https://localhost:8443"))
        try:
            for i in range(args.events):
                nonce += 1
                created += 1000
                env = signer.sign(publish_event(signer.agent_id, created, nonce, {
                    "license": LICENSE, "kind": "observation", "title": f"Event {i}",
                    "statement": f"Statement {i}.", "language": "en", "context": CONTEXT, "basis": "Measured."}))
                relay.submit(json.dumps(env).encode())
                if i % 4 == 0:
                    nonce += 1
                    created += 1000
                    relay.submit(json.dumps(signer.sign(assess_event(signer.agent_id, created, nonce, {
                        "license": LICENSE, "target": env["hash"], "verdict": "supports", "summary": "Checked.",
                        "context": CONTEXT, "basis": "Read it."}))).encode())
            store = relay.store
            print(f"store: SQLite, {store.checkpoint():,} records; MAX_FILTERED {MAX_FILTERED:,}")
            message = Reconciler(SortedItems([])).initiate()
            _, wall, cpu = timed(lambda: respond(store.recon, message))
            print(f"no filter: one message {wall:.3f} s wall, {cpu:.3f} s CPU (aggregates)")
            last = 0.0
            for etype in ("knowledge.assess", "knowledge.publish"):
                window = Filter(types=(etype,))
                items, rwall, rcpu = timed(lambda: filtered_items(store, window))
                _, wall, cpu = timed(lambda: respond(store.recon, message, types=(etype,), store=store))
                print(f"type={etype}: {items.size():,} events; read {rwall:.3f} s wall, {rcpu:.3f} s CPU; "
                      f"one message {wall:.3f} s wall, {cpu:.3f} s CPU")
                last = wall
            print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        finally:
            relay.close()
    print(f"reconcile_type_filter_message: {last:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
