"""The sync engine against respx-mocked peers: the happy path and every misbehaviour."""

from __future__ import annotations

import email.utils
import json
import threading

import httpx

from akrelay.federation.peers import Peer
from akrelay.federation.scheduler import SyncScheduler
from akrelay.federation.state import FederationState

from .conftest import Author, Clock, FakePeer, local_ids, make_engine, make_relay

PEER = "https://peer-a.example"


def peer(origin: str = PEER, **kw) -> Peer:
    return Peer(origin=origin, **kw)


def seeded(router, n: int = 5, **kw) -> tuple[FakePeer, list[dict]]:
    fake = FakePeer(router, **kw)
    alice = Author("alice")
    events = [alice.publish(f"Result {i}") for i in range(n)]
    fake.add(*events)
    return fake, events


def test_full_pass_copies_every_event_with_local_seq_and_accepted_at(router) -> None:
    fake, events = seeded(router, 7)
    local = make_relay(clock=lambda: 1_999_000_000_000 - 10**9)
    state = FederationState()
    [result] = make_engine(local, [peer(page_limit=3)], state).run_once()
    assert result.ok and result.accepted == 7 and result.pages == 3
    assert local_ids(local) == [e["hash"] for e in events]
    for record in local.store.iter_records(0, 100):
        theirs = fake.relay.store.get(record.id)
        assert record.accepted_at != theirs.accepted_at  # ours, never copied
    assert state.get(PEER).checkpoint == fake.relay.store.checkpoint() == 7
    # Cursors were followed with the original parameters repeated.
    assert [c.get("after_seq") for c in fake.query_calls] == ["0", "0", "0"]
    assert "cursor" not in fake.query_calls[0] and "cursor" in fake.query_calls[2]


def test_a_pass_without_fetch_ahead_starts_no_thread(router, monkeypatch) -> None:
    """The pass is a plain call (issue 25): every thread belongs to the scheduler, or to fetch-ahead."""
    fake, events = seeded(router, 7)
    local = make_relay()
    engine = make_engine(local, [peer(page_limit=3)], fetch_ahead=False)
    started = []
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name))
    [result] = engine.run_once()
    assert result.ok and result.accepted == 7 and result.pages == 3
    assert local_ids(local) == [e["hash"] for e in events]
    assert started == []
    engine.close()


def test_fetch_ahead_is_the_one_thread_a_pass_starts(router, monkeypatch) -> None:
    seeded(router, 7)
    engine = make_engine(make_relay(), [peer(page_limit=3)])
    real = threading.Thread.start
    started = []

    def spy(self: threading.Thread) -> None:
        started.append(self.name)
        real(self)

    monkeypatch.setattr(threading.Thread, "start", spy)
    [result] = engine.run_once()
    assert result.ok and started and all(name.startswith("akrelay-sync-fetch") for name in started)
    engine.close()


def test_next_pass_starts_at_the_persisted_checkpoint_and_adds_only_new_events(router) -> None:
    fake, events = seeded(router, 3)
    local = make_relay()
    state = FederationState()
    engine = make_engine(local, [peer()], state)
    engine.run_once()
    newer = Author("bob").publish("Later")
    fake.add(newer)
    [result] = engine.run_once(force=True)
    assert fake.query_calls[-1]["after_seq"] == "3"
    assert result.accepted == 1 and result.duplicates == 0
    assert local_ids(local) == [e["hash"] for e in events] + [newer["hash"]]
    assert state.get(PEER).checkpoint == 4


def test_checkpoint_moves_only_after_the_last_page_and_a_retry_resumes_after_verified_pages(router) -> None:
    fake, events = seeded(router, 6)
    fake.page_hook = lambda body, n: httpx.Response(500) if n == 3 else None
    local = make_relay()
    state = FederationState()
    engine = make_engine(local, [peer(page_limit=2)], state)
    [first] = engine.run_once()
    assert not first.ok and "500" in first.error
    st = state.get(PEER)
    assert st.checkpoint == 0  # pages 1-2 were ingested, but the enumeration is unfinished
    assert st.resume_seq == 4 and st.lag == 2  # ... and what they held is not fetched again
    assert len(local_ids(local)) == 4
    fake.page_hook = None
    [second] = engine.run_once(force=True)
    assert fake.query_calls[-1]["after_seq"] == "4"
    assert second.ok and second.accepted == 2 and second.duplicates == 0
    assert local_ids(local) == [e["hash"] for e in events]
    st = state.get(PEER)
    assert st.checkpoint == 6 and st.resume_seq == 0


