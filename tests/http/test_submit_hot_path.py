"""The lean ``POST /v1/knowledge/events`` route: grouped commits keep every acceptance rule.

Concurrent submissions in one worker meet in one commit group; these tests
drive the ASGI app directly with many requests in flight so that groups really
form, and check seqs, duplicates, failures and method handling.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from akrelay.process.worker import create_app
from akrelay.protocol.signer import Signer, publish_event
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.settings import defaults
from akrelay.store.sqlite import SqliteStore

ORIGIN = "https://localhost:8443"
NOW = 1_760_000_000_000
LICENSE = "https://creativecommons.org/licenses/by/4.0/"


def _envelopes(count: int) -> list[bytes]:
    signer = Signer.from_seed(bytes(range(32)))
    out = []
    for i in range(count):
        payload = {"license": LICENSE, "kind": "observation", "title": f"Hot path item {i}",
                   "statement": f"Statement number {i} about grouped commits.", "language": "en",
                   "context": {"scope": "tests", "conditions": [], "limitations": []},
                   "basis": "Synthetic.", "tags": ["hot-path"]}
        out.append(json.dumps(signer.sign(publish_event(signer.agent_id, NOW - 1000, i + 1, payload))).encode())
    return out


def _scope(method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "https", "path": "/v1/knowledge/events", "raw_path": b"/v1/knowledge/events",
            "root_path": "", "query_string": b"", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8443),
            "headers": headers if headers is not None else [(b"content-type", b"application/json")]}


async def _call(app: Any, body: bytes, method: str = "POST") -> tuple[int, dict[str, str], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(_scope(method), receive, send)
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def _app(tmp_path, store: SqliteStore | None = None):  # noqa: ANN001, ANN202
    store = store or SqliteStore(tmp_path / "relay.sqlite3")
    relay = Relay(store, RelayConfig(origin=ORIGIN), clock=lambda: NOW, cursor_secret=b"k" * 32)
    return create_app(relay, defaults().replace(write_rate=0, read_rate=0, core_only=True)), relay


def test_concurrent_submissions_are_grouped_with_unique_increasing_seqs(tmp_path) -> None:
    app, relay = _app(tmp_path)
    groups: list[int] = []
    commit, try_commit = relay.commit_admitted, relay.try_commit_admitted
    relay.commit_admitted = lambda items: groups.append(len(items)) or commit(items)  # type: ignore[method-assign]

    def counted_try(items):  # noqa: ANN001, ANN202
        results = try_commit(items)
        if results is not None:
            groups.append(len(items))
        return results

    relay.try_commit_admitted = counted_try  # type: ignore[method-assign]
    items = _envelopes(40)
    # Every envelope twice, all in flight at once: each ID is created exactly once.
    answers = asyncio.run(_gather(app, items + items))
    assert all(status == 200 for status, _, _ in answers)
    records = [json.loads(body) for _, _, body in answers]
    by_id: dict[str, set[int]] = {}
    for record in records:
        by_id.setdefault(record["envelope"]["hash"], set()).add(record["seq"])
    assert len(by_id) == 40 and all(len(seqs) == 1 for seqs in by_id.values())
    assert sorted(s for seqs in by_id.values() for s in seqs) == list(range(1, 41))
    assert relay.checkpoint() == 40
    assert max(groups) > 1 and sum(groups) <= 80  # commits really were grouped
    for record in records:  # every answer is the committed record
        assert relay.get(record["envelope"]["hash"]).seq == record["seq"]
    relay.close()


async def _gather(app: Any, bodies: list[bytes]) -> list[tuple[int, dict[str, str], bytes]]:
    return list(await asyncio.gather(*(_call(app, body) for body in bodies)))


class _FailingStore(SqliteStore):
    def commit_many(self, items):  # noqa: ANN001, ANN201
        raise RuntimeError("disk on fire")

    def try_commit_many(self, items):  # noqa: ANN001, ANN201
        raise RuntimeError("disk on fire")


def test_a_failed_group_commit_is_a_500_for_every_waiter_and_nothing_is_acknowledged(tmp_path, caplog) -> None:
    app, relay = _app(tmp_path, _FailingStore(tmp_path / "relay.sqlite3"))
    with caplog.at_level(logging.ERROR, logger="akrelay.http"):
        answers = asyncio.run(_gather(app, _envelopes(6)))
    assert [status for status, _, _ in answers] == [500] * 6
    assert all(json.loads(body)["error"]["code"] == "internal_error" for _, _, body in answers)
    assert any("unhandled error" in r.message for r in caplog.records)
    assert relay.checkpoint() == 0
    # The endpoint recovers: a later group commits normally once the store works again.
    relay.store.commit_many = lambda items: SqliteStore.commit_many(relay.store, items)  # type: ignore[method-assign]
    relay.store.try_commit_many = lambda items: SqliteStore.try_commit_many(relay.store, items)  # type: ignore[method-assign]
    status, _, body = asyncio.run(_call(app, _envelopes(1)[0]))
    assert status == 200 and json.loads(body)["seq"] == 1
    relay.close()


def test_a_resubmission_is_answered_from_the_store_when_the_deferred_write_fails(tmp_path, caplog) -> None:
    """Step 2 is deferred to the commit on this path; a failing write must not hide a retained record."""
    app, relay = _app(tmp_path)
    first, second = _envelopes(2)
    status, _, body = asyncio.run(_call(app, first))
    assert status == 200
    original = json.loads(body)

    def broken(items):  # noqa: ANN001, ANN202
        raise RuntimeError("disk full")

    relay.store.commit_many = broken  # type: ignore[method-assign]
    relay.store.try_commit_many = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="akrelay.http"):
        status, _, body = asyncio.run(_call(app, first))
        assert status == 200 and json.loads(body) == original
        status, _, body = asyncio.run(_call(app, second))  # a new envelope: the failure is a 500
    assert status == 500 and json.loads(body)["error"]["code"] == "internal_error"
    assert relay.checkpoint() == 1
    relay.close()


def test_a_busy_commit_point_hands_the_group_to_a_thread_that_waits(tmp_path) -> None:
    """Another writer (another worker in production) holds the write flock: nothing is lost or doubled."""
    import threading

    app, relay = _app(tmp_path)
    other = SqliteStore(tmp_path / "relay.sqlite3")  # its own open file description, like another process
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with other._write_lock:  # noqa: SLF001
            other._locked(lambda: (holding.set(), release.wait(120)))  # noqa: SLF001

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60)
    assert relay.try_commit_admitted([]) is None  # the inline path refuses to wait
    handed = threading.Event()
    commit_admitted = relay.commit_admitted

    def waiting_commit(items):  # noqa: ANN001, ANN202 - the thread's path: say so, then wait for the flock
        handed.set()
        return commit_admitted(items)

    relay.commit_admitted = waiting_commit  # type: ignore[method-assign]
    # the other writer lets go once a group waits in a thread (an event, not a timer that may fire first)
    releaser = threading.Thread(target=lambda: handed.wait(120) and release.set())
    releaser.start()
    answers = asyncio.run(_gather(app, _envelopes(12)))
    release.set()
    holder.join(60)
    releaser.join(60)
    assert handed.is_set()
    assert [status for status, _, _ in answers] == [200] * 12
    assert sorted(json.loads(body)["seq"] for _, _, body in answers) == list(range(1, 13))
    assert relay.checkpoint() == 12
    other.close()
    relay.close()


def test_an_unexpected_error_before_the_answer_is_a_logged_500(tmp_path, caplog) -> None:
    app, relay = _app(tmp_path)

    def broken(raw):  # noqa: ANN001, ANN202
        raise KeyError("bug")

    relay.check_local = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="akrelay.http"):
        status, headers, body = asyncio.run(_call(app, _envelopes(1)[0]))
    assert status == 500 and json.loads(body) == {"error": {"code": "internal_error", "message": "Internal server error."}}
    assert headers["content-type"] == "application/json"
    assert any("unhandled error" in r.message for r in caplog.records)
    relay.close()


def test_the_fast_path_applies_the_write_rate_limit(tmp_path) -> None:
    store = SqliteStore(tmp_path / "relay.sqlite3")
    relay = Relay(store, RelayConfig(origin=ORIGIN), clock=lambda: NOW, cursor_secret=b"k" * 32)
    app = create_app(relay, defaults().replace(write_rate=1, write_burst=2, read_rate=0, core_only=True))
    answers = [asyncio.run(_call(app, body)) for body in _envelopes(3)]
    assert [status for status, _, _ in answers] == [200, 200, 429]
    status, headers, body = answers[2]
    assert json.loads(body)["error"]["code"] == "rate_limited" and int(headers["retry-after"]) >= 1
    assert relay.checkpoint() == 2
    relay.close()


def test_methods_other_than_post(tmp_path) -> None:
    app, relay = _app(tmp_path)
    status, headers, body = asyncio.run(_call(app, b"{}", "GET"))
    assert status == 405 and json.loads(body)["error"]["code"] == "invalid_request"
    assert "POST" in headers["allow"]
    status, headers, _ = asyncio.run(_call(app, b"", "OPTIONS"))
    assert status == 204 and "POST" in headers["allow"]
    assert relay.checkpoint() == 0
    relay.close()


def test_a_disconnect_before_the_body_commits_nothing(tmp_path) -> None:
    """Granian reports malformed chunked framing as a disconnect too, so the answer is a 400 (lost if the client left)."""
    app, relay = _app(tmp_path)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(_scope(), receive, send))
    assert relay.checkpoint() == 0
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"] and sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["code"] == "invalid_request"
    relay.close()
