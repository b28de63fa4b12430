"""Every error code the service produces, cursor tampering and withheld behaviour."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from akrelay.protocol.discovery import validate_discovery
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.limits import Limits
from akrelay.protocol.options import ValidationOptions
from akrelay.protocol.signer import Signer, retract_event
from akrelay.relay.config import RelayConfig
from akrelay.relay.core import PendingCheck, Relay, open_relay
from akrelay.store.memory import MemoryStore
from relay.support import FIXTURES, NOW, SERVICE, VECTORS, Clock, hash_of, raw, signed, state

TEXT = ["text_publication", "text_regional", "text_assessment", "text_retraction"]


def _code(fn: Any, *args: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(*args)
    return info.value


def _load(relay: Relay, names: list[str] = TEXT) -> None:
    for name in names:
        relay.submit(raw(name))


# -- submission errors ------------------------------------------------------------
def test_size_limit_is_checked_on_raw_bytes_first(make_relay: Any) -> None:
    relay = make_relay(max_envelope_bytes=1000)
    err = _code(relay.submit, b"\xff" * 1001)  # not even UTF-8: the size rule still wins
    assert err.code == "payload_too_large" and err.http_status == 413
    assert err.data == {"limit": "max_envelope_bytes", "max": 1000, "actual": 1001}
    big = raw("original")
    assert len(big) > 1000
    assert _code(relay.submit, big).code == "payload_too_large"
    assert state(relay) == (0, [])
    assert relay.discovery()["limits"]["max_envelope_bytes"] == 1000


def test_service_limits_refuse_valid_envelopes_as_payload_too_large(make_relay: Any) -> None:
    relay = make_relay(limits=Limits(max_title_chars=3))
    err = _code(relay.submit, raw("original"))
    assert err.code == "payload_too_large" and err.data["limit"] == "max_title_chars"
    assert state(relay) == (0, [])


@pytest.mark.parametrize(
    "body",
    [b"", b"\xff\xfe{}", b"not json", b"[]", b'{"hash":1}', "{}".encode("utf-16"), b'{"a":1,"a":1}'],
    ids=["empty", "non-utf8", "not-json", "array", "bad-shape", "utf16", "duplicate-member"],
)
def test_malformed_bodies_are_invalid_event(relay: Relay, body: bytes) -> None:
    err = _code(relay.submit, body)
    assert err.code == "invalid_event"
    assert state(relay) == (0, [])


def test_non_bytes_submission_is_invalid_event(relay: Relay) -> None:
    assert _code(relay.submit, "{}").code == "invalid_event"


def test_tampered_hash_and_signature(relay: Relay) -> None:
    env = signed("original")
    env["event"]["payload"]["title"] += "!"
    assert _code(relay.submit, json.dumps(env).encode()).code == "invalid_event_hash"
    env = signed("original")
    env["signature"] = "A" * 86
    assert _code(relay.submit, json.dumps(env).encode()).code == "invalid_signature"
    assert state(relay) == (0, [])


def test_future_event_is_timestamp_out_of_window_until_the_clock_catches_up(make_relay: Any) -> None:
    clock = Clock(NOW)
    relay = make_relay(clock)
    assert _code(relay.submit, raw("future")).code == "timestamp_out_of_window"
    clock.now = NOW + 1
    record, created = relay.submit(raw("future"))
    assert created and record.accepted_at == NOW + 1


def test_missing_dependency_lists_distinct_ids_sorted(relay: Relay) -> None:
    err = _code(relay.submit, raw("merge"))
    targets = {r["target"] for r in FIXTURES["merge"]["envelope"]["event"]["payload"]["relations"]}
    assert err.code == "missing_dependency" and err.http_status == 409
    assert err.data == {"missing": sorted(targets)}
    assert state(relay) == (0, [])


def test_invalid_target(relay: Relay) -> None:
    _load(relay, ["original"])
    err = _code(relay.submit, raw("cross_author_supersedes"))
    assert err.code == "invalid_target"
    assert relay.checkpoint() == 1


def test_licence_allow_list_gives_permission_denied(make_relay: Any) -> None:
    relay = make_relay(licence_allowlist=frozenset({"https://example.com/only-this"}))
    err = _code(relay.submit, raw("original"))
    assert err.code == "permission_denied" and err.http_status == 403
    assert state(relay) == (0, [])
    ok = make_relay(licence_allowlist={"https://creativecommons.org/licenses/by/4.0/"})
    assert ok.submit(raw("original"))[1] is True


def test_allow_list_admits_a_legacy_retraction_without_licence(make_relay: Any) -> None:
    relay = make_relay(licence_allowlist=frozenset({"https://creativecommons.org/licenses/by/4.0/"}))
    relay.submit(raw("original"))
    original = FIXTURES["original"]["envelope"]["event"]
    signer = Signer.from_seed(bytes.fromhex(VECTORS["seeds"]["publisher"]))
    assert signer.agent_id == original["actor"]
    legacy = signer.sign(retract_event(signer.agent_id, NOW, original["nonce"] + 1000, {"target": hash_of("original"), "reason": "withdrawn"}))
    record, created = relay.submit(json.dumps(legacy).encode())
    assert created and "license" not in record.envelope.payload
    strict = make_relay(options=ValidationOptions(allow_legacy_retract=False))
    strict.submit(raw("original"))
    assert _code(strict.submit, json.dumps(legacy).encode()).code == "invalid_event"


# -- resubmission and withholding ---------------------------------------------------
def test_resubmission_returns_the_original_record_even_when_withheld(make_relay: Any) -> None:
    clock = Clock()
    relay = make_relay(clock)
    first, _ = relay.submit(raw("original"))
    relay.withhold(hash_of("original"))
    clock.now += 10**9  # the clock moved on
    snapshot = state(relay)
    again, created = relay.submit(raw("original"))
    assert created is False
    assert (again.seq, again.accepted_at) == (first.seq, first.accepted_at)
    assert again.envelope.canonical_bytes() == first.envelope.canonical_bytes()
    assert state(relay) == snapshot
    assert _code(relay.get, hash_of("original")).code == "not_found"  # visibility not restored


def _check_then_commit(relay: Relay, body: bytes, expect_new: bool) -> tuple[Any, bool]:
    """What the HTTP ingest path does: check, then commit what was admitted."""
    existing, env, now = relay.check(body, expect_new=expect_new)
    if existing is not None:
        return existing, False
    return relay.commit_admitted([(env, now)])[0]


@pytest.mark.parametrize("expect_new", [False, True])
def test_step_two_gives_the_retained_record_whether_asked_first_or_last(make_relay: Any, expect_new: bool) -> None:
    """``expect_new`` moves the step-2 lookup after steps 3–6; the answers must not change."""
    clock = Clock()
    relay = make_relay(clock)
    first, _ = relay.submit(raw("original"))
    merge_parts = [relay.submit(raw(name))[0] for name in ("branch_left", "branch_right")]
    merged, _ = relay.submit(raw("merge"))
    snapshot = state(relay)
    # 1. Plain resubmission: same record, nothing changes.
    again, created = _check_then_commit(relay, raw("original"), expect_new)
    assert created is False and (again.seq, again.accepted_at) == (first.seq, first.accepted_at)
    # 2. Withheld: still the retained record.
    relay.withhold(hash_of("original"))
    snapshot = state(relay)
    again, created = _check_then_commit(relay, raw("original"), expect_new)
    assert created is False and again.withheld and again.seq == first.seq
    assert state(relay) == snapshot
    relay.unwithhold(hash_of("original"))
    # 3. Step 4 would now refuse it (the service clock went back past the skew window).
    clock.now = FIXTURES["original"]["envelope"]["event"]["created_at"] - 10**6
    again, created = _check_then_commit(relay, raw("original"), expect_new)
    assert created is False and again.seq == first.seq
    clock.now = NOW
    # 4. Step 5 would now refuse it (a target was pruned by retention).
    assert relay.store.remove(merge_parts[0].envelope.id)
    snapshot = state(relay)
    again, created = _check_then_commit(relay, raw("merge"), expect_new)
    assert created is False and (again.seq, again.accepted_at) == (merged.seq, merged.accepted_at)
    assert state(relay) == snapshot
    # 5. A new envelope that fails a step is still refused, and changes nothing.
    assert _code(relay.check, raw("cross_author_supersedes")).code == "invalid_target"
    with pytest.raises(ProtocolError) as info:
        relay.check(raw("cross_author_supersedes"), expect_new=expect_new)
    assert info.value.code == "invalid_target"
    assert state(relay) == snapshot


class _NoLookups:
    """A store that fails any record lookup: what :meth:`Relay.check_local` must never make."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name in ("get", "get_many", "iter_records", "query"):
            raise AssertionError(f"check_local read the store ({name})")
        return getattr(self._store, name)


