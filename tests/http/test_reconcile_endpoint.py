"""``POST /v1/knowledge/reconcile`` over the real app (issue 26): answers, filters, every error path.

The oracle for answers is the protocol core itself: a reconciliation run through the
endpoint must teach the initiator exactly the set difference, as the in-memory one does.
"""

from __future__ import annotations

import hashlib
import random
from contextlib import contextmanager
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient
from relay_harness import ORIGIN, Clock, defaults, error_of

from akrelay.process.worker import create_app
from akrelay.federation.reconcile import MEDIA_TYPE, RECONCILE_PATH
from akrelay.protocol.reconcile import (FINGERPRINT, IDLIST, INFINITY, MAX_MESSAGE, PROTOCOL_VERSION, Reconciler,
                                        SortedItems, encode_varint)
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import Relay
from akrelay.store.memory import MemoryStore

OCTETS = {"content-type": MEDIA_TYPE}


@contextmanager
def served(items: list[tuple[int, bytes]] = (), **overrides: Any) -> Iterator[TestClient]:
    """The app with the sync component over a memory store whose index holds ``items``."""
    store = MemoryStore()
    store.recon.add(items)
    relay = Relay(store, RelayConfig(origin=ORIGIN), clock=Clock(1_790_000_000_000), cursor_secret=b"k" * 32)
    app = create_app(relay, defaults(**({"write_rate": 0.0, "read_rate": 0.0} | overrides)), components=("sync",))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def item(n: int, ts: int | None = None) -> tuple[int, bytes]:
    return (1_760_000_000_000 + (ts if ts is not None else n * 997), hashlib.sha256(n.to_bytes(8, "big")).digest())


def reconcile(client: TestClient, ours: list[tuple[int, bytes]], query: str = "") -> tuple[set[bytes], set[bytes], int]:
    initiator = Reconciler(SortedItems(ours))
    message: bytes | None = initiator.initiate()
    have: set[bytes] = set()
    need: set[bytes] = set()
    rounds = 0
    while message is not None:
        response = client.post(RECONCILE_PATH + query, content=message, headers=OCTETS)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == MEDIA_TYPE
        rounds += 1
        outcome = initiator.reconcile(response.content)
        have |= set(outcome.have)
        need |= set(outcome.need)
        message = outcome.message
    return have, need, rounds


def test_the_endpoint_teaches_exactly_the_differences() -> None:
    theirs = [item(n) for n in range(3000)]
    ours = theirs[5:] + [item(10_000 + n) for n in range(7)]
    with served(theirs) as client:
        have, need, rounds = reconcile(client, ours)
    assert need == {i for _, i in theirs[:5]}
    assert have == {item(10_000 + n)[1] for n in range(7)}
    assert rounds <= 4


def test_since_and_until_narrow_both_sides_to_the_same_window() -> None:
    theirs = [item(n, ts=n * 1000) for n in range(500)]
    window = [x for x in theirs if 1_760_000_100_000 <= x[0] < 1_760_000_200_000]
    ours = [x for x in window if x is not window[3]]
    with served(theirs) as client:
        have, need, _ = reconcile(client, ours, "?since=1760000100000&until=1760000200000")
    assert need == {window[3][1]} and have == set()


def rounds_and_largest(client: TestClient, ours: list[tuple[int, bytes]], query: str) -> tuple[int, int, set[bytes]]:
    """Rounds, the largest answer, and what the initiator learned it has, against ``query``."""
    initiator = Reconciler(SortedItems(ours))
    message: bytes | None = initiator.initiate()
    rounds = largest = 0
    have: set[bytes] = set()
    while message is not None:
        response = client.post(RECONCILE_PATH + query, content=message, headers=OCTETS)
        assert response.status_code == 200, response.text
        largest = max(largest, len(response.content))
        rounds += 1
        outcome = initiator.reconcile(response.content)
        have |= set(outcome.have)
        message = outcome.message
    return rounds, largest, have


def test_an_initiator_may_ask_for_larger_answers() -> None:
    """``?frame_limit=`` bounds every answer by that many bytes instead of 60,000: fewer rounds when differences
    are many, the same differences learned."""
    common = [item(n) for n in range(40_000)]
    dropped = set(random.Random(3).sample(range(40_000), 1_500))
    theirs = [x for n, x in enumerate(common) if n not in dropped]
    ours = common  # we have what they lack: their answers list the ids around each difference
    expected = {common[n][1] for n in dropped}
    with served(theirs) as client:
        small = rounds_and_largest(client, ours, "?frame_limit=4096")
        default = rounds_and_largest(client, ours, "")
        large = rounds_and_largest(client, ours, "?frame_limit=262144")
    assert small[2] == default[2] == large[2] == expected
    assert small[1] <= 4096 and default[1] <= 60_000 < large[1] <= 262_144
    assert small[0] > default[0] > large[0]


