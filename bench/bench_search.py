"""Ranked search: indexing throughput, acceptance-to-searchable lag, lexical latency.

Measures, on an embedded SQLite store in a temporary data directory:

* **indexing throughput**: a fresh Tantivy index follows the whole log
  (``Follower.catch_up``: read records, build trigram documents, commit), in
  capsules per second;
* **lag** under sustained ingest: a producer commits capsules at a fixed rate
  while the elected indexer thread follows; for every record, the time from
  its commit returning to the index position covering it;
* **lexical latency** at each corpus size: ``SearchEngine.run`` end to end
  (Tantivy candidates, store reads, exact verification with the core,
  explanations), without HTTP, for 1–3 term queries drawn with Zipf weights
  from the corpus vocabulary (English-like words and Chinese bigrams), 10 % of
  them with an exact filter.

Capsules are ~0.8 KiB of eligible text. As in ``bench_query.py`` the payload
varies and the event ID is recomputed, but one real signature per actor is
reused: the store and the index trust what the service verified, so signing
cost is not what this measures.

Wall-clock figures depend on how busy the machine is; each line also gives the
CPU time spent (all threads for indexing, the searching thread for queries)
and the load average, so runs on a shared machine can be read fairly.

Usage: python bench/bench_search.py [--sizes 100000,1000000] [--store sqlite,memory]
                                    [--queries 400] [--rate 1000]
Last line: ``search_p99_100k: <ms> ms`` (goals: p50 <= 5 ms, p99 <= 20 ms at 100k;
lag <= 1 s; indexing >= 5,000 capsules/s).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from akrelay.protocol.b64 import b64encode
from akrelay.protocol.envelope import Envelope
from akrelay.protocol.jcs import canonicalize
from akrelay.protocol.reads import parse_search_request
from akrelay.protocol.signer import Signer, publish_event
from akrelay.search import SearchEngine
from akrelay.search.index import SearchIndex, index_dir
from akrelay.search.indexer import Follower
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.store.memory import MemoryStore
from akrelay.store.sqlite import SqliteStore

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
KINDS = ("question", "hypothesis", "procedure", "negative_result", "observation", "definition", "synthesis")
BASE = 1_790_000_000_000
CHINESE = "语言模型知识缓存实验数据方法结果分析系统网络学习训练推理问题研究测试"


class Corpus:
    """Deterministic capsule generator with a Zipf-distributed vocabulary."""

    def __init__(self, seed: int = 7, words: int = 20000) -> None:
        self.rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        vocab: set[str] = set()
        while len(vocab) < words:
            vocab.add("".join(self.rng.choice(letters) for _ in range(self.rng.randint(3, 10))))
        self.words = sorted(vocab)
        self.rng.shuffle(self.words)
        self.chinese = [CHINESE[i:i + 2] for i in range(len(CHINESE) - 1)]
        self.cum = list(itertools.accumulate(1.0 / (rank + 1) ** 1.05 for rank in range(len(self.words))))
        self.signer = Signer.from_seed(b"\x42" * 32)
        template = publish_event(self.signer.agent_id, BASE, 1, {"x": 1})
        self.signature = self.signer.sign(template)["signature"]

    def text(self, n: int) -> str:
        picked = self.rng.choices(self.words, cum_weights=self.cum, k=n)
        if self.rng.random() < 0.2:
            picked.insert(self.rng.randrange(len(picked) + 1), self.rng.choice(self.chinese))
        return " ".join(picked)

    def envelope(self, i: int) -> Envelope:
        rng = self.rng
        payload = {
            "license": LICENSE, "kind": rng.choice(KINDS), "title": self.text(rng.randint(5, 10)).capitalize(),
            "statement": self.text(rng.randint(40, 80)) + ".", "language": rng.choice(("en", "en", "zh")),
            "context": {"scope": self.text(rng.randint(3, 6)), "conditions": [self.text(4)] * rng.randint(0, 1),
                        "limitations": []},
            "basis": self.text(rng.randint(10, 20)),
        }
        event = publish_event(self.signer.agent_id, BASE + i, i + 1, payload)
        jcs = canonicalize(event)
        return Envelope(b64encode(hashlib.sha3_256(jcs).digest()), event, self.signature, jcs)

    def query(self) -> dict:
        rng = self.rng
        terms = rng.choices(self.words, cum_weights=self.cum, k=rng.randint(1, 3))
        if rng.random() < 0.15:
            terms[0] = rng.choice(self.chinese)
        body = {"text": " ".join(terms), "mode": "lexical", "limit": 20}
        if rng.random() < 0.1:
            body["filters"] = {"kind": rng.choice(KINDS)}
        return body


def fill(store: SqliteStore, corpus: Corpus, start: int, count: int, chunk: int = 5000) -> None:
    for base in range(start, start + count, chunk):
        store.commit_many((corpus.envelope(i), BASE) for i in range(base, min(base + chunk, start + count)))


def fill_memory(store: MemoryStore, corpus: Corpus, start: int, count: int) -> None:
    for i in range(start, start + count):
        store.commit(corpus.envelope(i), BASE)


def load() -> str:
    return "%.1f" % os.getloadavg()[0]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def bench_size(size: int, queries: int, rate: float, out: dict, store_kind: str = "sqlite") -> None:
    corpus = Corpus()
    with tempfile.TemporaryDirectory(prefix="akrelay-bench-search-") as tmp:
        data = Path(tmp)
        if store_kind == "sqlite":
            store = SqliteStore(data / "relay.sqlite3", synchronous="OFF")
            fill_store = fill
        else:
            store = MemoryStore()
            fill_store = fill_memory
        t = time.perf_counter()
        fill_store(store, corpus, 0, size)
        print(f"[{size}] built {store_kind} store in {time.perf_counter() - t:.1f} s", file=sys.stderr)

        # Indexing throughput: a fresh index follows the whole log.
        index = SearchIndex.open_writer(index_dir(data), threads=2, heap_bytes=256_000_000)
        follower = Follower(index, store, batch=5000)
        t, c = time.perf_counter(), time.process_time()
        indexed = follower.catch_up()
        elapsed, cpu = time.perf_counter() - t, time.process_time() - c
        index.close()
        del follower, index
        out[f"index_rate_{size}"] = indexed / elapsed
        out[f"index_cpu_us_{size}"] = cpu / indexed * 1e6
        print(f"index_throughput_{size}: {indexed / elapsed:.0f} capsules/s wall ({indexed} in {elapsed:.1f} s), "
              f"{cpu / indexed * 1e6:.0f} us CPU per capsule (all threads) [{store_kind} store, load {load()}]")

        relay = Relay(store, RelayConfig(origin="https://bench.example"), cursor_secret=b"b" * 32)
        service = SearchEngine(relay, data, writer_threads=2)
        assert service.is_indexer and service.wait_indexed(timeout=120)

        # Lexical latency, full service path.
        bodies = [corpus.query() for _ in range(queries)]
        requests = [parse_search_request(b, ("lexical",)) for b in bodies]
        for request in requests[:20]:  # warm caches
            service.run(request)
        latencies, cpus, exhaustive, hits = [], [], 0, 0
        for request in requests:
            t, c = time.perf_counter(), time.thread_time()
            page = service.run(request)
            cpus.append((time.thread_time() - c) * 1000)
            latencies.append((time.perf_counter() - t) * 1000)
            exhaustive += page.exhaustive
            hits += len(page.hits)
        p50, p99 = statistics.median(latencies), pct(latencies, 0.99)
        out[f"p50_{size}"], out[f"p99_{size}"] = p50, p99
        out[f"cpu_p50_{size}"], out[f"cpu_p99_{size}"] = statistics.median(cpus), pct(cpus, 0.99)
        print(f"search_latency_{size}: wall p50 {p50:.2f} ms, p90 {pct(latencies, 0.9):.2f} ms, p99 {p99:.2f} ms, "
              f"max {max(latencies):.2f} ms; CPU (this thread) p50 {statistics.median(cpus):.2f} ms, "
              f"p99 {pct(cpus, 0.99):.2f} ms ({queries} queries, {hits / queries:.1f} hits/query, "
              f"{100 * exhaustive / queries:.0f} % exhaustive) [{store_kind} store, load {load()}]")

        # Lag under sustained ingest: one commit_many of 10 capsules every 10/rate s.
        if rate > 0:
            lags = measure_lag(store, service, corpus, size, rate, seconds=10.0)
            out[f"lag_p50_{size}"], out[f"lag_p99_{size}"] = pct(lags, 0.5), pct(lags, 0.99)
            print(f"search_lag_{size}: p50 {pct(lags, 0.5):.0f} ms, p99 {pct(lags, 0.99):.0f} ms, "
                  f"max {max(lags):.0f} ms at {rate:.0f} capsules/s for 10 s [load {load()}]")
        service.close()
        store.close()


def measure_lag(store: SqliteStore, service: SearchEngine, corpus: Corpus, start: int, rate: float,
                seconds: float) -> list[float]:
    committed: dict[int, float] = {}
    covered: list[tuple[float, int]] = []
    done = threading.Event()

    def watch() -> None:
        last = -1
        while not done.is_set() or last < max(committed, default=0):
            position = service.index_seq()
            if position != last:
                covered.append((time.perf_counter(), position))
                last = position
            time.sleep(0.002)
            if done.is_set() and time.perf_counter() - end > 30:
                return

    end = float("inf")
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    batch = 10
    interval = batch / rate
    t0 = time.perf_counter()
    i = start + 1_000_000
    n = 0
    while time.perf_counter() - t0 < seconds:
        if isinstance(store, SqliteStore):
            results = store.commit_many((corpus.envelope(i + k), BASE) for k in range(batch))
        else:
            results = [store.commit(corpus.envelope(i + k), BASE) for k in range(batch)]
        now = time.perf_counter()
        for record, _ in results:
            committed[record.seq] = now
        i += batch
        n += 1
        sleep = t0 + n * interval - time.perf_counter()
        if sleep > 0:
            time.sleep(sleep)
    end = time.perf_counter()
    done.set()
    watcher.join(40)
    lags = []
    for seq, at in committed.items():
        seen = next((t for t, position in covered if position >= seq), None)
        if seen is not None:
            lags.append(max(0.0, (seen - at) * 1000))
    return lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--rate", type=float, default=1000.0, help="capsules/s during the lag measurement")
    parser.add_argument("--store", default="sqlite", help="sqlite or memory, per size: e.g. sqlite,memory")
    args = parser.parse_args()
    out: dict = {}
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = args.store.split(",")
    for n, size in enumerate(sizes):
        bench_size(size, args.queries, args.rate if size == min(sizes) else 0, out, kinds[min(n, len(kinds) - 1)])
    print(json.dumps({k: round(v, 2) for k, v in out.items()}), file=sys.stderr)
    if "p99_100000" in out:
        print(f"search_p99_100k: {out['p99_100000']:.2f} ms")
    else:  # no 100k run: name the size that was measured
        print(f"search_p99_{sizes[0]}: {out[f'p99_{sizes[0]}']:.2f} ms")


if __name__ == "__main__":
    main()
