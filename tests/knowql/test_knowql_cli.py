"""``akrelay ask`` and ``RelayClient.ask`` against a served relay with two workers sharing one data directory."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from akrelay.cli import main
from akrelay.client import RelayClient, ServiceError

from .kq_harness import Corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))
from relay_harness import start_relay  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    relay = start_relay(tmp_path_factory.mktemp("knowql") / "data", workers=2)
    try:
        corpus = Corpus()
        accepted = corpus.publish("alice", "Cache invalidation on restart", "Restarting the worker clears the cache.")
        with RelayClient(relay.origin, cacert=str(relay.cacert)) as client:
            for env in (accepted, corpus.assess("bob", accepted["hash"], "supports", "Cache cleared, confirmed.")):
                client.submit(env)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # both workers' nexus and index catch up
                doc = client.ask({"ask": "cache restart", "scope": ["knowledge"], "retrieval_only": True})
                if doc["output_json"]["artifacts"] and doc["output_json"]["artifacts"][0]["belief"]["status"] == "accepted":
                    break
                time.sleep(0.2)
        yield relay, accepted["hash"]
    finally:
        relay.stop()


def test_ask_streams_the_answer_and_prints_cited_beliefs(served, capsys) -> None:
    relay, capsule = served
    args = ["--relay", relay.origin, "--cacert", str(relay.cacert)]
    assert main(["ask", "What happens to the cache on restart?", *args]) == 0
    out = capsys.readouterr().out
    assert "Findings (accepted):" in out and "Restarting the worker clears the cache. [1]" in out
    assert f"[1] accepted     {capsule}" in out
    session = out.rsplit("session ", 1)[1].split()[0]
    assert main(["ask", "and the cache size?", "--session", session, "--json", *args]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["session_id"] == session and doc["previous_query_id"]
    assert main(["ask", "cache", "--retrieval-only", *args]) == 0
    assert f"accepted     {capsule}" in capsys.readouterr().out


def test_ask_with_a_shape_file_and_refusals(served, tmp_path, capsys) -> None:
    relay, capsule = served
    args = ["--relay", relay.origin, "--cacert", str(relay.cacert)]
    shape = tmp_path / "shape.json"
    shape.write_text(json.dumps({"type": "object", "properties": {"sources": {"type": "array", "items": {"type": "string"}}},
                                 "required": ["sources"]}))
    assert main(["ask", "cache restart", "--shape", str(shape), "--json", *args]) == 0
    assert json.loads(capsys.readouterr().out)["output_json"] == {"sources": [capsule]}
    assert main(["ask", "cache", "--session", "ses_nope", *args]) == 1
    assert "session_not_found (404)" in capsys.readouterr().err
    impossible = tmp_path / "impossible.json"
    impossible.write_text(json.dumps({"type": "object", "required": ["qualifies"]}))
    assert main(["ask", "cache", "--shape", str(impossible), *args]) == 4
    assert "'qualifies'" in capsys.readouterr().err


def test_any_worker_answers_polls_and_replays(served) -> None:
    relay, _ = served
    with RelayClient(relay.origin, cacert=str(relay.cacert)) as client:
        events = []
        doc = client.ask({"ask": "cache restart", "scope": ["knowledge"]}, on_event=events.append)
        assert doc["status"] == "completed" and events[0]["type"] == "response.created"
        with pytest.raises(ServiceError) as refused:
            client.ask({"ask": "q", "scope": ["nowhere"]})
        assert refused.value.status == 404 and refused.value.code == "context_not_found"
    verify = relay.ssl_context()
    with httpx.Client(verify=verify, timeout=10) as http:
        started = http.post(relay.origin + "/query", json={"ask": "cache", "scope": ["knowledge"], "background": True})
        assert started.status_code == 202
        qid = started.json()["id"]
        seen = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # new connections spread over both workers
            with httpx.Client(verify=verify, timeout=10) as fresh:
                polled = fresh.get(f"{relay.origin}/queries/{qid}").json()
            seen.add(polled["status"])
            if polled["status"] == "completed" and len(seen) >= 1:
                break
            time.sleep(0.05)
        assert polled["status"] == "completed"
        for _ in range(4):
            with httpx.Client(verify=verify, timeout=10) as fresh:
                replay = fresh.get(f"{relay.origin}/queries/{qid}/events").text
            assert replay.rstrip().split("\n")[-2] == "event: query"
