"""Query latency through ``Relay.query`` on an embedded SQLite store.

Builds N records (default 10k and 100k) of realistic ~1.5 KiB publications,
assessments and retractions in a temporary data directory, then measures:

* a filtered page (``limit=100``) for several filter shapes, from broad
  (``type``) to selective (``tag`` + ``kind``), including a time range;
* a 2-term ``q`` page (``limit=100``) over random word pairs of mixed
  frequency, including pairs that rarely co-occur (the full candidate set must
  then be verified: exact and complete, never top-k).

Envelopes are really signed once per actor template; to build 100k records
quickly the payload varies and the event ID is recomputed (SHA3-256 of the
JCS event), but the signature is reused: the store trusts what the service
verified, and signing cost is not what this measures.

With ``--store redis`` (a ``redis-server`` of its own, durable: AOF, ``appendfsync
always``) or ``--store redis://HOST:PORT/DB`` (that database is FLUSHED), the same
records are also built in a Redis log and every shape runs on it too, beside
SQLite in the same run (``q`` candidates from the node-local trigram file
``redis-text.db``, built before the queries as a relay node keeps it); Redis memory (``INFO memory`` ``used_memory`` delta) and
AOF bytes per record are printed at each size.

With ``--text-lag 20000,5000,1000,0`` the ``q`` shapes also run on Redis through a
second node's text index held that many records behind the log (what a node sees
while its indexer trails ingest): the unindexed tail is scanned in Redis.

Usage: python bench/bench_query.py [--sizes 10000,100000] [--iterations 300] [--store redis] [--text-lag L,...]
Every shape reports wall-clock p50/p99 and the p99 of the querying thread's CPU
time, which other processes on a shared machine cannot inflate. The last two
lines are ``q2_p99_100k: <ms> ms`` (worst 2-term ``q`` shape, goal 100 ms) and
``query_p99_100k: <ms> ms`` (worst filtered-page shape, goal 10 ms); with
``--store`` the last line is ``redis_query_p99_100k: <ms> ms`` (the same on Redis).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from akrelay.protocol.b64 import b64encode
from akrelay.protocol.envelope import Envelope
from akrelay.protocol.jcs import canonicalize
from akrelay.protocol.signer import Signer, assess_event, publish_event, retract_event
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.store.sqlite import SqliteStore

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
KINDS = ("question", "hypothesis", "procedure", "negative_result", "observation", "definition", "synthesis", "inference")
BASE = 1_790_000_000_000


def vocabulary(rng: random.Random, n: int = 5000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(4, 10))))
    return sorted(words)


class Corpus:
    """Cheap, deterministic, realistic envelopes."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.words = vocabulary(self.rng)
        # Zipf-like weights: a few very common words, a long tail
        weights = [1.0 / (i + 1) ** 0.9 for i in range(len(self.words))]
        self.cum_weights = list(__import__("itertools").accumulate(weights))
        self.signers = [Signer.from_seed(bytes([i + 1]) * 32) for i in range(20)]
        self.tags = [f"tag{i}" for i in range(60)]
        self.published: list[str] = []
        self.nonce = 0

    def text(self, n: int) -> str:
        words = self.rng.choices(self.words, cum_weights=self.cum_weights, k=n)
        if self.rng.random() < 0.2:
            words[0] = words[0].capitalize()
        return " ".join(words)

    def _envelope(self, event: dict, signature: str) -> Envelope:
        jcs = canonicalize(event)
        event_id = b64encode(hashlib.sha3_256(jcs).digest())
        return Envelope(id=event_id, event=event, signature=signature, event_jcs=jcs)

    def make(self, i: int) -> Envelope:
        rng = self.rng
        signer = self.signers[i % len(self.signers)]
        self.nonce += 1
        created = BASE + i * 1000 + rng.randrange(1000)
        roll = rng.random()
        if roll < 0.85 or len(self.published) < 10:
            payload = {
                "license": LICENSE,
                "kind": rng.choice(KINDS),
                "title": self.text(8),
                "statement": self.text(70),
                "language": rng.choice(("en", "en", "en", "de", "zh", "fr")),
                "context": {"scope": self.text(6), "conditions": [self.text(6), self.text(5)], "limitations": [self.text(7)]},
                "basis": self.text(35),
                "tags": rng.sample(self.tags, rng.randint(0, 3)),
                "evidence": [{"url": f"https://example.com/data/{i}.csv", "description": self.text(5)}],
            }
            if not payload["tags"]:
                del payload["tags"]
            if self.published and rng.random() < 0.5:
                payload["relations"] = [{"relation": rng.choice(("extends", "derived_from", "supports")), "target": rng.choice(self.published[-500:])}]
            event = publish_event(signer.agent_id, created, self.nonce, payload)
        elif roll < 0.97:
            payload = {
                "license": LICENSE,
                "target": rng.choice(self.published),
                "verdict": rng.choice(("supports", "challenges", "inconclusive")),
                "summary": self.text(12),
                "context": {"scope": self.text(5), "conditions": [], "limitations": []},
                "basis": self.text(40),
            }
            event = assess_event(signer.agent_id, created, self.nonce, payload)
        else:
            event = retract_event(signer.agent_id, created, self.nonce, {"license": LICENSE, "target": rng.choice(self.published), "reason": self.text(10)})
        signature = self.signature(signer)
        env = self._envelope(event, signature)
        if event["type"] == "knowledge.publish":
            self.published.append(env.id)
        return env

    _sig_cache: dict[str, str] = {}

    def signature(self, signer: Signer) -> str:
        # one real signature per actor, reused (see the module docstring)
        sig = self._sig_cache.get(signer.agent_id)
        if sig is None:
            sig = signer.sign(publish_event(signer.agent_id, BASE, 1, {}))["signature"]
            self._sig_cache[signer.agent_id] = sig
        return sig