def _local(relay: Relay, body: bytes) -> Any:
    store, relay.store = relay.store, _NoLookups(relay.store)
    try:
        return relay.check_local(body)
    finally:
        relay.store = store


def test_check_local_defers_exactly_the_store_lookups_to_finish_check(make_relay: Any) -> None:
    """The ingest path runs ``check_local`` on the event loop: it must never ask the store, and
    ``finish_check`` must give what ``check(expect_new=True)`` gives."""
    clock = Clock()
    relay = make_relay(clock)
    # No targets, every step passes: admitted without a lookup.
    existing, envelope, accepted_at = _local(relay, raw("original"))
    assert existing is None and envelope.id == hash_of("original") and accepted_at == NOW
    relay.commit_admitted([(envelope, accepted_at)])
    # Targets: step 5 (and 6) are left to finish_check, which resolves them.
    pending = _local(relay, raw("branch_left"))
    assert isinstance(pending, PendingCheck) and pending.refusal is None
    assert relay.finish_check(pending)[0] is None
    missing = _local(relay, raw("merge"))  # branch_right is not retained
    assert isinstance(missing, PendingCheck) and missing.refusal is None
    assert _code(relay.finish_check, missing).code == "missing_dependency"
    # A refusal before step 5: step 2 decides, in finish_check.
    clock.now = FIXTURES["original"]["envelope"]["event"]["created_at"] - 10**6
    refused = _local(relay, raw("original"))
    assert isinstance(refused, PendingCheck) and refused.refusal is not None
    again, _, _ = relay.finish_check(refused)  # retained: the record, not the refusal
    assert again is not None and again.seq == 1
    fresh = _local(relay, raw("text_publication"))
    assert isinstance(fresh, PendingCheck) and fresh.refusal is not None
    assert _code(relay.finish_check, fresh).code == fresh.refusal.code
    # Step 1 refuses at once: nothing to look up.
    assert _code(relay.check_local, b"not json").code == "invalid_event"
    assert state(relay)[0] == 1


