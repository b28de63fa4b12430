"""KnowQL: turn latency on a served relay with 2 workers, concurrent throughput, retrieval quality.

Builds a deterministic corpus in a temporary data directory (SQLite store
written directly, as ``bench_search.py`` does: one real signature per actor,
reused, because the store trusts what the service verified): ``--capsules``
publications, about a quarter of them assessed by other actors with mixed
verdicts, so that projections give every BELIEF status. Then it starts
``akrelay serve --workers 2`` on that directory (rate limits off), waits until
both the search index and the KIP nexus cover the whole log, and measures over
HTTPS:

* **latency**: p50 and p99 of synchronous ``POST /query`` turns, retrieval-only
  (``retrieval_only: true``) and extractive (the default composer), one at a
  time (goals: p99 <= 50 ms and <= 100 ms);
* **throughput**: extractive turns per second with ``--clients`` concurrent
  clients;
* **retrieval quality** on a labelled set: ``--topics`` topics, each with a few
  key words planted in ``--relevant`` capsules; a question per topic phrased
  in natural language (stop words, question words, key words in another
  order): a relevant capsule mentions each of the three key words once; twice as many hard negatives
  mention two of them, one twice.
  recall@10 and nDCG@10 of KnowQL's retrieval (the artifacts of a
  retrieval-only turn) against plain BM25 on the same Tantivy index (every
  trigram of the raw question OR-ed, top 10 records, no stop words, no
  verification), computed in process on the same index.

Usage: python bench/bench_knowql.py [--capsules 100000] [--turns 300] [--clients 8]
Last line: ``knowql_extractive_p99_<N>: <ms> ms``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import itertools
import math
import os
import random
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from akrelay.protocol.b64 import b64encode
from akrelay.protocol.envelope import Envelope
from akrelay.protocol.jcs import canonicalize
from akrelay.protocol.signer import Signer, assess_event, publish_event
from akrelay.store.sqlite import SqliteStore

LICENSE = "https://creativecommons.org/licenses/by/4.0/"
BASE = 1_790_000_000_000
VERDICTS = ("supports", "supports", "challenges", "inconclusive")
QUESTION_FORMS = ("What is known about {a} and {b} when {c} happens?", "How does {c} affect the {a} {b}?",
                  "Why would {b} interact with {c} in {a}?", "Tell me about {a}, {b} and {c}.")


def load() -> str:
    return "%.1f" % os.getloadavg()[0]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Corpus:
    """Zipf-distributed filler words plus planted topics with known relevant capsules."""

    def __init__(self, capsules: int, topics: int, relevant: int, seed: int = 11) -> None:
        rng = self.rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        vocab: set[str] = set()
        while len(vocab) < 30000:
            vocab.add("".join(rng.choice(letters) for _ in range(rng.randint(4, 10))))
        words = sorted(vocab)
        rng.shuffle(words)
        self.topic_words = [words[3 * t: 3 * t + 3] for t in range(topics)]
        self.words = words[3 * topics:]
        self.cum = list(itertools.accumulate(1.0 / (r + 1) ** 1.05 for r in range(len(self.words))))
        self.capsules = capsules
        #: topic -> the capsule indexes it is planted in (relevance labels)
        slots = rng.sample(range(capsules), topics * relevant * 3)
        self.relevant = {t: slots[t * relevant:(t + 1) * relevant] for t in range(topics)}
        self.planted = {i: t for t, idx in self.relevant.items() for i in idx}
        #: hard negatives: capsules that mention two of a topic's three words, one of them twice
        rest = slots[topics * relevant:]
        self.partial = {}
        for k, i in enumerate(rest):
            words = self.topic_words[k % topics]
            first, second = words[k % 3], words[(k + 1) % 3]
            self.partial[i] = f"{first} {second} {first}"
        self.authors = [Signer.from_seed(bytes([i + 1]) * 32) for i in range(8)]
        self.assessors = [Signer.from_seed(bytes([i + 101]) * 32) for i in range(8)]
        self.signatures = {}
        for signer in self.authors + self.assessors:
            self.signatures[signer.agent_id] = signer.sign(publish_event(signer.agent_id, BASE, 1, {"x": 1}))["signature"]

    def text(self, n: int) -> str:
        return " ".join(self.rng.choices(self.words, cum_weights=self.cum, k=n))

    def _envelope(self, event: dict) -> Envelope:
        jcs = canonicalize(event)
        return Envelope(b64encode(hashlib.sha3_256(jcs).digest()), event, self.signatures[event["actor"]], jcs)

    def publication(self, i: int) -> Envelope:
        rng = self.rng
        title, statement = self.text(rng.randint(5, 9)), self.text(rng.randint(30, 60))
        topic = self.planted.get(i)
        if i in self.partial:
            statement = f"{statement} {self.partial[i]}."
        if topic is not None:
            a, b, c = self.topic_words[topic]
            title = f"{a} {title}"
            statement = f"{statement} {b} {c}."
        payload = {"license": LICENSE, "kind": rng.choice(("observation", "result", "procedure", "synthesis")),
                   "title": title.capitalize(), "statement": statement, "language": "en",
                   "context": {"scope": self.text(4), "conditions": [], "limitations": []},
                   "basis": self.text(rng.randint(8, 15))}
        author = self.authors[i % len(self.authors)]
        return self._envelope(publish_event(author.agent_id, BASE + i, i + 1, payload))

    def assessment(self, j: int, target: str) -> Envelope:
        assessor = self.assessors[j % len(self.assessors)]
        payload = {"license": LICENSE, "target": target, "verdict": self.rng.choice(VERDICTS),
                   "summary": self.text(12), "context": {"scope": self.text(3), "conditions": [], "limitations": []},
                   "basis": self.text(6)}
        if payload["verdict"] in ("reproduced", "not_reproduced", "applied"):
            payload["reproduction"] = {"environment": "e", "steps": ["s"], "expected": "x", "observed": "y"}
        return self._envelope(assess_event(assessor.agent_id, BASE + self.capsules + j, 10_000_000 + j, payload))

    def question(self, topic: int) -> str:
        a, b, c = self.topic_words[topic]
        return self.rng.choice(QUESTION_FORMS).format(a=a, b=b, c=c)


def build(data: Path, corpus: Corpus, chunk: int = 5000) -> tuple[int, dict[int, str]]:
    """Write the log; returns (records, capsule index -> event id)."""
    store = SqliteStore(data / "relay.sqlite3", synchronous="OFF")
    ids: dict[int, str] = {}
    assessments = 0
    for start in range(0, corpus.capsules, chunk):
        batch = []
        for i in range(start, min(start + chunk, corpus.capsules)):
            env = corpus.publication(i)
            ids[i] = env.id
            batch.append((env, BASE))
            if corpus.rng.random() < 0.25:
                batch.append((corpus.assessment(assessments, env.id), BASE))
                assessments += 1
        store.commit_many(batch)
    total = store.checkpoint()
    store.close()
    return total, ids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(data: Path, workers: int) -> tuple[subprocess.Popen, str, ssl.SSLContext]:
    port = free_port()
    origin = f"https://localhost:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKRELAY_")}
    log = open(data.parent / "serve.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "akrelay", "serve", "--data", str(data), "--host", "127.0.0.1",
                             "--port", str(port), "--origin", origin, "--workers", str(workers),
                             "--read-rate", "0", "--write-rate", "0"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}; see {data.parent / 'serve.log'}")
        cert = data / "tls-cert.pem"
        if cert.exists():
            context = ssl.create_default_context(cafile=str(cert))
            try:
                if httpx.get(origin + "/.well-known/agent-knowledge", verify=context, timeout=2).status_code == 200:
                    return proc, origin, context
            except (httpx.HTTPError, ssl.SSLError, OSError):
                pass
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("serve did not start")


def ask(http: httpx.Client, origin: str, body: dict) -> tuple[float, dict]:
    t = time.perf_counter()
    r = http.post(origin + "/query", json=body)
    elapsed = (time.perf_counter() - t) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
    return elapsed, r.json()


def wait_ready(origin: str, context: ssl.SSLContext, records: int, corpus: Corpus) -> None:
    """Until every worker's turns read a snapshot covering the whole log (index and nexus)."""
    body = {"ask": corpus.question(0), "scope": ["knowledge"], "retrieval_only": True}
    deadline = time.monotonic() + 900
    ready = 0
    while time.monotonic() < deadline and ready < 6:
        # Fresh connections reach both workers; the first turn of each waits for its nexus to load.
        with httpx.Client(verify=context, timeout=900) as http:
            try:
                _, doc = ask(http, origin, body)
            except RuntimeError:  # a 504 while a worker is still loading
                doc = {"akrelay": {"snapshot_seq": 0}}
        ready = ready + 1 if doc["akrelay"].get("snapshot_seq", 0) >= records else 0
        if not ready:
            time.sleep(1.0)
    if ready < 6:
        raise RuntimeError("the relay did not catch up with the log")


