"""Redis mode (issue 23): two nodes over one store, one key file, sign one consistent history."""

from __future__ import annotations

from pathlib import Path

import rfc9162_naive as naive
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from akrelay.protocol import merkle
from akrelay.protocol.note import open_checkpoint, parse_vkey
from akrelay.relay.transparency import TransparencyLog
from akrelay.store.redis.store import RedisStore
from akrelay.store.tlog import leaf_of
from store_contract import corpus


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_two_nodes_sign_one_consistent_history(redis_url: str, tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()  # the operator's one key file, loaded by both nodes
    clock = Clock()
    a, b = RedisStore(redis_url), RedisStore(redis_url)
    try:
        logs = [TransparencyLog(s, "https://relay.example", key, data_dir=tmp_path / name, clock=clock)
                for s, name in ((a, "a"), (b, "b"))]
        for d in ("a", "b"):
            (tmp_path / d).mkdir()
        envs = corpus()
        signed = []
        for step in range(8):
            store = (a, b)[step % 2]
            store.commit_many([(env, 1) for env in envs[step * 6 : step * 6 + 6]])
            clock.now += 1.5
            got = logs[(step + 1) % 2].tick()  # the other node signs
            assert got is not None
            signed.append(got)
        verifier = parse_vkey(logs[0].vkey)
        assert logs[0].vkey == logs[1].vkey
        sizes = [s.checkpoint.size for s in signed]
        assert sizes == sorted(sizes) and sizes[-1] == len(envs[:48])
        for older, newer in zip(signed, signed[1:]):
            open_checkpoint(newer.note, verifier, origin="relay.example")
            proof = merkle.consistency_proof(older.checkpoint.size, newer.checkpoint.size, a.log_nodes)
            assert naive.verify_consistency(older.checkpoint.size, newer.checkpoint.size, older.checkpoint.root,
                                            newer.checkpoint.root, proof)
        entries = b.log_entries(0, 1000)
        assert [e.seq for e in entries] == list(range(1, 49))
        leaves = [leaf_of(e.seq, e.hash) for e in entries]
        assert merkle.root_of_leaves(leaves) == signed[-1].checkpoint.root
        assert naive.MTH([e.seq.to_bytes(8, "big") + e.hash for e in entries]) == signed[-1].checkpoint.root
    finally:
        a.close()
        b.close()
