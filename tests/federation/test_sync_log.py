"""A sync pass verifies the peer's signed Merkle log (issue 23): forks, rewrites and missing records.

The fake peer is a real relay on a memory store (its log is the store's) whose
checkpoint, /log and consistency proof are served over respx by the same
:class:`TransparencyLog` the relay uses; each test makes one thing lie.
"""

from __future__ import annotations

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from akrelay.federation.peers import Peer
from akrelay.federation.state import FederationState
from akrelay.protocol.note import parse_note, sign_note
from akrelay.relay.transparency import TransparencyLog

from .conftest import Author, FakePeer, local_ids, make_engine, make_relay


class LogPeer(FakePeer):
    def __init__(self, router, key: Ed25519PrivateKey, origin: str = "https://peer-a.example") -> None:  # noqa: ANN001
        super().__init__(router, origin)
        self.now = [1_800_000_000.0]

        def clock() -> float:
            self.now[0] += 2.0
            return self.now[0]

        self.tlog = TransparencyLog(self.relay.store, origin, key, clock=clock)
        self.checkpoint_hook = None
        router.get(origin + "/v1/knowledge/checkpoint").mock(side_effect=self._checkpoint)
        router.get(origin + "/v1/knowledge/log").mock(
            side_effect=lambda r: httpx.Response(200, json=self.tlog.entries(dict(r.url.params))))
        router.get(origin + "/v1/knowledge/proof/consistency").mock(
            side_effect=lambda r: httpx.Response(200, json=self.tlog.consistency(dict(r.url.params))))

    def _checkpoint(self, request: httpx.Request) -> httpx.Response:
        self.tlog.tick(force=True)
        text = self.tlog.checkpoint_text()
        if self.checkpoint_hook is not None:
            text = self.checkpoint_hook(text)
        return httpx.Response(200, text=text)


def setup(router, **peer_kw):  # noqa: ANN001, ANN201
    key = Ed25519PrivateKey.generate()
    fake = LogPeer(router, key)
    peer = Peer(origin=fake.origin, allow_private=True, log_key=fake.tlog.vkey, **peer_kw)
    local = make_relay()
    state = FederationState()
    return fake, peer, local, state, make_engine(local, [peer], state)


def test_an_honest_peer_verifies_pass_after_pass(router) -> None:  # noqa: ANN001
    fake, peer, local, state, engine = setup(router, page_limit=3)
    alice = Author("alice")
    events = [alice.publish(f"r{i}") for i in range(7)]
    fake.add(*events)
    [result] = engine.run_once()
    assert result.ok, result.error
    st = state.get(peer.origin)
    assert st.misbehaving is None and st.log_note.split("\n")[1] == "7" and st.checkpoint == 7
    fake.add(*[alice.publish(f"s{i}") for i in range(4)])
    fake.relay.store.set_withheld(events[1]["hash"], True)
    [result] = engine.run_once()
    assert result.ok, result.error
    assert state.get(peer.origin).log_note.split("\n")[1] == "11"
    assert len(local_ids(local)) == 11


def test_a_fork_marks_the_peer_misbehaving_keeps_evidence_and_stops_pulling(router) -> None:  # noqa: ANN001
    fake, peer, local, state, engine = setup(router)
    alice = Author("alice")
    fake.add(*[alice.publish(f"r{i}") for i in range(5)])
    assert engine.run_once()[0].ok
    first_note = state.get(peer.origin).log_note
    # the peer now shows another history of the same key: rebuilt from other records
    other = make_relay("https://peer-a.example")
    bob = Author("bob")
    for env in [bob.publish(f"x{i}") for i in range(8)]:
        other.submit(__import__("json").dumps(env).encode())
    forked = TransparencyLog(other.store, fake.origin, fake.tlog.key, clock=fake.tlog.clock)
    fake.tlog = forked
    fake.relay = other
    [result] = engine.run_once()
    assert not result.ok and "misbehaving" in (result.error or "")
    st = state.get(peer.origin)
    assert st.misbehaving and ("fork" in st.misbehaving or "rewrite" in st.misbehaving)
    assert st.evidence["old"] == first_note and st.evidence["new"].split("\n")[1] == "8"
    assert "consistency_proof" in st.evidence
    before = len(fake.query_calls)
    [again] = engine.run_once()
    assert again.skipped and "misbehaving" in again.error and len(fake.query_calls) == before


