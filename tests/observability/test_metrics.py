"""``GET /metrics``: counters match what was sent, in one process and summed across Granian workers."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from akrelay.observability.requests import METHODS

from tests.http.relay_harness import start_relay
from tests.knowql.kq_harness import Corpus, knowql_app

JSON_HEADERS = {"content-type": "application/json"}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_in_one_process(tmp_path: Path, capfd) -> None:
    with knowql_app(tmp_path, log_json=True) as kq:
        before = kq.client.get("/metrics").text
        c = kq.corpus
        a = c.publish("alice", "Disk", "The disk fills.")
        kq.submit(a, c.assess("bob", a["hash"], "supports"))
        assert kq.client.post("/v1/knowledge/events", content=json.dumps(a), headers=JSON_HEADERS).status_code == 200
        assert kq.client.post("/v1/knowledge/events", content=b"{}", headers=JSON_HEADERS).status_code == 400
        after = kq.client.get("/metrics")
        assert after.status_code == 200 and after.headers["content-type"].startswith("text/plain")
        text = after.text
        for name, labels, delta in [("akrelay_events_accepted_total", {"type": "knowledge.publish"}, 1),
                                    ("akrelay_events_accepted_total", {"type": "knowledge.assess"}, 1),
                                    ("akrelay_events_duplicate_total", {}, 1),
                                    ("akrelay_events_refused_total", {"code": "invalid_event"}, 1)]:
            assert value(text, name, **labels) - value(before, name, **labels) == delta, name
        assert value(text, "akrelay_checkpoint") == 2
        assert value(text, "akrelay_search_index_lag") == 0
        count = value(text, "akrelay_request_duration_seconds_count", route="/v1/knowledge/events", method="POST",
                      status="200") - value(before, "akrelay_request_duration_seconds_count",
                                            route="/v1/knowledge/events", method="POST", status="200")
        assert count == 3
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line.startswith("{")]
    assert {"request_id", "route", "status", "duration_ms"} <= set(lines[0])
    assert any(line["route"] == "/v1/knowledge/events" and line["status"] == 400 for line in lines)


def test_rate_limited_requests_are_counted(tmp_path: Path) -> None:
    with knowql_app(tmp_path, read_rate=0.001, read_burst=1) as kq:
        before = 0.0
        statuses = [kq.client.get("/v1/knowledge/query").status_code for _ in range(3)]
        assert 429 in statuses
        # /metrics is a read too; it may itself be limited, so read the counter directly
        from akrelay.observability.metrics import metrics

        assert metrics().rate_limited.labels("read")._value.get() > before


@pytest.mark.slow
def test_scraped_during_ingest_across_workers(tmp_path: Path) -> None:
    served = start_relay(tmp_path / "data", workers=2, extra=["--write-rate", "0", "--read-rate", "0"])
    corpus = Corpus()
    publishes = [corpus.publish(("alice", "bob", "carol", "dave")[i % 4], f"Capsule {i}", f"Statement {i}.")
                 for i in range(40)]
    assessments = [corpus.assess("dave", p["hash"], "supports") for p in publishes[:15]]
    scrapes: list[str] = []
    stop = threading.Event()
    try:
        with httpx.Client(verify=served.ssl_context(), timeout=10) as scraper:
            def scrape_loop() -> None:
                while not stop.is_set() and len(scrapes) < 200:
                    scrapes.append(scraper.get(served.origin + "/metrics").text)

            thread = threading.Thread(target=scrape_loop)
            thread.start()
            with httpx.Client(verify=served.ssl_context(), timeout=10, limits=httpx.Limits(max_connections=4)) as c:
                for env in publishes + assessments:
                    r = c.post(served.origin + "/v1/knowledge/events", content=json.dumps(env), headers=JSON_HEADERS)
                    assert r.status_code == 200, r.text
                for env in publishes[:5]:  # exact resubmissions
                    assert c.post(served.origin + "/v1/knowledge/events", content=json.dumps(env),
                                  headers=JSON_HEADERS).status_code == 200
                for _ in range(3):
                    assert c.post(served.origin + "/v1/knowledge/events", content=b"[]",
                                  headers=JSON_HEADERS).status_code == 400
            stop.set()
            thread.join(timeout=30)
            final = scraper.get(served.origin + "/metrics").text
    finally:
        stop.set()
        served.stop()
    assert len(scrapes) >= 1  # scraped while ingesting
    for text in scrapes:  # never more than was sent, never decreasing below zero
        assert value(text, "akrelay_events_accepted_total", type="knowledge.publish") <= 40
    assert value(final, "akrelay_events_accepted_total", type="knowledge.publish") == 40
    assert value(final, "akrelay_events_accepted_total", type="knowledge.assess") == 15
    assert value(final, "akrelay_events_duplicate_total") == 5
    assert sum(v for (name, labels), v in samples(final).items() if name == "akrelay_events_refused_total") == 3
    assert value(final, "akrelay_checkpoint") == 55
    assert value(final, "akrelay_request_duration_seconds_count", route="/v1/knowledge/events", method="POST",
                 status="200") == 60


def test_head_requests_are_labelled_with_their_route(tmp_path: Path) -> None:
    with knowql_app(tmp_path) as kq:
        assert kq.client.head("/.well-known/agent-knowledge").status_code == 200
        text = kq.client.get("/metrics").text
        assert value(text, "akrelay_request_duration_seconds_count", route="/.well-known/agent-knowledge",
                     method="HEAD", status="200") >= 1


def test_made_up_methods_and_paths_do_not_grow_the_metrics(tmp_path: Path) -> None:
    """Every label is bounded whatever the client sends (issue 24 item 16): made-up methods are ``other``."""
    with knowql_app(tmp_path, read_rate=0.0, write_rate=0.0) as kq:
        warm = kq.client.request("BREW", "/v1/knowledge/query")  # the first ``other`` series exists from here
        assert warm.status_code == 405
        kq.client.request("BREW", "/no/such/path")
        before = kq.client.get("/metrics").text
        for n in range(300):
            made_up = f"M{n:04d}X"
            assert kq.client.request(made_up, "/v1/knowledge/query").status_code == 405
            kq.client.request(made_up, f"/no/such/path/{n}")
            kq.client.get(f"/v1/knowledge/events/{made_up}")
            kq.client.get(f"/explorer/static/{made_up}.css")
            kq.client.get(f"/sessions/{made_up}")
        after = kq.client.get("/metrics").text
    series = {labels for (name, labels) in samples(after) if name == "akrelay_request_duration_seconds_count"}
    earlier = {labels for (name, labels) in samples(before) if name == "akrelay_request_duration_seconds_count"}
    methods = {dict(labels)["method"] for labels in series}
    # HTTP's own methods (other tests in this process may have sent PUT or DELETE) or ``other``
    assert methods <= METHODS | {"other"}, sorted(methods)[:10]
    assert "other" in methods and not {m for m in methods if m.startswith("M") and m.endswith("X")}
    # 1,500 requests of 5 kinds add at most a series per (route, method, status) they reach; other tests
    # in this process may have added series of their own before ``before`` was read
    assert len(series - earlier) < 12, sorted(series - earlier)
    # 1,500 more requests: the counts grow, the exposition does not (new series would each add ~1.5 KB)
    assert len(after) < len(before) + 16 * 1024, (len(before), len(after))
    assert value(after, "akrelay_request_duration_seconds_count", route="unmatched", method="other",
                 status="405") - value(before, "akrelay_request_duration_seconds_count", route="unmatched",
                                       method="other", status="405") == 300


def test_the_launcher_starts_from_an_empty_metrics_directory(tmp_path: Path, monkeypatch) -> None:
    from akrelay.observability.metrics import MULTIPROC_ENV, prepare_multiprocess

    stale = tmp_path / "metrics" / "counter_12345.db"
    stale.parent.mkdir()
    stale.write_bytes(b"old worker")
    # setenv first so that the teardown removes what prepare_multiprocess sets (a bare delenv of an
    # absent variable records nothing, and the directory would leak into later tests' scrapes)
    monkeypatch.setenv(MULTIPROC_ENV, "")
    monkeypatch.delenv(MULTIPROC_ENV)
    path = prepare_multiprocess(tmp_path)
    assert path == tmp_path / "metrics" and list(path.iterdir()) == []
    import os

    assert os.environ[MULTIPROC_ENV] == str(path)
    monkeypatch.delenv(MULTIPROC_ENV)