def build(path: Path, n: int, corpus: Corpus, existing: int = 0) -> SqliteStore:
    store = SqliteStore(path)
    chunk = 2000
    start = time.perf_counter()
    for lo in range(existing, n, chunk):
        batch = [(corpus.make(i), BASE + i) for i in range(lo, min(n, lo + chunk))]
        store.commit_many(batch)
    elapsed = time.perf_counter() - start
    added = n - existing
    if added:
        print(f"  built {added} records in {elapsed:.1f} s ({added / elapsed:.0f}/s bulk import)", flush=True)
    start = time.perf_counter()
    while store.index_text(5000):
        pass
    elapsed = time.perf_counter() - start
    if added:
        print(f"  trigram text index caught up in {elapsed:.1f} s ({added / elapsed:.0f} records/s)", flush=True)
    return store


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(p / 100 * (len(values) - 1)))))
    return values[k]


def measure(relay: Relay, make_params, iterations: int) -> tuple[float, float, float, float]:
    """Wall-clock p50/p99 and the p99 of this thread's CPU time (insensitive to other load)."""
    times = []
    cpu = []
    rows = []
    for _ in range(iterations):
        params = make_params()
        c0 = time.thread_time()
        t0 = time.perf_counter()
        page = relay.query(params)
        body = page.to_json()
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
        rows.append(len(page.records))
        assert body
    return statistics.median(times), percentile(times, 99), percentile(cpu, 99), statistics.mean(rows)


def run_shapes(relay: Relay, named: dict, iterations: int) -> tuple[float, float]:
    """Measure and print each shape; return the worst wall and CPU p99."""
    worst = worst_cpu = 0.0
    for name, fn in named.items():
        p50, p99, cpu99, rows = measure(relay, fn, iterations)
        worst, worst_cpu = max(worst, p99), max(worst_cpu, cpu99)
        print(f"  {name:<32} p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  cpu p99 {cpu99:7.2f} ms  rows/page {rows:6.1f}", flush=True)
    return worst, worst_cpu


def q_shapes(rng: random.Random, corpus: Corpus) -> dict:
    """2-term ``q`` pages over word pairs of mixed frequency (rare pairs must verify their whole candidate set)."""
    common = corpus.words[:50]
    mid = corpus.words[50:1000]
    return {
        "q 2 common terms": lambda: [("q", f"{rng.choice(common)} {rng.choice(common)}"), ("limit", "100")],
        "q common + mid terms": lambda: [("q", f"{rng.choice(common)} {rng.choice(mid)}"), ("limit", "100")],
        "q 2 mid terms (rare pairs)": lambda: [("q", f"{rng.choice(mid)} {rng.choice(mid)}"), ("limit", "100")],
        "q 2 terms + type filter": lambda: [("q", f"{rng.choice(mid)} {rng.choice(common)}"), ("type", "knowledge.publish"), ("limit", "100")],
    }


