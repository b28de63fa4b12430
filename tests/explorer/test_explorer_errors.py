"""The explorer's error pages, its Content-Type, and how it shows withdrawn assessments and exclusions."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from akrelay.explorer.html import CSP
from tests.knowql.kq_harness import knowql_app


@pytest.fixture
def kq(tmp_path: Path):
    with knowql_app(tmp_path) as kq:
        c = kq.corpus
        capsule = c.publish("alice", "Disk fills at night", "Backups fill the disk.")
        kept = c.assess("bob", capsule["hash"], "supports", "Seen it too.")
        withdrawn = c.assess("carol", capsule["hash"], "supports", "I thought so.")
        kq.submit(capsule, kept, withdrawn, c.retract("carol", withdrawn["hash"]))
        kq.ids = (capsule["hash"], kept["hash"], withdrawn["hash"])
        yield kq


@pytest.mark.parametrize(("method", "url", "status"), [
    ("GET", "/explorer/nope", 404),
    ("GET", "/explorer/capsules/a/b", 404),
    ("GET", "/explorer/capsules/", 404),
    ("POST", "/explorer/search", 405),
    ("DELETE", "/explorer/", 405),
    ("PUT", "/explorer/static/explorer.css", 405),
    ("FOO", "/explorer/status", 405),
])
def test_explorer_404_and_405_are_html_pages_with_its_security_headers(kq, method, url, status) -> None:
    r = kq.client.request(method, url)
    assert r.status_code == status
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.text.startswith("<!doctype html>")
    assert ("Not found" if status == 404 else "Method not allowed") in r.text


def test_the_api_keeps_its_json_errors(kq) -> None:
    r = kq.client.get("/v1/knowledge/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = kq.client.put("/v1/knowledge/events", content=b"{}")
    assert r.status_code == 405 and r.json()["error"]["code"] == "invalid_request"
    assert kq.client.get("/explorerx").json()["error"]["code"] == "not_found"  # not the explorer's space


@pytest.mark.parametrize("url", ["/explorer/", "/explorer/search", "/explorer/status", "/explorer/ask",
                                 "/explorer/static/explorer.css", "/explorer/static/ask.js"])
def test_content_type_names_the_charset_once(kq, url) -> None:
    content_type = kq.client.get(url).headers["content-type"]
    assert content_type.count("charset") == 1, content_type


def _assessment_row(text: str, summary: str) -> str:
    return next(line for line in text.split("<li>") if summary in line)


def test_a_retracted_assessment_is_marked_and_a_kept_one_is_not(kq) -> None:
    capsule, _kept, _withdrawn = kq.ids
    text = kq.client.get(f"/explorer/capsules/{capsule}").text
    assert "retracted by its author" in _assessment_row(text, "I thought so.")
    assert "retracted" not in _assessment_row(text, "Seen it too.")
    agent = kq.client.get(f"/explorer/agents/{kq.corpus.did('carol')}").text
    assert "retracted by its author" in _assessment_row(agent, "I thought so.")


def test_belief_exclusions_are_shown_in_words_not_as_a_dict(kq) -> None:
    capsule, _kept, withdrawn = kq.ids
    text = html.unescape(kq.client.get(f"/explorer/capsules/{capsule}").text)
    assert "assertion_id" not in text and "{'" not in text
    exclusions = text.split("<dt>exclusions</dt>", 1)[1].split("</dd>", 1)[0]
    assert "retracted by its author" in exclusions
    assert f"/explorer/capsules/{withdrawn}" in exclusions  # the excluded assertion links to its event
