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
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from akrelay.kip import KipConfig, Nexus, import_record  # noqa: E402
from akrelay.kip.runtime import KipRuntime  # noqa: E402
from akrelay.store.base import Record  # noqa: E402
from synthetic_log import SyntheticLog, agent_ids  # noqa: E402

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
KINDS = ("observation", "inference", "hypothesis", "procedure", "question", "negative_result")
VERDICTS = ("supports", "challenges", "reproduced", "not_reproduced", "applied", "inconclusive")
WORDS = ("cache", "language", "key", "latency", "proof", "lemma", "dataset", "model", "error", "retry",
         "index", "shard", "graph", "token", "vector", "sample", "bias", "drift", "seed", "kernel")


def build_log(capsules: int, seed: int = 7) -> list[Record]:
    rng = random.Random(seed)
    actors = agent_ids("agent", 200)
    log = SyntheticLog(actors, step=7, accepted_delay=3, id_label=lambda n, etype, actor: f"{n}:{etype}:{actor}")
    add = log.add
    published: list[tuple[str, str]] = []

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
    return log.records


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
    capsule_ids = [r.envelope.id for r in records if r.envelope.type == "knowledge.publish"]
    half = nexus.head // 2
    early = [r.envelope.id for r in records[:half] if r.envelope.type == "knowledge.publish"]
    request = {"kip": "2.0", "operations": [{"command": "DESCRIBE PRIMER"}]}

    def primer() -> None:
        status, response = rt.execute(request)
        assert response["status"] == "succeeded"

    cases = [
        ("describe_primer", primer, args.samples),
        ("projection", lambda: rt.project_capsule(rng.choice(capsule_ids)), args.samples),
        ("projection_as_of", lambda: rt.project_capsule(rng.choice(early), as_of=half), args.samples),
        ("search_concept", lambda: rt.meta(f'SEARCH CONCEPT "{rng.choice(WORDS)} {rng.choice(WORDS)}" LIMIT 20'),
         max(20, args.samples // 10)),
    ]
    for name, fn, n in cases:
        for _ in range(5):  # warm-up: grammar and schema compilation happen once per process
            fn()
        wall, cpu = [], []
        for _ in range(n):
            s, c = time.perf_counter(), time.thread_time()
            fn()
            cpu.append((time.thread_time() - c) * 1000)
            wall.append((time.perf_counter() - s) * 1000)
        p50, p99 = percentiles(wall)
        c50, c99 = percentiles(cpu)
        print(f"kip_{name}_p50: {p50:.3f} ms")
        print(f"kip_{name}_p99: {p99:.3f} ms")
        print(f"kip_{name}_cpu_p99: {c99:.3f} ms")
    print(f"load average: {open('/proc/loadavg').read().split()[0]} (2 cores)")
    print(f"kip_import_throughput_vs_ingest_goal: {throughput / 2000:.1f} x")
    print(f"kip_import_throughput: {throughput:.0f} events/s")


if __name__ == "__main__":
    main()