def test_withheld_event_in_lookup_query_and_batch(relay: Relay) -> None:
    _load(relay)
    hidden = hash_of("text_regional")
    relay.withhold(hidden)
    assert _code(relay.get, hidden).code == "not_found"
    assert hidden not in [r.envelope.id for r in relay.query([]).records]
    assert hidden not in [r.envelope.id for r in relay.query([("q", "alpha")]).records]
    page = relay.batch(json.dumps({"hashes": [hidden, hash_of("text_publication")]}).encode())
    assert page.missing == [hidden] and [r.envelope.id for r in page.records] == [hash_of("text_publication")]
    # dependency resolution still sees it
    record = relay.unwithhold(hidden)
    assert record.seq == 2 and relay.get(hidden).seq == 2
    assert [r.seq for r in relay.query([]).records] == [1, 2, 3, 4]


def test_lookup_errors(relay: Relay) -> None:
    _load(relay, ["original"])
    assert relay.get(hash_of("original")).seq == 1
    for bad in ("abc", "A" * 42 + "B", "", "https://example.com/x", "A" * 44, "A" * 42 + "=", 7):
        err = _code(relay.get, bad)
        assert err.code == "invalid_request", bad
    err = _code(relay.get, "A" * 43)
    assert err.code == "not_found" and err.http_status == 404


def test_withhold_errors(relay: Relay) -> None:
    assert _code(relay.withhold, "A" * 43).code == "not_found"
    assert _code(relay.unwithhold, "nope").code == "invalid_request"


# -- query errors and cursor tampering -------------------------------------------------
def test_query_parameter_errors(relay: Relay) -> None:
    _load(relay)
    for params in ([("bogus", "1")], [("type", "x")], [("limit", "0")], [("after_seq", "-1")], [("limit", "1"), ("limit", "1")]):
        assert _code(relay.query, params).code == "invalid_request", params
    err = _code(relay.query, [("after_seq", "5")])
    assert err.code == "invalid_request" and err.data == {"checkpoint": 4}
    assert relay.query([("after_seq", "4")]).records == []


def _first_page(relay: Relay, params: list[tuple[str, str]]) -> str:
    page = relay.query(params)
    assert page.next_cursor is not None
    return page.next_cursor


@pytest.mark.parametrize(
    "tamper",
    ["forged", "truncated", "flipped", "other-q", "other-limit", "other-after-seq", "added-filter", "other-secret"],
)
def test_cursor_tampering_is_invalid_cursor(make_relay: Any, tamper: str) -> None:
    relay = make_relay()
    _load(relay)
    params = [("q", "alpha"), ("limit", "1")]
    cursor = _first_page(relay, params)
    if tamper == "forged":
        cursor = base64.urlsafe_b64encode(bytes(len(base64.urlsafe_b64decode(cursor + "==")))).rstrip(b"=").decode()
    elif tamper == "truncated":
        cursor = cursor[:-2]
    elif tamper == "flipped":
        cursor = cursor[:5] + ("A" if cursor[5] != "A" else "B") + cursor[6:]
    elif tamper == "other-q":
        params = [("q", "beta"), ("limit", "1")]
    elif tamper == "other-limit":
        params = [("q", "alpha"), ("limit", "2")]
    elif tamper == "other-after-seq":
        params = [("q", "alpha"), ("limit", "1"), ("after_seq", "1")]
    elif tamper == "added-filter":
        params = params + [("type", "knowledge.publish")]
    elif tamper == "other-secret":
        other = Relay(relay.store, relay.config, clock=relay.clock, cursor_secret=b"another-relay-secret-0123456789")
        assert _code(other.query, params + [("cursor", cursor)]).code == "invalid_cursor"
        return
    err = _code(relay.query, params + [("cursor", cursor)])
    assert err.code == "invalid_cursor" and err.http_status == 400