def test_discovery_advertises_the_endpoint_unless_disabled() -> None:
    with served() as client:
        doc = client.get("/.well-known/agent-knowledge").json()
    assert doc["reconcile"]["endpoint"] == ORIGIN + RECONCILE_PATH
    assert doc["reconcile"]["protocol"] == "negentropy-v1"
    assert (doc["reconcile"]["frame_limit"], doc["reconcile"]["max_frame_limit"]) == (60_000, MAX_MESSAGE)
    with served(no_reconcile=True) as client:
        doc = client.get("/.well-known/agent-knowledge").json()
        response = client.post(RECONCILE_PATH, content=bytes([PROTOCOL_VERSION]), headers=OCTETS)
    assert "reconcile" not in doc
    assert error_of(response) == (404, "not_found")


def _bad_messages() -> list[tuple[str, bytes]]:
    rng = random.Random(26)
    return [
        ("empty", b""),
        ("not a version byte", b"\x00\x01\x02"),
        ("truncated bound", bytes([PROTOCOL_VERSION, 0x85])),
        ("truncated fingerprint", bytes([PROTOCOL_VERSION]) + encode_varint(0) + encode_varint(0)
         + encode_varint(FINGERPRINT) + b"\x01\x02"),
        ("unknown mode", bytes([PROTOCOL_VERSION]) + encode_varint(0) + encode_varint(0) + encode_varint(7)),
        ("id list longer than the message", bytes([PROTOCOL_VERSION]) + encode_varint(0) + encode_varint(0)
         + encode_varint(IDLIST) + encode_varint(1_000_000)),
        ("varint past 64 bits", bytes([PROTOCOL_VERSION]) + b"\xff" * 12),
        ("prefix longer than an id", bytes([PROTOCOL_VERSION]) + encode_varint(5) + encode_varint(40) + b"\0" * 40),
        ("bounds going backwards", bytes([PROTOCOL_VERSION]) + encode_varint(10) + encode_varint(0)
         + encode_varint(0) + encode_varint(1) + encode_varint(0) + encode_varint(0)),
        ("random", bytes([PROTOCOL_VERSION]) + rng.randbytes(300)),
    ]


@pytest.mark.parametrize(("why", "body"), _bad_messages(), ids=[w for w, _ in _bad_messages()])
def test_a_malformed_message_is_invalid_request(why: str, body: bytes) -> None:
    with served([item(n) for n in range(100)]) as client:
        response = client.post(RECONCILE_PATH, content=body, headers=OCTETS)
    assert error_of(response) == (400, "invalid_request"), why


def test_random_messages_never_cause_a_server_error() -> None:
    rng = random.Random(7)
    with served([item(n) for n in range(300)]) as client:
        for _ in range(200):
            body = bytes([PROTOCOL_VERSION]) + rng.randbytes(rng.randrange(0, 200))
            response = client.post(RECONCILE_PATH, content=body, headers=OCTETS)
            assert response.status_code in (200, 400), (response.status_code, body.hex())


@pytest.mark.parametrize(("query", "why"), [
    ("?since=abc", "not an integer"), ("?until=-1", "negative"), ("?since=9007199254740992", "beyond 2^53"),
    ("?since=5&until=5", "empty window"), ("?kinds=claim", "unknown parameter"), ("?since=1&since=2", "twice"),
    ("?frame_limit=4095", "a frame below negentropy's least"), ("?frame_limit=262145", "a frame above max_message"),
    ("?frame_limit=", "an empty frame limit"), ("?frame_limit=6e4", "not an integer frame limit"),
    ("?frame_limit=%EF%BC%95%EF%BC%90%EF%BC%90%EF%BC%90%EF%BC%90", "non-ASCII digits"),
    ("?frame_limit=8000&frame_limit=9000", "frame_limit twice"),
])
def test_a_bad_filter_is_invalid_request(query: str, why: str) -> None:
    with served() as client:
        response = client.post(RECONCILE_PATH + query, content=Reconciler(SortedItems([])).initiate(), headers=OCTETS)
    assert error_of(response) == (400, "invalid_request"), why


