"""The witness (C2SP tlog-witness add-checkpoint, and cosigning after a sync pass), on SQLite and Redis records."""

from __future__ import annotations

import base64
import threading
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from akrelay.federation.witness import RedisWitnessState, SqliteWitnessState, Witness
from akrelay.protocol import merkle
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.note import Checkpoint, parse_note, parse_vkey, raw_public_key, sign_note, verify_cosignature, vkey

LOG = "log.example"


class Log:
    """A toy log: leaves, signed checkpoints and consistency proofs from the core."""

    def __init__(self, key: Ed25519PrivateKey | None = None) -> None:
        self.key = key or Ed25519PrivateKey.generate()
        self.leaves: list[bytes] = []
        self.nodes: dict[tuple[int, int], bytes] = {}

    def grow(self, n: int, tag: bytes = b"a") -> None:
        frontier = merkle.Frontier.load(len(self.leaves), lambda keys: [self.nodes[k] for k in keys])
        for _ in range(n):
            leaf = merkle.leaf_hash(tag + len(self.leaves).to_bytes(8, "big"))
            self.leaves.append(leaf)
            for level, index, value in frontier.append(leaf):
                self.nodes[(level, index)] = value

    def provider(self, keys: list[tuple[int, int]]) -> list[bytes]:
        return [self.nodes[k] for k in keys]

    def checkpoint(self, size: int | None = None) -> str:
        size = len(self.leaves) if size is None else size
        root = merkle.root_hash(size, self.provider)
        return sign_note(Checkpoint(LOG, size, root).body(), LOG, self.key).encode()

    def body(self, old: int, size: int | None = None, *, proof: list[bytes] | None = None) -> bytes:
        size = len(self.leaves) if size is None else size
        if proof is None:
            proof = merkle.consistency_proof(old, size, self.provider) if 0 < old < size else []
        lines = [f"old {old}"] + [base64.b64encode(h).decode() for h in proof]
        return ("\n".join(lines) + "\n\n" + self.checkpoint(size)).encode()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def witness_state(request, tmp_path):  # noqa: ANN001, ANN201
    if request.param == "sqlite":
        state: Any = SqliteWitnessState.open_in(tmp_path)
    else:
        from akrelay.store.redis.client import connect

        state = RedisWitnessState(connect(request.getfixturevalue("redis_url")), "t:witness:", owns_client=True)
    yield state
    state.close()


def make(log: Log, state: Any) -> tuple[Witness, Ed25519PrivateKey]:
    key = Ed25519PrivateKey.generate()
    return Witness("w.example", key, {LOG: parse_vkey(vkey(LOG, raw_public_key(log.key.public_key())))}, state), key


def error(call) -> tuple[int, str, Any]:  # noqa: ANN001
    with pytest.raises(ProtocolError) as info:
        call()
    return info.value.http_status, info.value.message, info.value.data


def test_add_checkpoint_cosigns_a_consistent_history_and_refuses_anything_else(witness_state) -> None:  # noqa: ANN001
    log = Log()
    log.grow(5)
    witness, key = make(log, witness_state)
    lines = witness.add_checkpoint(log.body(0))
    note = parse_note(log.checkpoint() + lines)
    assert verify_cosignature(note, "w.example", raw_public_key(key.public_key())) > 0
    assert witness.add_checkpoint(log.body(5)) == lines  # the same checkpoint again
    log.grow(6)
    assert witness.add_checkpoint(log.body(5)).startswith("\u2014 w.example ")
    assert witness.cosigned(LOG).split("\n")[1] == "11"
    # stale old size: 409 with the latest cosigned size
    status, message, data = error(lambda: witness.add_checkpoint(log.body(5)))
    assert status == 409 and data == {"size": 11} and "11" in message
    # a consistency proof that does not verify: 422, and nothing is recorded
    log.grow(3)
    bad = merkle.consistency_proof(11, 14, log.provider)
    bad[0] = bytes(32)
    assert error(lambda: witness.add_checkpoint(log.body(11, proof=bad)))[0] == 422
    assert witness.cosigned(LOG).split("\n")[1] == "11"
    # a fork: another history of the same key, same size -> 409
    fork = Log(log.key)
    fork.grow(11, b"b")
    assert error(lambda: witness.add_checkpoint(fork.body(11)))[0] == 409
    fork.grow(3, b"b")  # and a larger fork with its own (valid for it) proof -> 422
    assert error(lambda: witness.add_checkpoint(fork.body(11)))[0] == 422
    # unknown origin 404; another key 403; malformed 400; old > size 400
    stranger = Log()
    stranger.grow(2)
    other = sign_note(parse_note(stranger.checkpoint()).text.replace(LOG, "else.example"), "else.example",
                      stranger.key).encode()
    assert error(lambda: witness.add_checkpoint(b"old 0\n\n" + other.encode()))[0] == 404
    assert error(lambda: witness.add_checkpoint(b"old 0\n\n" + stranger.checkpoint().encode()))[0] == 403
    for body in [b"", b"old 01\n\n" + log.checkpoint().encode(), b"old 1\nnot base64!\n\n" + log.checkpoint().encode(),
                 b"old 20\n\n" + log.checkpoint().encode(), b"old 0\n" + b"A" * 44 + b"\n\n" + log.checkpoint().encode(),
                 b"old 0\n\nnot a note\n", b"\xff\xfe", b"old 0\n" + b"AAAA\n" * 64 + b"\n" + log.checkpoint().encode()]:
        assert error(lambda: witness.add_checkpoint(body))[0] == 400, body
    assert error(lambda: witness.add_checkpoint(b"x" * 200_000))[0] == 413
    assert witness.cosigned(LOG).split("\n")[1] == "11"


def test_concurrent_add_checkpoints_never_roll_the_witness_back(witness_state) -> None:  # noqa: ANN001
    log = Log()
    log.grow(4)
    witness, _ = make(log, witness_state)
    witness.add_checkpoint(log.body(0, 4))
    log.grow(8)
    bodies = [log.body(4, size) for size in range(5, 13)]  # all claim old size 4: one wins, the rest are 409
    outcomes: list[int] = []

    def push(body: bytes) -> None:
        try:
            witness.add_checkpoint(body)
            outcomes.append(200)
        except ProtocolError as exc:
            outcomes.append(exc.http_status)

    threads = [threading.Thread(target=push, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcomes.count(200) == 1 and outcomes.count(409) == len(bodies) - 1


def test_after_sync_cosigns_only_what_is_consistent_with_the_record(witness_state) -> None:  # noqa: ANN001
    from akrelay.protocol.note import NoteError

    log = Log()
    log.grow(3)
    witness, _ = make(log, witness_state)

    def proof(m: int, n: int) -> list[str]:
        return [base64.b64encode(h).decode() for h in merkle.consistency_proof(m, n, log.provider)]

    assert witness.after_sync(log.checkpoint(), proof).split("\n")[1] == "3"
    log.grow(4)
    witness.add_checkpoint(log.body(3))  # pushed ahead: size 7
    assert witness.after_sync(log.checkpoint(5), proof).split("\n")[1] == "7"  # older but consistent: kept at 7
    fork = Log(log.key)
    fork.grow(9, b"z")
    with pytest.raises(NoteError, match="not consistent"):
        witness.after_sync(fork.checkpoint(), lambda m, n: [base64.b64encode(h).decode()
                                                          for h in merkle.consistency_proof(m, n, fork.provider)])
    assert witness.cosigned(LOG).split("\n")[1] == "7"