def test_advertised_endpoints_are_used_instead_of_default_paths(router) -> None:
    fake, events = seeded(router, 2, query_path="/custom/q", batch_path="/custom/b")
    default = router.get(PEER + "/v1/knowledge/query").mock(return_value=httpx.Response(404))
    local = make_relay()
    [result] = make_engine(local, [peer()]).run_once()
    assert result.ok and len(local_ids(local)) == 2
    assert fake.query_route.called and not default.called


def test_discovery_naming_another_service_is_rejected(router) -> None:
    fake, _ = seeded(router, 2)
    fake.discovery_doc["service"] = "https://evil.example"
    local = make_relay()
    state = FederationState()
    [result] = make_engine(local, [peer()], state).run_once()
    assert not result.ok and "evil.example" in result.error
    assert local_ids(local) == [] and not fake.query_route.called
    assert state.get(PEER).last_error == result.error


def test_discovery_endpoint_on_another_origin_is_rejected(router) -> None:
    fake, _ = seeded(router, 2)
    fake.discovery_doc["endpoints"]["query"] = "https://evil.example/v1/knowledge/query"
    evil = router.get("https://evil.example/v1/knowledge/query").mock(return_value=httpx.Response(200, json={}))
    [result] = make_engine(make_relay(), [peer()]).run_once()
    assert not result.ok and "not on" in result.error and not evil.called


def _tamper(index: int, how: str):
    def hook(body: dict, n: int):
        env = body["result"][index]["envelope"]
        if how == "signature":
            sig = env["signature"]
            env["signature"] = ("A" if sig[0] != "A" else "B") + sig[1:]
        elif how == "hash":
            env["event"]["payload"]["title"] = "Changed after signing"
        return None
    return hook


def test_bad_signature_and_wrong_hash_are_rejected_and_the_rest_accepted(router) -> None:
    for how, code in (("signature", "invalid_signature"), ("hash", "invalid_event_hash")):
        router.reset()
        fake, events = seeded(router, 4)
        fake.page_hook = _tamper(1, how)
        local = make_relay()
        state = FederationState()
        [result] = make_engine(local, [peer()], state).run_once()
        assert result.ok and result.accepted == 3 and result.rejected == 1, how
        assert result.rejections[0][1].startswith(code)
        assert events[1]["hash"] not in local_ids(local)
        assert state.get(PEER).checkpoint == 4  # a forged envelope never becomes valid: move on
        assert state.get(PEER).counts["rejected"] == 1


def test_page_naming_another_service_fails_the_pass(router) -> None:
    fake, _ = seeded(router, 3)
    fake.page_hook = lambda body, n: body.update(service="https://other.example")
    local = make_relay()
    state = FederationState()
    [result] = make_engine(local, [peer()], state).run_once()
    assert not result.ok and "other.example" in result.error
    assert local_ids(local) == [] and state.get(PEER).checkpoint == 0


def test_looping_cursor_is_detected(router) -> None:
    fake, _ = seeded(router, 6)

    def echo(body: dict, n: int):
        # From the second page on, the peer hands back the cursor it was given.
        if n >= 2:
            body["next_cursor"] = fake.query_calls[-1]["cursor"]
        return None

    fake.page_hook = echo
    state = FederationState()
    [result] = make_engine(make_relay(), [peer(page_limit=2)], state).run_once()
    assert not result.ok and "cursor loop" in result.error
    assert result.pages == 2 and state.get(PEER).checkpoint == 0


def test_invalid_cursor_answer_fails_without_restarting(router) -> None:
    fake, _ = seeded(router, 4)
    fake.page_hook = lambda body, n: (httpx.Response(400, json={"error": {"code": "invalid_cursor", "message": "x"}})
                                      if n == 2 else None)
    state = FederationState()
    [result] = make_engine(make_relay(), [peer(page_limit=2)], state).run_once()
    assert not result.ok and "invalid_cursor" in result.error and len(fake.query_calls) == 2
    assert state.get(PEER).checkpoint == 0


def test_malformed_cursor_and_inconsistent_pages_are_misbehaviour(router) -> None:
    cases = {
        "next_cursor": lambda body, n: body.update(next_cursor=12) if n == 1 else None,
        "checkpoint or as_of changed": lambda body, n: body.update(checkpoint=body["checkpoint"] + 1) if n == 2 else None,
        "out of order": lambda body, n: body["result"].reverse() if n == 1 else None,
        "more than limit": lambda body, n: body["result"].extend(body["result"]) if n == 1 else None,
        "acceptance record": lambda body, n: body["result"].__setitem__(0, "nope") if n == 1 else None,
        "missing 'as_of'": lambda body, n: body.__delitem__("as_of") if n == 1 else None,
    }
    for fragment, hook in cases.items():
        router.reset()
        fake, _ = seeded(router, 4)
        fake.page_hook = hook
        local = make_relay()
        state = FederationState()
        [result] = make_engine(local, [peer(page_limit=2)], state).run_once()
        assert not result.ok and fragment in result.error, (fragment, result.error)
        assert state.get(PEER).checkpoint == 0