def test_the_content_type_must_be_octet_stream() -> None:
    with served() as client:
        response = client.post(RECONCILE_PATH, content=b"\x61", headers={"content-type": "application/json"})
        missing = client.post(RECONCILE_PATH, content=b"\x61")
    assert error_of(response) == (400, "invalid_request")
    assert error_of(missing) == (400, "invalid_request")


def test_a_body_over_the_limit_is_refused_before_it_is_parsed() -> None:
    with served(max_envelope_bytes=MAX_MESSAGE * 2) as client:
        response = client.post(RECONCILE_PATH, content=bytes([PROTOCOL_VERSION]) + b"\0" * MAX_MESSAGE,
                               headers=OCTETS)
    assert error_of(response) == (400, "invalid_request")
    with served(max_envelope_bytes=4096) as client:
        response = client.post(RECONCILE_PATH, content=bytes([PROTOCOL_VERSION]) + b"\0" * 5000, headers=OCTETS)
    assert error_of(response) == (413, "payload_too_large")


def many_forged_ranges() -> bytes:
    """4,000 ranges, each a fingerprint that cannot match: every one makes the responder look."""
    parts = [bytes([PROTOCOL_VERSION])]
    for k in range(1, 4000):
        parts.append(encode_varint(997 * 37 if k > 1 else 1_760_000_000_000 + 1) + encode_varint(0)
                     + encode_varint(FINGERPRINT) + b"\x07" * 16)
    parts.append(encode_varint(0) + encode_varint(0) + encode_varint(FINGERPRINT) + b"\x07" * 16)
    return b"".join(parts)


def test_a_message_that_would_read_too_much_is_refused_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """No amplification: 4,096 fingerprint ranges over a large set cost a bounded read, then 400
    (from the store's aggregates: here no copy of the set is kept)."""
    import akrelay.federation.reconcile as module

    monkeypatch.setattr(module, "DEFAULT_BUDGET", 2000)
    theirs = [item(n) for n in range(5000)]
    with served(theirs, reconcile_copy_max=0) as client:
        response = client.post(RECONCILE_PATH, content=many_forged_ranges(), headers=OCTETS)
    status, code = error_of(response)
    assert (status, code) == (400, "invalid_request")
    assert "index rows" in response.json()["error"]["message"]


def test_the_kept_copy_answers_the_same_message_within_its_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the kept copy in memory no row is read: the message costs its own ranges, and the answer
    is the one the store's aggregates give with no budget (a frame at most)."""
    import akrelay.federation.reconcile as module
    from akrelay.components.sync import SyncComponent

    theirs = [item(n) for n in range(5000)]
    kept: list[object] = []
    real_start = SyncComponent.start

    def start(self: SyncComponent) -> None:
        real_start(self)
        kept.append(self.kept)

    monkeypatch.setattr(SyncComponent, "start", start)
    message = many_forged_ranges()
    with served(theirs) as client:
        copy = kept[0]
        assert copy is not None and copy.refresh(60)  # type: ignore[attr-defined]
        answered = copy.answered  # type: ignore[attr-defined]
        response = client.post(RECONCILE_PATH, content=message, headers=OCTETS)
        assert copy.answered == answered + 1  # type: ignore[attr-defined]
    assert response.status_code == 200 and len(response.content) <= module.DEFAULT_FRAME_LIMIT
    store = MemoryStore()
    store.recon.add(theirs)
    assert response.content == module.respond(store.recon, message, budget=10**9)


def test_an_initiator_infinity_only_message_is_answered() -> None:
    with served([item(n) for n in range(10)]) as client:
        empty = bytes([PROTOCOL_VERSION]) + encode_varint(0) + encode_varint(0) + encode_varint(IDLIST) + encode_varint(0)
        response = client.post(RECONCILE_PATH, content=empty, headers=OCTETS)
    assert response.status_code == 200 and response.content[0] == PROTOCOL_VERSION
    assert INFINITY.timestamp > 0


def test_the_endpoint_is_rate_limited_as_a_read() -> None:
    message = Reconciler(SortedItems([])).initiate()
    with served(read_rate=0.001, read_burst=2) as client:
        codes = [client.post(RECONCILE_PATH, content=message, headers=OCTETS).status_code for _ in range(3)]
        last = client.post(RECONCILE_PATH, content=message, headers=OCTETS)
    assert codes[:2] == [200, 200]
    assert error_of(last) == (429, "rate_limited")


# ---- offers and the type filter (issue 26) ---------------------------------------------------