def dcg(gains: list[int]) -> float:
    return sum(g / math.log2(rank + 2) for rank, g in enumerate(gains))


def quality(ranked: list[str], relevant: set[str]) -> tuple[float, float]:
    top = ranked[:10]
    gains = [1 if r in relevant else 0 for r in top]
    ideal = dcg([1] * min(10, len(relevant)))
    return sum(gains) / min(10, len(relevant)), (dcg(gains) / ideal if ideal else 0.0)


def baseline_bm25(data: Path, questions: list[str]) -> list[list[str]]:
    """Plain BM25 on the relay's own index: every trigram of the folded question, OR-ed; top 10 records."""
    from tantivy import Occur, Query

    from akrelay.search.analysis import GRAM, fold
    from akrelay.search.index import SCHEMA, SearchIndex, index_dir

    index = SearchIndex.open_reader(index_dir(data))
    searcher = index.searcher()
    out = []
    for question in questions:
        text = fold(question)
        grams = dict.fromkeys(text[i:i + GRAM] for i in range(len(text) - GRAM + 1))
        query = Query.boolean_query([(Occur.Should, Query.term_query(SCHEMA, "grams", g)) for g in grams])
        hits = searcher.search(query, 10).hits
        out.append([searcher.doc(address).get_first("id") for _, address in hits])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--capsules", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--relevant", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    size = args.capsules
    corpus = Corpus(size, args.topics, args.relevant)
    with tempfile.TemporaryDirectory(prefix="akrelay-bench-knowql-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        t = time.perf_counter()
        records, ids = build(data, corpus)
        print(f"[{size}] wrote {records} records ({size} capsules) in {time.perf_counter() - t:.1f} s",
              file=sys.stderr)
        t = time.perf_counter()
        proc, origin, context = serve(data, args.workers)
        try:
            wait_ready(origin, context, records, corpus)
            print(f"[{size}] relay caught up (index and nexus) in {time.perf_counter() - t:.1f} s [load {load()}]",
                  file=sys.stderr)
            questions = [corpus.question(t) for t in range(args.topics)]
            relevant = [{ids[i] for i in corpus.relevant[t]} for t in range(args.topics)]
            with httpx.Client(verify=context, timeout=120) as http:
                # Retrieval quality (labelled set).
                knowql_ranked = []
                for question in questions:
                    _, doc = ask(http, origin, {"ask": question, "scope": ["knowledge"], "artifacts_only": True,
                                                "max_retrieved": 10, "pointers_only": True})
                    knowql_ranked.append([a["source"] for a in doc["output_json"]["artifacts"]])
                # Latency, one turn at a time; the two kinds alternate so that both meet the same
                # background work (the KIP follower's snapshot writes, the other helpers' load).
                results: dict[str, list[float]] = {"retrieval_only": [], "extractive": []}
                modes = (("retrieval_only", {"retrieval_only": True}), ("extractive", {}))
                for n in range(2 * (args.turns + 20)):
                    label, extra = modes[n % 2]
                    q = questions[(n // 2) % len(questions)] if (n // 2) % 2 else corpus.text(4)
                    elapsed, doc = ask(http, origin, {"ask": q, "scope": ["knowledge"], **extra})
                    assert doc["status"] == "completed", doc
                    if n >= 40:  # warm-up
                        results[label].append(elapsed)
                for label, samples in results.items():
                    print(f"knowql_{label}_latency_{size}: p50 {statistics.median(samples):.1f} ms, "
                          f"p90 {pct(samples, 0.9):.1f} ms, p99 {pct(samples, 0.99):.1f} ms, max {max(samples):.1f} ms "
                          f"({len(samples)} sequential turns over HTTPS, {args.workers} workers) [load {load()}]")

            # Concurrent throughput (extractive turns).
            def client(k: int) -> int:
                done = 0
                with httpx.Client(verify=context, timeout=120) as http:
                    end = time.monotonic() + 10.0
                    n = k
                    while time.monotonic() < end:
                        ask(http, origin, {"ask": questions[n % len(questions)], "scope": ["knowledge"]})
                        done += 1
                        n += args.clients
                return done

            t = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                total = sum(pool.map(client, range(args.clients)))
            rate = total / (time.perf_counter() - t)
            print(f"knowql_throughput_{size}: {rate:.0f} extractive turns/s with {args.clients} concurrent clients, "
                  f"{args.workers} workers [load {load()}]")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        baseline_ranked = baseline_bm25(data, questions)

    def summary(ranked: list[list[str]]) -> tuple[float, float]:
        pairs = [quality(r, rel) for r, rel in zip(ranked, relevant)]
        return statistics.mean(p[0] for p in pairs), statistics.mean(p[1] for p in pairs)

    k_recall, k_ndcg = summary(knowql_ranked)
    b_recall, b_ndcg = summary(baseline_ranked)
    print(f"knowql_quality_{size}: recall@10 {k_recall:.3f}, nDCG@10 {k_ndcg:.3f} vs plain BM25 baseline "
          f"recall@10 {b_recall:.3f}, nDCG@10 {b_ndcg:.3f} ({args.topics} labelled questions, "
          f"{args.relevant} relevant capsules each)")
    print(f"knowql_retrieval_only_p99_{size}: {pct(results['retrieval_only'], 0.99):.1f} ms")
    print(f"knowql_extractive_p99_{size}: {pct(results['extractive'], 0.99):.1f} ms")


if __name__ == "__main__":
    main()