def test_peer_that_reset_its_sequence_is_reported(router) -> None:
    fake, _ = seeded(router, 2)
    state = FederationState()
    st = state.get(PEER)
    st.checkpoint = 1
    state.put(st)
    fake.page_hook = lambda body, n: body.update(checkpoint=0, result=[])
    [result] = make_engine(make_relay(), [peer()], state).run_once()
    assert not result.ok and "reset" in result.error


def test_503_with_retry_after_backs_off_and_other_peers_still_sync(router) -> None:
    bad, _ = seeded(router, 2)
    bad.page_hook = lambda body, n: httpx.Response(503, headers={"Retry-After": "120"},
                                                   json={"error": {"code": "query_unavailable", "message": "x"}})
    good = FakePeer(router, "https://peer-b.example")
    good.add(Author("carol").publish("Good"))
    clock = Clock()
    local = make_relay()
    state = FederationState()
    engine = make_engine(local, [peer(interval=5), peer("https://peer-b.example")], state, clock=clock)
    bad_result, good_result = engine.run_once()
    assert not bad_result.ok and "503" in bad_result.error and "query_unavailable" in bad_result.error
    assert good_result.ok and good_result.accepted == 1
    assert state.get(PEER).retry_at == clock.now + 120_000
    clock.now += 60_000
    calls = len(bad.query_calls)
    again, _ = engine.run_once()
    assert again.skipped and len(bad.query_calls) == calls  # Retry-After honoured
    clock.now += 61_000
    bad.page_hook = None
    third, _ = engine.run_once()
    assert third.ok and state.get(PEER).retry_at == 0 and state.get(PEER).last_error is None


def test_429_with_http_date_and_5xx_exponential_backoff(router) -> None:
    fake, _ = seeded(router, 1)
    clock = Clock(1_800_000_000_000)
    date = email.utils.formatdate(1_800_000_300, usegmt=True)  # 300 s after the clock
    fake.page_hook = lambda body, n: httpx.Response(429, headers={"Retry-After": date})
    state = FederationState()
    engine = make_engine(make_relay(), [peer(interval=10)], state, clock=clock)
    [r] = engine.run_once()
    assert not r.ok and "429" in r.error
    assert state.get(PEER).retry_at == clock.now + 300_000
    fake.page_hook = lambda body, n: httpx.Response(500)
    delays = []
    for _ in range(3):
        engine.run_once(force=True)
        delays.append(state.get(PEER).retry_at - clock.now)
    assert delays == [20_000, 40_000, 80_000]
    assert state.get(PEER).consecutive_failures == 4


class _Stream(httpx.SyncByteStream):
    def __init__(self, chunks, fail=None, delay=0.0) -> None:
        self.chunks, self.fail, self.delay = chunks, fail, delay

    def __iter__(self):
        import time
        for chunk in self.chunks:
            if self.delay:
                time.sleep(self.delay)
            yield chunk
        if self.fail:
            raise self.fail


def test_truncated_bodies_fail_the_pass(router) -> None:
    fake, _ = seeded(router, 2)

    def cut(body, n):
        data = json.dumps(body).encode()
        return httpx.Response(200, stream=_Stream([data[:40]], fail=httpx.RemoteProtocolError("peer closed")))

    fake.page_hook = cut
    [r] = make_engine(make_relay(), [peer()]).run_once()
    assert not r.ok and r.error.startswith("truncated")
    fake.page_hook = lambda body, n: httpx.Response(200, content=json.dumps(body).encode()[:-10])
    [r] = make_engine(make_relay(), [peer()]).run_once()
    assert not r.ok and r.error.startswith("invalid") and "I-JSON" in r.error


