"""The explorer's pages over a real app: content, links both ways, escaping, CSP, errors, the off switch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from akrelay.explorer.html import CSP
from tests.knowql.kq_harness import knowql_app

HOSTILE_TITLE = 'Disk <script>alert("t")</script> full'
HOSTILE_STATEMENT = "It <img src=x onerror=alert(1)> fills & \"stops\"."


@pytest.fixture
def kq(tmp_path: Path):
    with knowql_app(tmp_path) as kq:
        c = kq.corpus
        a = c.publish("alice", HOSTILE_TITLE, HOSTILE_STATEMENT, tags=("ops",))
        b = c.publish("bob", "Disk fills at night", "Backups fill the disk.", relations=(("supports", a["hash"]),))
        kq.submit(a, b, c.assess("carol", a["hash"], "supports", "Seen <b>too</b>."))
        kq.ids = (a["hash"], b["hash"])
        yield kq


def test_root_redirects_and_recent_lists_capsules(kq) -> None:
    r = kq.client.get("/", follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == "/explorer/"
    r = kq.client.get("/explorer/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == CSP
    for eid in kq.ids:
        assert f"/explorer/capsules/{eid}" in r.text


def test_capsule_page_escapes_and_links_both_ways(kq) -> None:
    a, b = kq.ids
    page = kq.client.get(f"/explorer/capsules/{a}")
    assert page.status_code == 200
    text = page.text
    assert "<script>alert" not in text and "<img" not in text and "<b>too" not in text
    assert "&lt;script&gt;alert(&quot;t&quot;)&lt;/script&gt;" in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert f'href="/explorer/capsules/{b}"' in text  # b supports a: the incoming link
    assert f'href="/v1/knowledge/events/{a}"' in text and ">1</dd>" in text  # seq
    assert "supports" in text and kq.corpus.did("carol")[:18] in text
    for policy in ("akrelay:corroborated", "kip:structural", "kip:memory-default"):
        assert policy in text
    assert "status-accepted" in text and "contributing" in text and "(support by" in text
    back = kq.client.get(f"/explorer/capsules/{b}").text
    assert f'href="/explorer/capsules/{a}"' in back  # the outgoing link
    # no script tag at all except the explorer's own files
    assert re.findall(r"<script[^>]*>", text) == []


def test_agent_search_status_pages(kq) -> None:
    a, b = kq.ids
    r = kq.client.get(f"/explorer/agents/{kq.corpus.did('alice')}")
    assert r.status_code == 200 and a in r.text and b not in r.text
    r = kq.client.get("/explorer/search", params={"q": "backups", "kind": "observation"})
    assert r.status_code == 200 and b in r.text and a not in r.text
    r = kq.client.get("/explorer/search", params={"tag": "ops"})
    assert a in r.text and b not in r.text
    r = kq.client.get("/explorer/search", params={"kind": "nonsense"})
    assert r.status_code == 400 and 'class="error"' in r.text
    r = kq.client.get("/explorer/status")
    assert r.status_code == 200 and "checkpoint" in r.text and "KIP import lag" in r.text and "q text index lag" in r.text


def test_ask_form_without_script(kq) -> None:
    a, _ = kq.ids
    r = kq.client.post("/explorer/ask", content="ask=disk+fills&policy=kip%3Astructural",
                       headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text
    assert f'href="/explorer/capsules/{a}"' in r.text and "status-accepted" in r.text
    assert "<script>alert" not in r.text
    # The lead answer comes first, above the evidence list.
    lead = r.text.split('<p id="lead-answer">', 1)[1].split("</p>", 1)[0]
    assert "[1]" in lead and "Findings" not in lead and r.text.index("lead-answer") < r.text.index('id="answer"')
    r = kq.client.post("/explorer/ask", content="ask=", headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and 'class="error"' in r.text


def test_errors_and_assets(kq) -> None:
    assert kq.client.get("/explorer/capsules/not-an-id").status_code == 400
    missing = "A" * 43
    assert kq.client.get(f"/explorer/capsules/{missing}").status_code == 404
    js = kq.client.get("/explorer/static/ask.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert kq.client.get("/explorer/static/../settings.py").status_code == 404
    assert kq.client.get("/explorer/static/nope.js").status_code == 404


def test_explorer_can_be_switched_off(tmp_path: Path) -> None:
    with knowql_app(tmp_path, no_explorer=True) as kq:
        assert kq.client.get("/explorer/").status_code == 404
        assert kq.client.get("/", follow_redirects=False).status_code == 404


@pytest.mark.parametrize("url", [
    "/explorer/capsules/%00", "/explorer/capsules/" + "A" * 5000, "/explorer/agents/did:agent:%F0%9F%92%A5",
    "/explorer/agents/nobody", "/explorer/search?q=%FF", "/explorer/search?cursor=bogus&q=disk",
    "/explorer/search?" + "&".join(f"tag{i}=x" for i in range(100)), "/explorer/search?created_from=x",
    "/explorer/static/%2e%2e%2fhtml.py", "/explorer/capsules/" + "é" * 43,
])
def test_hostile_urls_get_4xx_pages_not_5xx(kq, url: str) -> None:
    r = kq.client.get(url)
    assert 200 <= r.status_code < 500, (url, r.status_code)
    assert r.headers.get("content-security-policy") == CSP or r.status_code == 404


@pytest.mark.parametrize("body", [b"\xff\xfe", b"ask=" + b"x" * 5000, b"policy=nope&ask=disk", b"a=1&" * 20, b""])
def test_hostile_ask_forms_get_400(kq, body: bytes) -> None:
    r = kq.client.post("/explorer/ask", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and 'class="error"' in r.text
