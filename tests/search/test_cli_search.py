"""``akrelay search`` against a real multi-worker relay, and its local error paths."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

HTTP_TESTS = str(Path(__file__).resolve().parents[1] / "http")
if HTTP_TESTS not in sys.path:
    sys.path.insert(0, HTTP_TESTS)

from relay_harness import fixture_bytes, hash_of, start_relay  # noqa: E402

from akrelay.cli import main  # noqa: E402
from akrelay.cli.search import build_request, format_page  # noqa: E402

NAMES = ["text_publication", "text_regional", "text_assessment", "text_retraction"]


def test_build_request_and_usage_errors(capsys):
    assert build_request("a b", "lexical", ["kind=question", "created_from=5"], 3) == {
        "text": "a b", "mode": "lexical", "filters": {"kind": "question", "created_from": 5}, "limit": 3}
    for bad in (["kind"], ["=x"], ["created_from=soon"], ["tag=a", "tag=b"]):
        with pytest.raises(ValueError):
            build_request("a", "lexical", bad, None)
    assert main(["search", "x", "--filter", "nonsense", "--relay", "https://127.0.0.1:9"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


def test_format_page_lists_hits_and_coverage():
    record = {"seq": 7, "accepted_at": 1, "envelope": {"hash": "H" * 43, "event": {
        "type": "knowledge.publish", "payload": {"title": "A title"}}}}
    page = {"result": [{"record": record, "explanation": "BM25 1.0: 'a' in title"}], "service": "https://x",
            "checkpoint": 9, "as_of": 1, "index_seq": 8, "ranking": {"mode": "lexical", "id": "r1"},
            "coverage": {"exhaustive": False, "reasons": ["index_lag"]}}
    text = format_page(page)
    assert "checkpoint 9, index_seq 8" in text and "NOT exhaustive (index_lag)" in text
    assert "  1. " + "H" * 43 + "  seq 7  knowledge.publish  'A title'" in text and "'a' in title" in text


@pytest.mark.slow
def test_search_cli_against_a_served_relay(tmp_path, capsys):
    served = start_relay(tmp_path / "data", workers=2)
    try:
        with httpx.Client(verify=served.ssl_context()) as http:
            for name in NAMES:
                response = http.post(served.origin + "/v1/knowledge/events", content=fixture_bytes(name),
                                     headers={"content-type": "application/json"})
                assert response.status_code == 200, response.text
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # acceptance -> searchable, in whichever worker indexes
                page = http.post(served.origin + "/v1/knowledge/search", json={"text": "alpha", "mode": "lexical"}).json()
                if page["coverage"]["exhaustive"]:
                    break
                time.sleep(0.1)
        base = ["--relay", served.origin, "--cacert", str(served.cacert)]
        assert main(["search", "ALPHA", *base]) == 0
        out = capsys.readouterr().out
        assert "coverage: exhaustive" in out and "ranking: lexical akrelay-lexical-bm25" in out
        assert all(hash_of(name) in out for name in NAMES)

        assert main(["search", "alpha", "--filter", "language=en", "--filter", "type=knowledge.publish",
                     "--json", *base]) == 0
        page = json.loads(capsys.readouterr().out)
        assert [h["record"]["envelope"]["hash"] for h in page["result"]] == [hash_of("text_publication")]

        assert main(["search", "alpha", "--limit", "1", *base]) == 0
        assert "NOT exhaustive (candidate_limit)" in capsys.readouterr().out

        assert main(["search", "alpha", "--mode", "semantic", *base]) == 1
        assert "unsupported_search_mode" in capsys.readouterr().err
        assert main(["search", "alpha", "--filter", "kind=essay", *base]) == 1
        assert "invalid_request" in capsys.readouterr().err
        assert main(["search", "alpha", "--limit", "101", *base]) == 1
        assert "invalid_request" in capsys.readouterr().err
    finally:
        served.stop()