def test_slow_responses_hit_the_whole_read_deadline(router) -> None:
    fake, _ = seeded(router, 2)
    fake.page_hook = lambda body, n: httpx.Response(
        200, stream=_Stream([json.dumps(body).encode()[i:i + 5] for i in range(0, 30, 5)], delay=0.1))
    state = FederationState()
    [r] = make_engine(make_relay(), [peer(read_timeout=0.25)], state).run_once()
    assert not r.ok and r.error.startswith("timeout") and "0.25s" in r.error
    fake.page_hook = lambda body, n: (_ for _ in ()).throw(httpx.ReadTimeout("slow"))
    [r] = make_engine(make_relay(), [peer()]).run_once()
    assert not r.ok and r.error.startswith("timeout")


def test_oversized_bodies_are_refused_while_streaming(router) -> None:
    fake, _ = seeded(router, 30)
    [r] = make_engine(make_relay(), [peer(max_page_bytes=4096)]).run_once()
    assert not r.ok and r.error.startswith("too_large")
    fake.page_hook = lambda body, n: httpx.Response(200, stream=_Stream([b" " * 3000] * 3))
    [r] = make_engine(make_relay(), [peer(max_page_bytes=4096)]).run_once()
    assert not r.ok and r.error.startswith("too_large")


def test_redirects_are_never_followed(router) -> None:
    fake, _ = seeded(router, 2)
    target = router.get("https://elsewhere.example/q").mock(return_value=httpx.Response(200, json={}))
    fake.page_hook = lambda body, n: httpx.Response(302, headers={"Location": "https://elsewhere.example/q"})
    [r] = make_engine(make_relay(), [peer()]).run_once()
    assert not r.ok and r.error.startswith("redirect") and not target.called


def test_non_ijson_bodies_are_refused(router) -> None:
    fake, _ = seeded(router, 1)
    fake.page_hook = lambda body, n: httpx.Response(
        200, content=b'{"result": [], "result": [], "service": "https://peer-a.example", "checkpoint": 1, "as_of": 1}')
    [r] = make_engine(make_relay(), [peer()]).run_once()
    assert not r.ok and r.error.startswith("invalid")


def test_private_addresses_are_refused_unless_allowed(router) -> None:
    fake, _ = seeded(router, 1)
    for address in ("10.0.0.5", "127.0.0.1", "169.254.1.1", "::1", "fc00::1", "100.64.0.1", "::ffff:192.168.1.1"):
        local = make_relay()
        [r] = make_engine(local, [peer()], resolver=lambda h, p, a=address: [a]).run_once()
        assert not r.ok and r.error.startswith("refused") and address in r.error, address
    assert not fake.discovery_route.called
    # A name resolving to a public and a private address is refused too.
    [r] = make_engine(make_relay(), [peer()], resolver=lambda h, p: ["93.184.216.34", "10.1.1.1"]).run_once()
    assert not r.ok and "10.1.1.1" in r.error
    local = make_relay()
    [r] = make_engine(local, [peer(allow_private=True)], resolver=lambda h, p: ["127.0.0.1"]).run_once()
    assert r.ok and len(local_ids(local)) == 1


def test_a_configured_peer_equal_to_our_own_origin_is_skipped(router) -> None:
    engine = make_engine(make_relay(), [peer("https://local.example"), peer()])
    assert [p.origin for p in engine.peers] == [PEER]


def test_endless_empty_pages_are_bounded(router) -> None:
    fake, _ = seeded(router, 2)

    calls = []

    def empty(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, json={"result": [], "service": PEER, "checkpoint": 2, "as_of": 1,
                                         "next_cursor": f"c{len(calls)}"})

    fake.query_route.side_effect = empty
    state = FederationState()
    [r] = make_engine(make_relay(), [peer()], state, max_empty_pages=3).run_once()
    assert not r.ok and "empty pages" in r.error and r.pages == 4
    assert state.get(PEER).checkpoint == 0


def test_retry_after_is_capped_at_a_day(router) -> None:
    fake, _ = seeded(router, 1)
    fake.page_hook = lambda body, n: httpx.Response(503, headers={"Retry-After": "99999999"})
    clock = Clock()
    state = FederationState()
    make_engine(make_relay(), [peer()], state, clock=clock).run_once()
    assert state.get(PEER).retry_at == clock.now + 86_400_000


def test_retry_after_on_a_500_is_ignored(router) -> None:
    """Retry-After means something on 429 and 503 (and redirects); a 500 gets the ordinary back-off."""
    fake, _ = seeded(router, 1)
    fake.page_hook = lambda body, n: httpx.Response(500, headers={"Retry-After": "3600"})
    clock = Clock()
    state = FederationState()
    make_engine(make_relay(), [peer(interval=10)], state, clock=clock).run_once()
    assert state.get(PEER).retry_at == clock.now + 10_000


