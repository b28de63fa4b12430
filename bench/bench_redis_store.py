"""The acceptance log on Redis against SQLite: commit throughput and query latency, side by side.

For each backend it builds N records of the query bench's realistic corpus
(``bench_query.Corpus``, ~1.5 KiB publications, assessments, retractions), then:

* commit throughput: further records committed in groups of ``--group`` (what the
  ingest batcher hands the store) by ``--threads`` threads, and one by one;
* query latency: ``bench_query.run``'s filtered shapes and 2-term ``q`` shapes
  through ``Relay.query`` (p50/p99 wall and CPU).

Redis runs durably (AOF, ``appendfsync always``): a ``redis-server`` of its own in a
temporary directory unless ``--redis URL`` names one (its database is flushed!).
Redis memory per record is read from ``INFO memory``; the Redis store keeps its ``q`` trigram index
in a node-local file (``store.redis.text``), built here before the queries run, as SQLite's is.

Usage: python bench/bench_redis_store.py [--size 100000] [--commits 20000] [--iterations 200]
The last line is ``redis_query_p99_<N/1000>k: <ms> ms`` (worst filtered shape; goal 10 ms).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_query import BASE, Corpus, run  # noqa: E402

from akrelay.store.redis.store import RedisStore  # noqa: E402
from akrelay.store.sqlite import SqliteStore  # noqa: E402


def build(store: Any, corpus: Corpus, n: int) -> float:
    start = time.perf_counter()
    for lo in range(0, n, 2000):
        store.commit_many([(corpus.make(i), BASE + i) for i in range(lo, min(n, lo + 2000))])
    return n / (time.perf_counter() - start)


def settle(store: Any, timeout: float = 600.0) -> None:
    """Wait until Redis is not rewriting its AOF (the bulk build triggers rewrites), so queries meet a quiet server."""
    client = getattr(store, "_client", None)
    if client is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
            return
        time.sleep(0.5)


def commit_rate(store: Any, envelopes: list, group: int, threads: int) -> float:
    """Accepted/s with ``threads`` committers, each committing ``group`` envelopes per call."""
    chunks = [envelopes[i:i + group] for i in range(0, len(envelopes), group)]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not chunks:
                    return
                chunk = chunks.pop()
            store.commit_many([(env, BASE) for env in chunk])

    start = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return len(envelopes) / (time.perf_counter() - start)


def measure(name: str, store: Any, n: int, commits: int, group: int, threads: int, iterations: int) -> dict[str, float]:
    corpus = Corpus()
    print(f"== {name}: {n} records", flush=True)
    bulk = build(store, corpus, n)
    print(f"  bulk build {bulk:8.0f} records/s", flush=True)
    # Both stores find q candidates in a trigram index that follows the log (Redis: the node's own file).
    start, taken = time.perf_counter(), 0
    while added := store.index_text(5000):
        taken += added
    if taken:
        print(f"  text index build {taken / (time.perf_counter() - start):8.0f} records/s", flush=True)
    settle(store)
    out = run(n, store, corpus, iterations)
    fresh = [corpus.make(i) for i in range(n, n + commits)]
    grouped = commit_rate(store, fresh[: commits // 2], group, threads)
    single = commit_rate(store, fresh[commits // 2:], 1, threads)
    print(f"  commits: {grouped:8.0f}/s in groups of {group} ({threads} threads), {single:8.0f}/s one by one",
          flush=True)
    out.update(grouped=grouped, single=single)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=20_000, help="timed commits after the build")
    parser.add_argument("--group", type=int, default=32, help="envelopes per commit call (the ingest batcher's groups)")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--redis", default=None, help="use this Redis (FLUSHED first) instead of starting one")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        url = args.redis
        if url is None:
            from redis_server import RedisServer

            server = RedisServer(Path(tmp) / "redis").start()
            url = server.url
        try:
            import redis

            client = redis.Redis.from_url(url)
            client.flushdb()
            used_before = int(client.info("memory")["used_memory"])
            text_file = Path(tmp) / "redis-text.db"
            rstore = RedisStore(url, text_index=text_file, text_indexer=False)
            redis_figures = measure("redis", rstore, args.size, args.commits, args.group, args.threads, args.iterations)
            used = int(client.info("memory")["used_memory"]) - used_before
            per_record = used / rstore.checkpoint()
            text_per_record = sum(f.stat().st_size for f in Path(tmp).glob("redis-text.db*")) / rstore.checkpoint()
            rstore.close()
            client.close()
            sstore = SqliteStore(Path(tmp) / "relay.sqlite3")
            sqlite_figures = measure("sqlite", sstore, args.size, args.commits, args.group, args.threads,
                                     args.iterations)
            sstore.close()
        finally:
            if server is not None:
                server.stop()
    k = args.size // 1000
    print(f"redis memory: {per_record:.0f} bytes per record (INFO memory used_memory)")
    print(f"node text index: {text_per_record:.0f} bytes per record on disk (redis-text.db and its WAL)")
    for name, f in (("sqlite", sqlite_figures), ("redis", redis_figures)):
        print(f"{name}: commits {f['grouped']:.0f}/s grouped, {f['single']:.0f}/s single; "
              f"filtered p99 {f['filtered_p99']:.2f} ms (cpu {f['filtered_cpu_p99']:.2f}); "
              f"q2 p99 {f['q_p99']:.2f} ms")
    print(f"redis_commit_grouped: {redis_figures['grouped']:.0f} accepted/s")
    print(f"redis_query_p99_{k}k: {redis_figures['filtered_p99']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
