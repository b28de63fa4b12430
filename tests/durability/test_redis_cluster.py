"""A deployment of two relay nodes on one Redis log, end to end and under faults (issue 15's Tests).

Real processes only: a ``redis-server`` of each test's own (AOF, ``appendfsync always``), and two
``akrelay serve --workers 2 --store redis://...`` nodes over TLS on loopback, each with its own
``--data``. Writers submit to both nodes at once from threads; every acknowledged record is kept as
the client saw it and compared afterwards with what *both* nodes serve.

* end to end: one ``seq`` space, byte-identical records on both nodes, idempotent resubmission
  across nodes, read-your-writes across nodes, cursors of one node paged on the other, and each
  node's followers (search index, KIP nexus) waking up for the other node's commits;
* ``kill -9`` of a node (its whole process group) mid-ingest, then a restart that catches up;
* ``kill -9`` of ``redis-server`` mid-ingest, then a restart from its AOF: 503 with Retry-After
  meanwhile (never a 500, never a hang), ``/healthz`` 200, ``/readyz`` 503 and back.

Each test runs its own cluster so that ``pytest -n 2`` runs them side by side.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from relay_harness import Served, start_relay
from test_durability import envelopes
from test_redis_node import assessment, publication

from redis_server import RedisServer

pytestmark = pytest.mark.slow

HEADERS = {"content-type": "application/json"}
#: the deployment-wide rate limits on (their buckets live in Redis too), high enough that the writers, all on
#: one address, are never refused; one JSON access-log line per request
NODE_FLAGS = ["--write-rate", "100000", "--write-burst", "100000", "--read-rate", "100000", "--read-burst", "100000",
              "--log-json"]
#: the issue's bound for any answer while Redis is down
ANSWER_WITHIN = 10.0
#: how long the Redis fault test keeps redis-server down (seconds)
OUTAGE = 7.0


# -- the cluster ----------------------------------------------------------------------------------


@dataclass
class Cluster:
    tmp: Path
    redis: RedisServer
    nodes: list[Served] = field(default_factory=list)
    #: set at teardown: the writers of a test that failed stop too
    halt: threading.Event = field(default_factory=threading.Event)

    def start_node(self, index: int, port: int | None = None) -> Served:
        served = start_relay(self.tmp / f"node{index}", workers=2, port=port,
                             extra=["--store", self.redis.url, *NODE_FLAGS])
        if index < len(self.nodes):
            self.nodes[index] = served
        else:
            self.nodes.append(served)
        return served

    def kill_node(self, index: int) -> None:
        """``kill -9`` of the node's process group: the Granian main process and its workers."""
        self.nodes[index].stop(signal.SIGKILL)

    def restart_node(self, index: int) -> Served:
        return self.start_node(index, port=self.nodes[index].port)

    def http(self, index: int, timeout: float = 30.0) -> httpx.Client:
        node = self.nodes[index]
        return httpx.Client(base_url=node.origin, verify=node.ssl_context(), timeout=timeout)

    def logs(self) -> str:
        return "".join(path.read_text(errors="replace") for path in sorted(self.tmp.glob("node*-serve-*.log")))

    def stop(self) -> None:
        self.halt.set()
        for node in self.nodes:
            node.stop()
        self.redis.kill()


@pytest.fixture
def cluster(tmp_path):
    redis = RedisServer(tmp_path / "redis").start()
    built = Cluster(tmp_path, redis)
    try:
        built.start_node(0)
        built.start_node(1)
        yield built
    finally:
        built.stop()


# -- writers --------------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What clients were told: every acknowledged record (its bytes), and every other answer."""

    acked: dict[str, bytes] = field(default_factory=dict)
    statuses: Counter = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    slowest: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, body: bytes) -> None:
        event_id = json.loads(body)["envelope"]["hash"]
        with self.lock:
            earlier = self.acked.setdefault(event_id, body)
        if earlier != body:
            self.unexpected.append(f"{event_id} acknowledged twice with different records")

    def answered(self, status: int | str, took: float) -> None:
        with self.lock:
            self.statuses[status] += 1
            self.slowest = max(self.slowest, took)

    def progress(self) -> int:
        return len(self.acked)


