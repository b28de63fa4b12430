"""Explorer: capsule page latency on a served relay (goal: p99 <= 50 ms at 100k capsules).

Builds the same deterministic corpus as ``bench_knowql.py`` (publications, a
quarter of them assessed, SQLite written directly), starts ``akrelay serve
--workers 2`` (rate limits off), waits until the search index and the KIP
nexus cover the log in both workers, then fetches ``--requests`` random
capsule pages ``/explorer/capsules/<id>`` one at a time over HTTPS (each page
renders the capsule, its inbound relations and assessments, and a BELIEF
projection under each of the three policies) and reports p50 / p99. It also
times ``/explorer/`` (Recent) and ``/explorer/status``.

Usage: python bench/bench_explorer.py [--capsules 100000] [--requests 500]
Last line: ``explorer_capsule_p99_<N>: <ms> ms``.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_knowql import Corpus, build, load, pct, serve, stop, wait_ready  # noqa: E402


def timed(http: httpx.Client, url: str) -> float:
    t = time.perf_counter()
    r = http.get(url)
    elapsed = (time.perf_counter() - t) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"{url}: {r.status_code} {r.text[:200]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capsules", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="akrelay-bench-explorer-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        corpus = Corpus(args.capsules, topics=10, relevant=5)
        t = time.monotonic()
        records, ids = build(data, corpus)
        print(f"built {records} records ({args.capsules} capsules) in {time.monotonic() - t:.0f} s", flush=True)
        proc, origin, context = serve(data, args.workers)
        try:
            t = time.monotonic()
            wait_ready(origin, context, records, corpus)
            print(f"index and nexus caught up in {time.monotonic() - t:.0f} s; load {load()}", flush=True)
            rng = random.Random(5)
            sample = [ids[rng.randrange(args.capsules)] for _ in range(args.requests)]
            with httpx.Client(verify=context, timeout=60) as http:
                page = http.get(f"{origin}/explorer/capsules/{sample[0]}").text
                if page.count('class="belief"') != 3 or "unavailable" in page:
                    raise RuntimeError("the capsule page does not show three belief projections")
                for event_id in sample[:20]:  # warm both workers' caches and connections
                    timed(http, f"{origin}/explorer/capsules/{event_id}")
                capsule = [timed(http, f"{origin}/explorer/capsules/{event_id}") for event_id in sample]
                recent = [timed(http, f"{origin}/explorer/") for _ in range(50)]
                status = [timed(http, f"{origin}/explorer/status") for _ in range(50)]
        finally:
            stop(proc)
    print(f"recent page: p50 {pct(recent, 0.5):.1f} ms, p99 {pct(recent, 0.99):.1f} ms")
    print(f"status page: p50 {pct(status, 0.5):.1f} ms, p99 {pct(status, 0.99):.1f} ms")
    print(f"capsule page ({len(capsule)} requests, load {load()}): p50 {pct(capsule, 0.5):.1f} ms")
    print(f"explorer_capsule_p99_{args.capsules}: {pct(capsule, 0.99):.1f} ms")


if __name__ == "__main__":
    main()