def test_cursor_reused_after_new_acceptances_keeps_its_snapshot(make_relay: Any) -> None:
    clock = Clock()
    relay = make_relay(clock)
    _load(relay, TEXT[:2])
    params = [("limit", "1")]
    first = relay.query(params)
    clock.now += 5000
    _load(relay, TEXT[2:])
    for _ in range(2):  # stateless: the same cursor gives the same page every time
        page = relay.query(params + [("cursor", first.next_cursor)])
        assert [r.seq for r in page.records] == [2]
        assert (page.checkpoint, page.as_of, page.next_cursor) == (2, first.as_of, None)
    fresh = relay.query([("after_seq", "2")])
    assert [r.seq for r in fresh.records] == [3, 4] and fresh.checkpoint == 4


def test_cursor_from_a_later_service_state_is_rejected(make_relay: Any) -> None:
    relay = make_relay()
    _load(relay)
    cursor = _first_page(relay, [("limit", "1")])
    reset = Relay(MemoryStore(), relay.config, clock=relay.clock, cursor_secret=b"service-tests-cursor-secret-0001")
    _load(reset, TEXT[:1])
    assert _code(reset.query, [("limit", "1"), ("cursor", cursor)]).code == "invalid_cursor"


def test_records_withheld_during_pagination_are_skipped_and_nothing_else_lost(relay: Relay) -> None:
    _load(relay)
    page = relay.query([("limit", "1")])
    relay.withhold(hash_of("text_assessment"))
    seen = [r.seq for r in page.records]
    while page.next_cursor:
        page = relay.query([("limit", "1"), ("cursor", page.next_cursor)])
        seen += [r.seq for r in page.records]
    assert seen == [1, 2, 4]


# -- batch errors ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [b"\xff", b"", b"[]", b'{"hashes": []}', b'{"hashes": ["x"]}', b'{"hashes": 1}', b'{"hashes": [], "x": 1}'],
    ids=["non-utf8", "empty", "array", "no-ids", "malformed-id", "not-array", "unknown-member"],
)
def test_batch_errors_are_invalid_request(relay: Relay, body: bytes) -> None:
    assert _code(relay.batch, body).code == "invalid_request"


def test_batch_of_101_is_invalid_request(relay: Relay) -> None:
    ids = [base64.urlsafe_b64encode(bytes([i]) * 32).rstrip(b"=").decode() for i in range(101)]
    assert _code(relay.batch, json.dumps({"hashes": ids}).encode()).code == "invalid_request"


# -- discovery and persistence -----------------------------------------------------------
def test_discovery_is_valid_and_complete(make_relay: Any) -> None:
    relay = make_relay(peers=("https://peer.example", SERVICE))
    doc = json.loads(relay.discovery_json())
    assert doc == relay.discovery()
    validate_discovery(doc, SERVICE)
    assert doc["service"] == SERVICE and doc["peers"] == ["https://peer.example"]
    assert set(doc["endpoints"]) == {"events", "query", "batch"}
    assert "features" not in doc and "search_modes" not in doc
    assert doc["limits"]["max_envelope_bytes"] == 262144


def test_open_relay_keeps_cursor_secret_and_records(tmp_path: Path) -> None:
    clock = Clock()
    relay = open_relay(tmp_path / "data", RelayConfig(origin=SERVICE), clock=clock)
    _load(relay)
    cursor = relay.query([("limit", "1")]).next_cursor
    relay.close()
    relay = open_relay(tmp_path / "data", RelayConfig(origin=SERVICE), clock=clock)
    page = relay.query([("limit", "1"), ("cursor", cursor)])
    assert [r.seq for r in page.records] == [2]
    relay.close()


def test_record_and_page_json_are_the_dict_forms(relay: Relay) -> None:
    _load(relay)
    record = relay.get(hash_of("text_publication"))
    assert json.loads(record.to_json()) == record.to_dict()
    assert record.to_dict()["envelope"] == FIXTURES["text_publication"]["envelope"]
    page = relay.query([("limit", "2")])
    assert json.loads(page.to_json()) == page.to_dict()
    batch = relay.batch(json.dumps({"hashes": [hash_of("text_retraction")]}).encode())
    assert json.loads(batch.to_json()) == batch.to_dict()