def write(cluster: Cluster, index: int, items: list[bytes], ledger: Ledger, allowed: frozenset[int]) -> None:
    """Submit ``items`` to node ``index`` like a client that retries; every 4th acknowledged one again to the other node.

    A refused connection (the node was killed) or an answer in ``allowed`` (503 while Redis is down)
    is noted and the same envelope is sent again a little later (resubmission is idempotent, and a
    503 may have been committed anyway); anything else is ``unexpected``.
    """
    other = 1 - index
    deadline = time.monotonic() + 150
    for number, raw in enumerate(items):
        response = None
        while response is None and not cluster.halt.is_set() and time.monotonic() < deadline:
            started = time.monotonic()
            try:
                with cluster.http(index) as http:  # a fresh connection: the node may have been restarted
                    response = http.post("/v1/knowledge/events", content=raw, headers=HEADERS)
            except httpx.TransportError as exc:
                ledger.answered(type(exc).__name__, time.monotonic() - started)
                time.sleep(0.05)
                continue
            ledger.answered(response.status_code, time.monotonic() - started)
            if response.status_code in allowed:
                if "retry-after" not in response.headers:
                    ledger.unexpected.append(f"{response.status_code} without Retry-After: {response.text}")
                response = None
                time.sleep(0.05)
        if response is None:
            return
        if response.status_code not in (200, 201):
            ledger.unexpected.append(f"node {index}: {response.status_code} {response.text[:300]}")
            continue
        ledger.ack(response.content)
        if number % 4 == 0:
            try:
                with cluster.http(other) as http:
                    again = http.post("/v1/knowledge/events", content=raw, headers=HEADERS)
            except httpx.TransportError:
                continue
            if again.status_code in (200, 201):
                if again.content != response.content:
                    ledger.unexpected.append(f"resubmission to node {other} answered another record: "
                                             f"{again.text[:200]} != {response.text[:200]}")
            elif again.status_code not in allowed:
                ledger.unexpected.append(f"resubmission to node {other}: {again.status_code} {again.text[:300]}")


def start_writers(cluster: Cluster, ledger: Ledger, *, per_node: int, threads: int,
                  seed: int, allowed: frozenset[int] = frozenset()) -> list[threading.Thread]:
    """``threads`` writers per node, each with its own distinct signed capsules."""
    started = []
    for index in (0, 1):
        items = envelopes(per_node, seed + index)
        for t in range(threads):
            thread = threading.Thread(target=write, args=(cluster, index, items[t::threads], ledger, allowed),
                                      name=f"writer-{index}-{t}", daemon=True)
            thread.start()
            started.append(thread)
    return started