def test_a_record_hidden_from_query_is_a_missing_record(router) -> None:  # noqa: ANN001
    fake, peer, local, state, engine = setup(router)
    alice = Author("alice")
    events = [alice.publish(f"r{i}") for i in range(6)]
    fake.add(*events)

    def hide(body, _calls):  # noqa: ANN001, ANN202
        body["result"] = [r for r in body["result"] if r["envelope"]["hash"] != events[3]["hash"]]
        return httpx.Response(200, json=body)

    fake.page_hook = hide
    [result] = engine.run_once()
    assert not result.ok
    st = state.get(peer.origin)
    assert "missing" in st.misbehaving and "seq 4" in st.misbehaving and st.evidence["index"] == 3


def test_a_record_that_is_not_its_log_entry_is_a_rewrite(router) -> None:  # noqa: ANN001
    fake, peer, local, state, engine = setup(router)
    alice = Author("alice")
    fake.add(*[alice.publish(f"r{i}") for i in range(4)])

    def swap(body, _calls):  # noqa: ANN001, ANN202
        a, b = body["result"][1], body["result"][2]
        a["seq"], b["seq"] = b["seq"], a["seq"]
        body["result"][1], body["result"][2] = b, a
        return httpx.Response(200, json=body)

    fake.page_hook = swap
    [result] = engine.run_once()
    assert not result.ok
    assert "differs from its log entry" in state.get(peer.origin).misbehaving


def test_a_checkpoint_signed_by_another_key_is_refused(router) -> None:  # noqa: ANN001
    fake, peer, local, state, engine = setup(router)
    fake.add(Author("alice").publish("r"))
    other = Ed25519PrivateKey.generate()
    fake.checkpoint_hook = lambda text: sign_note(parse_note(text).text, "peer-a.example", other).encode()
    [result] = engine.run_once()
    assert not result.ok and "pinned key" in state.get(peer.origin).misbehaving


def test_log_key_is_checked_in_the_peer_file() -> None:
    import pytest

    from akrelay.federation.peers import PeerConfigError

    with pytest.raises(PeerConfigError, match="log_key"):
        Peer(origin="https://peer.example", log_key="not+a+key")


def test_a_verified_peer_checkpoint_is_cosigned_and_a_misbehaving_one_is_not(router) -> None:  # noqa: ANN001
    from akrelay.protocol.note import NoteError, raw_public_key, verify_cosignature

    fake, peer, local, state, _ = setup(router)
    ours = Ed25519PrivateKey.generate()
    engine = make_engine(local, [peer], state)
    engine.witness = ("local.example", ours)
    fake.add(*[Author("alice").publish(f"r{i}") for i in range(3)])
    assert engine.run_once()[0].ok
    st = state.get(peer.origin)
    note = parse_note(st.cosigned)
    assert note.text == parse_note(st.log_note).text and len(note.signatures) == 2
    assert verify_cosignature(note, "local.example", raw_public_key(ours.public_key())) > 0
    # a fork afterwards: no new cosignature is made
    def shrink(text: str) -> str:  # the peer now claims a smaller tree: a rewrite
        origin, _, root, _end = parse_note(text).text.split("\n")
        return sign_note(f"{origin}\n2\n{root}\n", "peer-a.example", fake.tlog.key).encode()

    fake.checkpoint_hook = shrink
    fake.add(Author("bob").publish("x"))
    assert not engine.run_once()[0].ok
    after = state.get(peer.origin)
    assert after.misbehaving and after.cosigned == st.cosigned
    import pytest

    with pytest.raises(NoteError):
        verify_cosignature(parse_note(after.cosigned), "local.example", raw_public_key(Ed25519PrivateKey.generate().public_key()))


def test_clearing_a_misbehaving_peer_archives_the_evidence_and_reverifies_from_zero(router) -> None:  # noqa: ANN001
    fake, peer, local, state, engine = setup(router)
    fake.add(*[Author("alice").publish(f"r{i}") for i in range(5)])
    assert engine.run_once()[0].ok
    other = make_relay("https://peer-a.example")  # the peer now serves another history: a fork
    for env in [Author("bob").publish(f"x{i}") for i in range(8)]:
        other.submit(__import__("json").dumps(env).encode())
    fake.tlog = TransparencyLog(other.store, fake.origin, fake.tlog.key, clock=fake.tlog.clock)
    fake.relay = other
    assert not engine.run_once()[0].ok
    marked = state.get(peer.origin)
    assert marked.misbehaving and marked.checkpoint == 5

    cleared = state.clear_misbehaving(peer.origin, 1234)
    assert cleared is not None and cleared.misbehaving is None and cleared.evidence is None
    assert cleared.log_note is None and cleared.log_frontier == [] and cleared.checkpoint == 0
    [archived] = cleared.cleared
    assert archived["misbehaving"] == marked.misbehaving and archived["evidence"] == marked.evidence
    assert archived["cleared_at"] == 1234 and archived["log_note"] == marked.log_note
    assert state.get(peer.origin).to_json() == cleared.to_json()
    assert state.clear_misbehaving(peer.origin, 1235) is None  # nothing more to clear

    before = len(fake.query_calls)
    [result] = engine.run_once()  # pulled again, and its log verified from size 0
    assert result.ok, result.error
    assert len(fake.query_calls) > before
    st = state.get(peer.origin)
    assert st.misbehaving is None and st.log_note.split("\n")[1] == "8" and st.checkpoint == 8
    assert len(st.cleared) == 1
    assert len(local_ids(local)) == 5 + 8