def run(n: int, store: SqliteStore, corpus: Corpus, iterations: int) -> dict[str, float]:
    relay = Relay(store, RelayConfig(origin="https://localhost:8443"), cursor_secret=b"bench-cursor-secret-0123456789ab")
    rng = random.Random(99)
    actors = [s.agent_id for s in corpus.signers]
    checkpoint = store.checkpoint()
    shapes = {
        "filter type=publish": lambda: [("type", "knowledge.publish"), ("limit", "100")],
        "filter actor+type": lambda: [("actor", rng.choice(actors)), ("type", "knowledge.publish"), ("limit", "100")],
        "filter tag+kind": lambda: [("tag", rng.choice(corpus.tags)), ("kind", rng.choice(KINDS)), ("limit", "100")],
        "filter verdict": lambda: [("verdict", rng.choice(("supports", "challenges"))), ("limit", "100")],
        "filter language+time": lambda: [("language", "de"), ("created_from", str(BASE + rng.randrange(n) * 1000)), ("limit", "100")],
        "filter after_seq poll": lambda: [("after_seq", str(max(0, checkpoint - rng.randrange(1, 300)))), ("limit", "100")],
    }
    results = {}

    filtered_p99, filtered_cpu = run_shapes(relay, shapes, iterations)
    q_p99, q_cpu = run_shapes(relay, q_shapes(rng, corpus), iterations)
    results["filtered_p99"] = filtered_p99
    results["q_p99"] = q_p99
    results["filtered_cpu_p99"] = filtered_cpu
    results["q_cpu_p99"] = q_cpu
    print(f"  => {n} records: filtered page p99 {filtered_p99:.2f} ms (cpu {filtered_cpu:.2f}; goal 10), "
          f"2-term q p99 {q_p99:.2f} ms (cpu {q_cpu:.2f}; goal 100)", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--keep", default=None, help="build into (and reuse) this database file instead of a temporary one")
    parser.add_argument("--store", default="", metavar="redis|URL",
                        help="also run every shape on a Redis log of the same records (redis: start a server)")
    parser.add_argument("--text-lag", default="", metavar="L1,L2,...",
                        help="with --store, at the largest size: q shapes on Redis while a node's text index trails "
                             "the log by each of these many records")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    with tempfile.TemporaryDirectory() as tmp, RedisBeside(args.store, Path(tmp)) as beside:
        path = Path(args.keep) if args.keep else Path(tmp) / "relay.sqlite3"
        corpus = Corpus()
        built = 0
        if path.exists():
            probe = SqliteStore(path)
            built = probe.checkpoint()
            probe.close()
            if built > sizes[0]:
                raise SystemExit(f"{path} already holds {built} records, more than {sizes[0]}")
            for i in range(built):  # replay the generator so later records continue the same corpus
                corpus.make(i)
        summary = {}
        for n in sizes:
            print(f"== {n} records", flush=True)
            store = build(path, n, corpus, existing=built)
            built = n
            summary[n] = run(n, store, corpus, args.iterations)
            store.close()
            if beside.url:
                print(f"== {n} records on Redis", flush=True)
                beside.grow(n)
                beside.summary[n] = run(n, beside.store, beside.corpus, args.iterations)
        if beside.url and args.text_lag:
            beside.lagging(sorted((int(x) for x in args.text_lag.split(",")), reverse=True), args.iterations)
        size_mb = path.stat().st_size / 1e6
        print(f"database size at {built} records: {size_mb:.0f} MB")
    load = __import__("os").getloadavg()[0]
    print(f"load average during the run: {load:.1f} on {__import__('os').cpu_count()} cores")
    for n, r in summary.items():
        print(f"query_filtered_p99_{n}: {r['filtered_p99']:.2f} ms (cpu {r['filtered_cpu_p99']:.2f}); "
              f"query_q2_p99_{n}: {r['q_p99']:.2f} ms (cpu {r['q_cpu_p99']:.2f})")
    for n, r in beside.summary.items():
        print(f"redis_query_filtered_p99_{n}: {r['filtered_p99']:.2f} ms (cpu {r['filtered_cpu_p99']:.2f}); "
              f"redis_query_q2_p99_{n}: {r['q_p99']:.2f} ms (cpu {r['q_cpu_p99']:.2f}); "
              f"Redis memory {beside.memory[n]:.0f} B/record, AOF {beside.aof[n]:.0f} B/record")
    for lag, q99 in beside.lag_p99.items():
        print(f"redis_q2_p99_text_lag_{lag}: {q99:.2f} ms")
    key = 100_000 if 100_000 in summary else max(summary)
    print(f"q2_p99_{key // 1000}k: {summary[key]['q_p99']:.2f} ms")
    print(f"query_p99_{key // 1000}k: {summary[key]['filtered_p99']:.2f} ms")
    if beside.summary:
        print(f"redis_q2_p99_{key // 1000}k: {beside.summary[key]['q_p99']:.2f} ms")
        print(f"redis_query_p99_{key // 1000}k: {beside.summary[key]['filtered_p99']:.2f} ms")
    return 0


class RedisBeside:
    """``--store``: the same records in a Redis log, grown with the SQLite one (nothing when not asked)."""

    def __init__(self, store: str, tmp: Path) -> None:
        self.url = "" if store in ("", "sqlite") else store
        self.tmp = tmp
        self.server = None
        self.corpus = Corpus()  # the same seed: the same records as the SQLite build
        self.built = 0
        self.summary: dict[int, dict[str, float]] = {}
        self.memory: dict[int, float] = {}
        self.aof: dict[int, float] = {}
        self.lag_p99: dict[int, float] = {}

    def __enter__(self) -> "RedisBeside":
        if not self.url:
            return self
        import redis

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        if self.url == "redis":
            from redis_server import RedisServer

            self.server = RedisServer(self.tmp / "redis").start()
            self.url = self.server.url
        from akrelay.store.redis.store import RedisStore

        self.client = redis.Redis.from_url(self.url)
        self.client.flushdb()
        self.used0 = int(self.client.info("memory")["used_memory"])
        self.aof0 = self.aof_bytes()
        # q candidates come from a node-local trigram file, as on a relay node (``store.redis.text``)
        self.store = RedisStore(self.url, text_index=self.tmp / "redis-text.db", text_indexer=False)
        return self

    def aof_bytes(self) -> int:
        from bench_cluster import aof_bytes

        return aof_bytes(self.client)

    def grow(self, n: int) -> None:
        """Commit records ``built..n`` (groups of 2000, as the SQLite build), then read memory and AOF size."""
        from bench_redis_store import settle

        started = time.perf_counter()
        for lo in range(self.built, n, 2000):
            self.store.commit_many([(self.corpus.make(i), BASE + i) for i in range(lo, min(n, lo + 2000))])
        print(f"  built {n - self.built} records in Redis in {time.perf_counter() - started:.1f} s", flush=True)
        started = time.perf_counter()
        while self.store.index_text(5000):
            pass
        print(f"  node text index (redis-text.db) caught up in {time.perf_counter() - started:.1f} s", flush=True)
        self.built = n
        self.memory[n] = (int(self.client.info("memory")["used_memory"]) - self.used0) / n
        settle(self.store)  # on disk once any automatic rewrite (it compacts the AOF) has finished
        self.aof[n] = (self.aof_bytes() - self.aof0) / n
        rewrites = self.client.info("persistence").get("aof_rewrites", 0)
        print(f"  Redis memory {self.memory[n]:.0f} B/record (INFO memory), AOF on disk {self.aof[n]:.0f} B/record "
              f"({rewrites} automatic rewrites so far)", flush=True)
        print("  by key (MEMORY USAGE): " + ", ".join(f"{kind} {size / n:.0f} B/record"
                                                   for kind, size in self.breakdown().items()), flush=True)

    def lagging(self, lags: list[int], iterations: int) -> None:
        """``q`` shapes through a second node's text index held ``lag`` records behind the log, for each lag.

        Records past the index's position are scanned in Redis (exact, never skipped), so
        a page that must see the whole tail (rare pairs) costs in proportion to the lag.
        """
        from akrelay.store.redis.store import RedisStore

        store = RedisStore(self.url, text_index=self.tmp / "lagging-text.db", text_indexer=False)
        relay = Relay(store, RelayConfig(origin="https://localhost:8443"), cursor_secret=b"bench-cursor-secret-0123456789ab")
        for lag in lags:
            while (behind := store.text_index_lag()) > lag:
                store.index_text(min(5000, behind - lag))
            print(f"== {self.built} records on Redis, the node's text index {store.text_index_lag()} records behind",
                  flush=True)
            q99, _ = run_shapes(relay, q_shapes(random.Random(99), self.corpus), iterations)
            self.lag_p99[store.text_index_lag()] = q99
        store.close()

    def breakdown(self) -> dict[str, int]:
        """Bytes per kind of key (``rec``, ``flt``, the term sets ``t:*``, ...), largest first."""
        sizes: dict[str, int] = {}
        for key in self.client.scan_iter(match=self.store.prefix + "*", count=1000):
            name = key.decode()[len(self.store.prefix):]
            kind = "t:*" if name.startswith("t:") else name
            sizes[kind] = sizes.get(kind, 0) + int(self.client.memory_usage(key, samples=0) or 0)
        return dict(sorted(sizes.items(), key=lambda item: -item[1]))

    def __exit__(self, *exc: object) -> None:
        if not self.url:
            return
        self.store.close()
        self.client.close()
        if self.server is not None:
            self.server.stop()


if __name__ == "__main__":
    sys.exit(main())