def wait_for(predicate, timeout: float, what: str, step: float = 0.02) -> float:
    """Poll until ``predicate()``; the seconds it took (an AssertionError naming ``what`` past ``timeout``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout} s")


# -- reading the log back -------------------------------------------------------------------------


def enumerate_log(http: httpx.Client, limit: int = 1000) -> tuple[int, list[dict]]:
    """Every visible record by the checkpoint-bound query (all pages), and the first page's checkpoint."""
    records: list[dict] = []
    params: dict[str, str] = {"limit": str(limit)}
    checkpoint = None
    for _ in range(10_000):
        response = http.get("/v1/knowledge/query", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        checkpoint = page["checkpoint"] if checkpoint is None else checkpoint
        assert page["checkpoint"] == checkpoint
        records.extend(page["result"])
        if "next_cursor" not in page:
            return checkpoint, records
        params = {"limit": str(limit), "cursor": page["next_cursor"]}
    raise AssertionError("the enumeration did not end")


def check_the_log(cluster: Cluster, ledger: Ledger) -> list[dict]:
    """No acknowledged record lost or changed, unique seqs, the same complete set with equal checkpoints."""
    assert ledger.acked, "nothing was acknowledged"
    with cluster.http(0) as a, cluster.http(1) as b:
        checkpoint_a, records_a = enumerate_log(a)
        checkpoint_b, records_b = enumerate_log(b)
        assert checkpoint_a == checkpoint_b, "the nodes disagree on the checkpoint"
        assert records_a == records_b, "the nodes enumerate different sets"
        seqs = [r["seq"] for r in records_a]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "seq values repeat or go backwards"
        print(f"checkpoint {checkpoint_a}: {len(seqs)} records, {len(ledger.acked)} acknowledged")
        # the seq is allocated in the same Redis script as the record: a crash leaves no gap
        assert seqs == list(range(1, checkpoint_a + 1)), f"{checkpoint_a - len(seqs)} seq values were never used"
        by_id = {r["envelope"]["hash"]: r for r in records_a}
        for event_id, body in ledger.acked.items():
            assert by_id.get(event_id) == json.loads(body), f"acknowledged {event_id} lost or changed"
        # byte for byte: what each node serves for a record is what the client was told at acceptance
        for event_id, body in list(ledger.acked.items())[:: max(1, len(ledger.acked) // 60)]:
            for http in (a, b):
                served = http.get(f"/v1/knowledge/events/{event_id}")
                assert served.status_code == 200 and served.content == body, (event_id, served.text[:200])
    return records_a


def check_logs_clean(cluster: Cluster) -> None:
    """No traceback, no 5xx but 503, and (by the nodes' own access log) no request answered after 10 s."""
    text = cluster.logs()
    assert "Traceback" not in text, text[text.index("Traceback") - 2000:][:6000]
    requests = [json.loads(line) for line in text.splitlines() if line.startswith("{") and '"request_id"' in line]
    assert requests, "no access log lines (--log-json)"
    five_hundreds = [r for r in requests if r["status"] >= 500 and r["status"] != 503]
    assert not five_hundreds, five_hundreds[:5]
    slow = [r for r in requests if r["duration_ms"] >= ANSWER_WITHIN * 1000]
    assert not slow, slow[:5]


# -- followers ------------------------------------------------------------------------------------


def search(http: httpx.Client, text: str) -> dict:
    response = http.post("/v1/knowledge/search", content=json.dumps({"text": text, "mode": "lexical"}), headers=HEADERS)
    assert response.status_code == 200, response.text
    return response.json()


def kip(http: httpx.Client, command: str, **params) -> dict:
    body = {"kip": "2.0", "operations": [{"command": command}], **({"parameters": params} if params else {})}
    response = http.post("/v1/kip", content=json.dumps(body), headers=HEADERS)
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    assert result["status"] == "succeeded", result
    return result["result"]


def kip_finds(http: httpx.Client, title: str) -> bool:
    rows = kip(http, 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", name: :title} }', title=title)["rows"]
    return rows == [[title]]


def nexus_head(data: Path) -> int:
    """The KIP nexus head in a node's data directory, read from its file (no request opens or feeds it)."""
    path = data / "kip-nexus.sqlite3"
    if not path.exists():
        return 0
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        row = connection.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()
    except sqlite3.OperationalError:  # being created
        return 0
    finally:
        connection.close()
    return int(row[0]) if row else 0


def followers_reach(http: httpx.Client, checkpoint: int) -> bool:
    """The node's search index and KIP nexus cover ``checkpoint``."""
    return (search(http, "statement")["index_seq"] >= checkpoint
            and kip(http, "DESCRIBE SPACE")["space_seq"] >= checkpoint)


# -- the tests ------------------------------------------------------------------------------------


def test_two_nodes_with_two_workers_serve_one_log(cluster: Cluster) -> None:
    ledger = Ledger()
    writers = start_writers(cluster, ledger, per_node=240, threads=3, seed=60)
    with cluster.http(0) as a, cluster.http(1) as b:
        # read-your-writes across nodes, while the writers run: an assessment sent to one node right
        # after its target was accepted on the other is accepted, never missing_dependency
        for i in range(50):
            first, second = (a, b) if i % 2 == 0 else (b, a)
            target = first.post("/v1/knowledge/events", content=publication(f"ryw target {i}"), headers=HEADERS)
            assert target.status_code == 200, target.text
            ledger.ack(target.content)
            assessed = second.post("/v1/knowledge/events", content=assessment(target.json()["envelope"]["hash"]),
                                   headers=HEADERS)
            assert assessed.status_code == 200, f"pair {i}: {assessed.status_code} {assessed.text}"
            ledger.ack(assessed.content)
        for thread in writers:
            thread.join(120)
        assert not any(thread.is_alive() for thread in writers)
        assert not ledger.unexpected, ledger.unexpected[:5]
        assert set(ledger.statuses) == {200}, ledger.statuses
        records = check_the_log(cluster, ledger)
        assert len(records) == len(ledger.acked) == 2 * 240 + 100

        # cursors issued by one node page correctly on the other (alternating every page)
        params: dict[str, str] = {"limit": "37", "type": "knowledge.publish"}
        paged: list[dict] = []
        for page_number in range(100):
            response = (a, b)[page_number % 2].get("/v1/knowledge/query", params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            paged.extend(page["result"])
            if "next_cursor" not in page:
                break
            params = {"limit": "37", "type": "knowledge.publish", "cursor": page["next_cursor"]}
        assert paged == [r for r in records if r["envelope"]["event"]["type"] == "knowledge.publish"]
        assert page_number >= 3

        # followers: a capsule accepted on one node is found by ranked search and by KIP on the other
        searched, answered = [], []
        for i in range(6):
            word = f"quokka{i}x{int(time.time() * 1000)}"
            title = f"{word} capsule"
            source, reader = (a, b) if i % 2 == 0 else (b, a)
            accepted = source.post("/v1/knowledge/events", content=publication(title), headers=HEADERS)
            assert accepted.status_code == 200, accepted.text
            event_id = accepted.json()["envelope"]["hash"]
            at = time.monotonic()
            wait_for(lambda: event_id in [h["record"]["envelope"]["hash"] for h in search(reader, word)["result"]],
                     30.0, f"search for {word} on the other node")
            searched.append(time.monotonic() - at)
            wait_for(lambda: kip_finds(reader, title), 30.0, f"KIP FIND of {title!r} on the other node")
            answered.append(time.monotonic() - at)
        print(f"cross-node follower latency: search {sorted(searched)}, KIP {sorted(answered)}")
        # The goal (a median within 1 s) is a figure (printed above; docs/benchmarks.md), not a test
        # bound: the followers run at idle priority, so a loaded machine can starve them for seconds.
        # What a test can tell: the other node's followers were woken (a missed wake-up would wait
        # for the next poll or burst deadline every time, never a median this low on any machine).
        assert statistics.median(searched) <= 5.0, f"search on the other node took {searched} s (median > 5 s)"
        assert statistics.median(answered) <= 5.0, f"KIP on the other node took {answered} s (median > 5 s)"
    check_logs_clean(cluster)


def test_kill_9_of_a_node_mid_ingest_then_it_restarts_and_catches_up(cluster: Cluster) -> None:
    ledger = Ledger()
    writers = start_writers(cluster, ledger, per_node=400, threads=3, seed=70)
    wait_for(lambda: ledger.progress() >= 150, 60, "150 acceptances before the kill")
    cluster.kill_node(0)
    at_kill = ledger.progress()
    wait_for(lambda: ledger.progress() >= at_kill + 100, 60, "acceptances on the surviving node")
    cluster.restart_node(0)
    for thread in writers:
        thread.join(180)
    assert not any(thread.is_alive() for thread in writers)
    assert not ledger.unexpected, ledger.unexpected[:5]
    assert set(ledger.statuses) <= {200, "ConnectError", "ReadError", "RemoteProtocolError", "WriteError"}, ledger.statuses
    assert any(isinstance(s, str) for s in ledger.statuses), "the kill did not land mid-ingest"
    records = check_the_log(cluster, ledger)
    checkpoint = records[-1]["seq"]
    with cluster.http(0) as restarted, cluster.http(1) as survivor:
        # the restarted node's search index and KIP nexus catch up by themselves: read from the nexus file
        # and the search answer's index position, neither of which makes the node import anything
        took = wait_for(lambda: nexus_head(cluster.nodes[0].data) >= checkpoint
                        and search(restarted, "statement")["index_seq"] >= checkpoint, 30,
                        "the restarted node's followers reaching the checkpoint", step=0.2)
        print(f"node restarted; its followers at the checkpoint {checkpoint} {took:.2f} s after the writers ended")
        assert followers_reach(restarted, checkpoint) and followers_reach(survivor, checkpoint)
    check_logs_clean(cluster)


def test_kill_9_of_redis_mid_ingest_then_a_restart_from_its_aof(cluster: Cluster) -> None:
    ledger = Ledger()
    writers = start_writers(cluster, ledger, per_node=400, threads=3, seed=80,
                            allowed=frozenset({503}))
    wait_for(lambda: ledger.progress() >= 150, 60, "150 acceptances before the kill")
    cluster.redis.kill()
    killed = time.monotonic()
    with cluster.http(0, timeout=30) as a, cluster.http(1, timeout=30) as b:
        noticed = [wait_for(lambda http=http: http.get("/readyz").status_code == 503, 10, "/readyz 503", step=0.05)
                   for http in (a, b)]
        event_id = next(iter(ledger.acked))
        calls = {
            "submit": lambda http: http.post("/v1/knowledge/events", content=publication("while down"), headers=HEADERS),
            "assess": lambda http: http.post("/v1/knowledge/events", content=assessment(event_id), headers=HEADERS),
            "lookup": lambda http: http.get(f"/v1/knowledge/events/{event_id}"),
            "query": lambda http: http.get("/v1/knowledge/query", params={"limit": "5"}),
            "batch": lambda http: http.post("/v1/knowledge/batch", content=json.dumps({"hashes": [event_id]}),
                                            headers=HEADERS),
            "search": lambda http: http.post("/v1/knowledge/search", content=b'{"text": "statement", "mode": "lexical"}',
                                             headers=HEADERS),
            "kip": lambda http: http.post("/v1/kip", content=json.dumps(
                {"kip": "2.0", "operations": [{"command": "DESCRIBE SPACE"}]}), headers=HEADERS),
            "knowql": lambda http: http.post("/query", content=json.dumps(
                {"ask": "what was published?", "scope": ["knowledge"], "retrieval_only": True}), headers=HEADERS),
            "readyz": lambda http: http.get("/readyz"),
        }
        for name, call in calls.items():
            for http in (a, b):
                started = time.monotonic()
                response = call(http)
                took = time.monotonic() - started
                assert took < ANSWER_WITHIN, (name, took)
                assert response.status_code == 503, (name, response.status_code, response.text)
                assert int(response.headers["retry-after"]) >= 1 and response.json()["error"]["code"] == "service_unavailable"
        for http in (a, b):
            assert http.get("/healthz").status_code == 200
            assert http.get("/.well-known/agent-knowledge").status_code == 200  # needs no store
            for path in ("/metrics", "/explorer/"):  # may show less, but never fail
                started = time.monotonic()
                status = http.get(path).status_code
                assert status in (200, 503) and time.monotonic() - started < ANSWER_WITHIN, (path, status)
        # an outage of some seconds: long enough for every retry loop to have backed off
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - killed)))
        cluster.redis.start()  # replays the append-only file
        back = [wait_for(lambda http=http: http.get("/readyz").status_code == 200, 15, "/readyz 200 again", step=0.1)
                for http in (a, b)]
        print(f"/readyz 503 after {noticed} s, 200 again {back} s after Redis restarted")
        assert max(noticed) <= 10.0, noticed  # about 1-2 s (a readiness probe per second); room for load
        # the followers resume at once: a capsule accepted on one node is searchable on the other
        accepted = a.post("/v1/knowledge/events", content=publication("wombatafter capsule"), headers=HEADERS)
        assert accepted.status_code == 200, accepted.text
        ledger.ack(accepted.content)
        took = wait_for(lambda: search(b, "wombatafter")["result"], 30.0, "search on node 1 after the outage")
        print(f"after the outage: searchable on the other node in {took:.2f} s")
        assert took <= 15.0, f"searchable on the other node {took:.2f} s after Redis returned"  # ~1 s; room for load
        at_restart = ledger.progress()
        wait_for(lambda: ledger.progress() >= at_restart + 50, 60, "acceptances after Redis returned")
        for thread in writers:
            thread.join(180)
        assert not any(thread.is_alive() for thread in writers)
        assert not ledger.unexpected, ledger.unexpected[:5]
        assert ledger.statuses[503] > 0, "no writer met the outage"
        assert set(ledger.statuses) <= {200, 503}, ledger.statuses
        assert ledger.slowest < ANSWER_WITHIN, ledger.slowest
        records = check_the_log(cluster, ledger)
        checkpoint = records[-1]["seq"]
        wait_for(lambda: followers_reach(a, checkpoint) and followers_reach(b, checkpoint), 30,
                 "the followers reaching the checkpoint after the outage", step=0.2)
    check_logs_clean(cluster)