def test_a_verified_checkpoint_inconsistent_with_what_the_witness_cosigned_marks_the_peer(router) -> None:  # noqa: ANN001
    from akrelay.federation.witness import SqliteWitnessState, Witness
    from akrelay.protocol.note import Checkpoint, parse_vkey, raw_public_key, verify_cosignature

    fake, peer, local, state, engine = setup(router)
    ours = Ed25519PrivateKey.generate()
    engine.witness = ("local.example", ours)
    engine.witness_log = Witness("local.example", ours, {"peer-a.example": parse_vkey(peer.log_key)},
                                 SqliteWitnessState())
    fake.add(*[Author("alice").publish(f"r{i}") for i in range(3)])
    assert engine.run_once()[0].ok
    st = state.get(peer.origin)
    assert verify_cosignature(parse_note(st.cosigned), "local.example", raw_public_key(ours.public_key())) > 0
    assert engine.witness_log.cosigned("peer-a.example") == st.cosigned
    # the peer had pushed the witness another history of size 5 (its add-checkpoint API)
    other = sign_note(Checkpoint("peer-a.example", 5, bytes(32)).body(), "peer-a.example", fake.tlog.key).encode()
    engine.witness_log.state.update("peer-a.example", lambda _cur: {"size": 5, "root": "", "note": other, "time": 1})
    fake.add(Author("bob").publish("x"))  # size 4: the peer must prove 4 -> 5, and it answers 400
    router.get(fake.origin + "/v1/knowledge/proof/consistency").mock(
        return_value=httpx.Response(400, json={"error": {"code": "invalid_request", "message": "beyond"}}))
    [result] = engine.run_once()
    assert not result.ok
    assert "not consistent with the checkpoint of size 5" in state.get(peer.origin).misbehaving
    # at the same size with another root, no proof is needed to see the fork
    fake2, peer2, _local2, state2, engine2 = setup(router)
    engine2.witness, engine2.witness_log = engine.witness, Witness(
        "local.example", ours, {"peer-a.example": parse_vkey(peer2.log_key)}, SqliteWitnessState())
    other2 = sign_note(Checkpoint("peer-a.example", 2, bytes(32)).body(), "peer-a.example", fake2.tlog.key).encode()
    engine2.witness_log.state.update("peer-a.example", lambda _cur: {"size": 2, "root": "", "note": other2, "time": 1})
    fake2.add(*[Author("carol").publish(f"c{i}") for i in range(2)])
    assert not engine2.run_once()[0].ok
    assert "not consistent with the checkpoint of size 2" in state2.get(peer2.origin).misbehaving


def test_a_consistency_proof_the_peer_cannot_serve_skips_the_cosignature_without_marking_it(router) -> None:  # noqa: ANN001
    from akrelay.federation.witness import SqliteWitnessState, Witness
    from akrelay.protocol.note import parse_vkey

    fake, peer, local, state, engine = setup(router)
    ours = Ed25519PrivateKey.generate()
    engine.witness = ("local.example", ours)
    engine.witness_log = Witness("local.example", ours, {"peer-a.example": parse_vkey(peer.log_key)},
                                 SqliteWitnessState())
    fake.add(*[Author("alice").publish(f"r{i}") for i in range(3)])
    assert engine.run_once()[0].ok
    first = state.get(peer.origin).cosigned
    router.get(fake.origin + "/v1/knowledge/proof/consistency").mock(return_value=httpx.Response(503))
    fake.add(Author("bob").publish("x"))
    [result] = engine.run_once()
    assert result.ok, result.error
    st = state.get(peer.origin)
    assert st.misbehaving is None and st.cosigned == first and st.log_note.split("\n")[1] == "4"
    assert engine.witness_log.cosigned("peer-a.example") == first
