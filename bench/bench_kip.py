"""KIP gateway figures: import throughput, DESCRIBE PRIMER and projection latency.

Builds an acceptance log of N capsules (default 100,000) with assessments and
retractions, imports it into a nexus the way the follower does (one import
transaction per record), then times ``DESCRIBE PRIMER`` through the full request
envelope and the ``ak_holds`` projection of one random capsule under the default
policy. Envelopes carry well-formed but unverified signatures: import never
verifies (the relay did, before acceptance), so signing would only time the
benchmark's own setup.

Goals (issue 6): import keeps up with ingest (2,000 events/s) off the acceptance
hot path; DESCRIBE PRIMER and projection p99 <= 10 ms at 100k capsules.

    python3 bench/bench_kip.py [--capsules N] [--samples N]

Throughput is reported per CPU second of the importing process (the follower is
one thread; on a shared machine wall time mostly measures the neighbours) and per
wall second. Last line: ``kip_import_throughput: <value> events/s`` (CPU).
"""

from __future__ import annotations

import argparse
import base64
import gc
import hashlib
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from akrelay.kip import KipConfig, Nexus, import_record  # noqa: E402
from akrelay.kip.runtime import KipRuntime  # noqa: E402
from akrelay.protocol.envelope import Envelope  # noqa: E402
from akrelay.store.base import Record  # noqa: E402

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
KINDS = ("observation", "inference", "hypothesis", "procedure", "question", "negative_result")
VERDICTS = ("supports", "challenges", "reproduced", "not_reproduced", "applied", "inconclusive")
WORDS = ("cache", "language", "key", "latency", "proof", "lemma", "dataset", "model", "error", "retry",
         "index", "shard", "graph", "token", "vector", "sample", "bias", "drift", "seed", "kernel")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def build_log(capsules: int, seed: int = 7) -> list[Record]:
    rng = random.Random(seed)
    actors = ["did:agent:" + _b64(hashlib.sha256(f"agent{i}".encode()).digest()) for i in range(200)]
    nonces = dict.fromkeys(actors, 0)
    records: list[Record] = []
    published: list[tuple[str, str]] = []
    t = 1_790_000_000_000

    def add(etype: str, actor: str, payload: dict) -> str:
        nonlocal t
        t += 7
        nonces[actor] += 1
        event = {"protocol": "agent-knowledge/1.0", "type": etype, "actor": actor, "created_at": t,
                 "nonce": nonces[actor], "payload": payload}
        eid = _b64(hashlib.sha3_256(f"{len(records)}:{etype}:{actor}".encode()).digest())
        env = Envelope(id=eid, event=event, signature="A" * 86, event_jcs=b"")
        records.append(Record(seq=len(records) + 1, accepted_at=t + 3, envelope=env))
        return eid

    while len(published) < capsules:
        actor = rng.choice(actors)
        title = " ".join(rng.choice(WORDS) for _ in range(4))
        payload = {"license": LICENSE, "kind": rng.choice(KINDS), "title": title,
                   "statement": f"{title} statement {len(published)}", "language": "en",
                   "context": {"scope": "bench", "conditions": [], "limitations": []}, "basis": "bench",
                   "tags": [rng.choice(WORDS)]}
        if published and rng.random() < 0.3:
            payload["relations"] = [{"relation": rng.choice(("derived_from", "extends", "supports")),
                                     "target": rng.choice(published)[1]}]
        published.append((actor, add("knowledge.publish", actor, payload)))
        if rng.random() < 0.5:
            target = rng.choice(published)[1]
            assessor = rng.choice(actors)
            verdict = rng.choice(VERDICTS)
            aid = add("knowledge.assess", assessor, {"license": LICENSE, "target": target, "verdict": verdict,
                                                     "summary": f"{verdict} {rng.choice(WORDS)}", "basis": "bench",
                                                     "context": {"scope": "bench", "conditions": [],
                                                                 "limitations": []}})
            if rng.random() < 0.05:
                add("knowledge.retract", assessor, {"license": LICENSE, "target": aid, "reason": "bench"})
    return records


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capsules", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()

    t0 = time.perf_counter()
    records = build_log(args.capsules)
    print(f"log: {len(records)} events ({args.capsules} capsules) built in {time.perf_counter() - t0:.1f} s")

    config = KipConfig(origin="https://relay.example.org")
    nexus = Nexus(config.space_id)
    t0, c0 = time.perf_counter(), time.process_time()
    for record in records:
        import_record(nexus, record)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    throughput = len(records) / cpu
    print(f"import: {len(records)} events in {elapsed:.2f} s wall, {cpu:.2f} s CPU; {len(nexus.elements)} elements")
    print(f"kip_import_throughput_wall: {len(records) / elapsed:.0f} events/s")

    # What open_runtime does after the initial catch-up: the nexus is long-lived and
    # append-only, so it leaves the cyclic collector's working set (no gen-2 pauses).
    gc.collect()
    gc.freeze()
    rt = KipRuntime(config, nexus, cursor_secret=b"b" * 32)
    rng = random.Random(1)
    request = {"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER"}]}
    primer = []
    for _ in range(args.samples):
        s = time.perf_counter()
        status, response = rt.execute(request)
        primer.append((time.perf_counter() - s) * 1000)
        assert response["status"] == "succeeded"
    capsule_ids = [r.envelope.id for r in records if r.envelope.type == "knowledge.publish"]
    projection = []
    for _ in range(args.samples):
        cid = rng.choice(capsule_ids)
        s = time.perf_counter()
        rt.project_capsule(cid)
        projection.append((time.perf_counter() - s) * 1000)
    historical = []
    for _ in range(args.samples // 4):
        cid = rng.choice(capsule_ids)
        s = time.perf_counter()
        rt.project_capsule(cid, as_of=nexus.head // 2) if nexus.holds(cid, nexus.head // 2) else None
        historical.append((time.perf_counter() - s) * 1000)
    search = []
    for _ in range(args.samples // 10):
        s = time.perf_counter()
        rt.meta(f'SEARCH CONCEPT "{rng.choice(WORDS)} {rng.choice(WORDS)}" LIMIT 20')
        search.append((time.perf_counter() - s) * 1000)

    for name, samples in (("describe_primer", primer), ("projection", projection),
                          ("projection_as_of", historical), ("search_concept", search)):
        p50, p99 = percentiles(samples)
        print(f"kip_{name}_p50: {p50:.3f} ms")
        print(f"kip_{name}_p99: {p99:.3f} ms")
    print(f"kip_import_throughput_vs_ingest_goal: {throughput / 2000:.1f} x")
    print(f"kip_import_throughput: {throughput:.0f} events/s")


if __name__ == "__main__":
    main()