def test_discovery_invites_offers_unless_disabled() -> None:
    with served() as client:
        doc = client.get("/.well-known/agent-knowledge").json()
    assert doc["reconcile"]["accepts_offers"] is True
    assert doc["reconcile"]["filters"] == ["since", "until", "type"]
    assert doc["endpoints"]["events"] == ORIGIN + "/v1/knowledge/events"
    with served(no_accept_offers=True) as client:
        doc = client.get("/.well-known/agent-knowledge").json()
    assert "accepts_offers" not in doc["reconcile"]


@contextmanager
def served_events(envelopes: list[dict], **overrides: Any) -> Iterator[TestClient]:
    """The app over a memory store holding real, accepted ``envelopes`` (the type filter reads records)."""
    import json

    from federation.conftest import make_relay

    relay = make_relay(ORIGIN)
    for env in envelopes:
        relay.submit(json.dumps(env).encode())
    app = create_app(relay, defaults(**({"write_rate": 0.0, "read_rate": 0.0} | overrides)), components=("sync",))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _typed_events() -> tuple[list[dict], list[dict]]:
    from federation.conftest import Author

    author = Author("typed")
    pubs = [author.publish(f"P {i}") for i in range(8)]
    return pubs, [author.assess(p) for p in pubs[:5]]


def _items(envelopes: list[dict]) -> list[tuple[int, bytes]]:
    from akrelay.store.base import event_hash_bytes

    return [(e["event"]["created_at"], event_hash_bytes(e["hash"])) for e in envelopes]


def test_a_type_filter_narrows_the_responder_to_that_type() -> None:
    pubs, assessments = _typed_events()
    with served_events(pubs + assessments) as client:
        # we hold two of the assessments: the filtered set teaches exactly the other three, no publication
        have, need, _ = reconcile(client, _items(assessments[:2]), "?type=knowledge.assess")
        both, need_both, _ = reconcile(client, _items(pubs), "?type=knowledge.assess,knowledge.publish")
    assert need == {i for _, i in _items(assessments[2:])} and have == set()
    assert need_both == {i for _, i in _items(assessments)} and both == set()


def test_a_type_filter_with_a_window() -> None:
    pubs, assessments = _typed_events()
    since = assessments[1]["event"]["created_at"]
    with served_events(pubs + assessments) as client:
        have, need, _ = reconcile(client, [], f"?type=knowledge.assess&since={since}")
    assert need == {i for _, i in _items(assessments[1:])}


@pytest.mark.parametrize(("query", "why"), [
    ("?type=", "empty"), ("?type=claim", "not an event type"), ("?type=knowledge.publish,", "trailing comma"),
    ("?type=knowledge.publish,knowledge.publish", "listed twice"), ("?type=a&type=b", "given twice"),
    ("?type=" + "knowledge.publish," * 200, "too long"), ("?type=KNOWLEDGE.PUBLISH", "case"),
    ("?type=knowledge.publish%00", "NUL"), ("?since=%D9%A3", "non-ASCII digit"),
])
def test_a_bad_type_filter_is_invalid_request(query: str, why: str) -> None:
    with served() as client:
        response = client.post(RECONCILE_PATH + query, content=Reconciler(SortedItems([])).initiate(), headers=OCTETS)
    assert error_of(response) == (400, "invalid_request"), why


def test_a_type_filtered_set_beyond_the_budget_is_refused_not_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The type filter has no precomputed aggregate: at most MAX_FILTERED records are read, then 400."""
    import akrelay.federation.reconcile as module

    pubs, assessments = _typed_events()
    reads: list[int] = []
    with served_events(pubs + assessments) as client:
        monkeypatch.setattr(module, "MAX_FILTERED", 4)
        from akrelay.store.memory import MemoryStore

        original = MemoryStore.query

        def counted(self, *args: Any, **kwargs: Any):
            page = original(self, *args, **kwargs)
            reads.append(len(page))
            return page

        monkeypatch.setattr(MemoryStore, "query", counted)
        response = client.post(RECONCILE_PATH + "?type=knowledge.publish", content=Reconciler(SortedItems([])).initiate(),
                               headers=OCTETS)
        refused_reads = sum(reads)
        narrow = client.post(RECONCILE_PATH + f"?type=knowledge.publish&since={pubs[5]['event']['created_at']}",
                             content=Reconciler(SortedItems([])).initiate(), headers=OCTETS)
    assert error_of(response) == (400, "invalid_request")
    assert "narrow since/until" in response.json()["error"]["message"]
    assert 0 < refused_reads <= 5  # at most MAX_FILTERED + 1 records were read, not the whole log
    assert narrow.status_code == 200