class PageFeed:
    """A stand-in transport: discovery, then endless pages of one duplicate event with fresh 4 KiB cursors."""

    def __init__(self, envelope: dict) -> None:
        self.envelope = envelope
        self.after_seqs: list[str] = []

    def __enter__(self) -> "PageFeed":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def get_json(self, url: str, params=None, *, max_bytes=None):
        return {"protocol": "agent-knowledge/1.0", "service": PEER}

    def get_json_sized(self, url: str, params=None, *, max_bytes=None):
        if "cursor" in params:
            seq = int(params["cursor"].split(".")[0]) + 1
        else:
            self.after_seqs.append(params["after_seq"])
            seq = int(params["after_seq"]) + 1
        page = {"result": [{"envelope": self.envelope, "accepted_at": 1, "seq": seq}], "service": PEER,
                "checkpoint": 2**50, "as_of": 1, "next_cursor": f"{seq}." + f"{seq:x}" * (4000 // len(f"{seq:x}"))}
        return page, 4200


def test_endless_pages_take_constant_memory_and_the_verified_part_is_kept() -> None:
    """Seen cursors once grew by 4 KiB a page (400 MB over 100,000 pages); and the pass saved nothing."""
    import tracemalloc

    from akrelay.federation.sync import SyncEngine, SyncOptions

    envelope = Author("looper").publish("On every page")
    feed = PageFeed(envelope)
    local = make_relay()
    state = FederationState()
    engine = SyncEngine(local, state, [peer(max_pages=3000)], SyncOptions(own_origin="https://local.example"),
                        transport_factory=lambda p: feed)
    tracemalloc.start()
    try:
        [r] = engine.run_once()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not r.ok and "exceeded 3000 pages" in r.error
    assert peak < 4 << 20, peak  # 3,000 remembered cursors alone would be 12 MB
    st = state.get(PEER)
    assert st.checkpoint == 0 and st.resume_seq == 3000 and local_ids(local) == [envelope["hash"]]
    [r] = engine.run_once(force=True)
    assert feed.after_seqs == ["0", "3000"]  # the next pass resumes after what was verified


def test_state_survives_reopening(router, new_state) -> None:
    fake, events = seeded(router, 3)
    state = new_state("federation")
    make_engine(make_relay(), [peer()], state).run_once()
    state.close()
    again = new_state("federation")
    st = again.get(PEER)
    assert st.checkpoint == 3 and st.counts["accepted"] == 3 and st.last_success and st.lag == 0


def test_a_hanging_peer_does_not_stall_the_others_in_the_loop(router) -> None:
    import threading
    import time

    slow, _ = seeded(router, 1)
    release = threading.Event()

    hung = []

    def hang(request: httpx.Request) -> httpx.Response:
        hung.append(request)
        release.wait(300)
        return httpx.Response(503)

    slow.query_route.side_effect = hang
    fast = FakePeer(router, "https://peer-b.example")
    first = Author("bob").publish("Fast one")
    fast.add(first)
    local = make_relay()
    engine = make_engine(local, [peer(interval=0.1), peer("https://peer-b.example", interval=0.1)])
    stop = threading.Event()
    loop = threading.Thread(target=SyncScheduler(engine, tick=0.05).run, args=(stop,))
    loop.start()
    try:
        deadline = time.monotonic() + 120
        while first["hash"] not in local_ids(local) and time.monotonic() < deadline:
            time.sleep(0.02)
        second = Author("bob").publish("Fast two")
        fast.add(second)
        while second["hash"] not in local_ids(local) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert local_ids(local) == [first["hash"], second["hash"]]
        assert len(hung) == 1 and not release.is_set()  # the slow peer is still hanging on its first page
    finally:
        release.set()
        stop.set()
        loop.join(10)
        engine.close()
    assert not loop.is_alive()


def test_an_unexpected_local_failure_is_recorded_and_other_peers_continue(router) -> None:
    fake, _ = seeded(router, 2)
    other = FakePeer(router, "https://peer-b.example")
    other.add(Author("bob").publish("Fine"))
    local = make_relay()
    real_submit = local.submit
    calls = []

    def flaky(raw, *, source="http"):
        calls.append(source)
        if len(calls) == 1:
            raise OSError("disk full")
        return real_submit(raw, source=source)

    local.submit = flaky
    state = FederationState()
    first, second = make_engine(local, [peer(), peer("https://peer-b.example")], state,
                                group_size=1).run_once()
    assert not first.ok and "disk full" in first.error and state.get(PEER).checkpoint == 0
    assert second.ok and second.accepted == 1 and set(calls) == {"sync"}
