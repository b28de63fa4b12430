# ruff: noqa: N806  (the RFC calls the list of entries D)
"""The log tree against a second, naive implementation written straight from RFC 9162 §2.1.

Known vectors: the empty-tree root (SHA-256 of the empty string) and the
RFC 6962-era Certificate Transparency test data (the eight leaves, tree heads
of sizes 0..8, and the inclusion and consistency proofs of
google/certificate-transparency's C++ merkle tests, Apache-2.0), which every
CT implementation reproduces.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rfc9162_naive as naive
from rfc9162_naive import MTH, PATH, PROOF, H

from akrelay.protocol import merkle as m


# -- a node provider over a plain list (what a store keeps) -------------------------------------------------
class Tree:
    def __init__(self, entries: list[bytes]) -> None:
        self.frontier = m.Frontier()
        self.nodes: dict[tuple[int, int], bytes] = {}
        for e in entries:
            self.append(e)

    def append(self, entry: bytes) -> None:
        for level, index, value in self.frontier.append(m.leaf_hash(entry)):
            self.nodes[(level, index)] = value

    def get(self, keys):  # type: ignore[no-untyped-def]
        return [self.nodes[k] for k in keys]


def entries(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [m.entry_bytes(i + 1, rng.randbytes(32)) for i in range(n)]


CT_LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                        "606162636465666768696a6b6c6d6e6f")]
CT_ROOTS = [bytes.fromhex(h) for h in (
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
)]
CT_INCLUSION = [
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
]
CT_CONSISTENCY = [
    (1, 1, []),
    (1, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 5, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
]


def test_empty_root_is_sha256_of_nothing() -> None:
    assert m.EMPTY_ROOT == CT_ROOTS[0] == MTH([])
    assert m.root_hash(0, Tree([]).get) == CT_ROOTS[0]


def test_ct_tree_heads() -> None:
    tree = Tree([])
    for n, leaf in enumerate(CT_LEAVES, 1):
        tree.append(leaf)
        assert tree.frontier.root() == CT_ROOTS[n] == MTH(CT_LEAVES[:n])
        assert m.root_hash(n, tree.get) == CT_ROOTS[n]


@pytest.mark.parametrize(("index", "size", "proof"), CT_INCLUSION)
def test_ct_inclusion_vectors(index: int, size: int, proof: list[str]) -> None:
    tree = Tree(CT_LEAVES)
    got = m.inclusion_proof(index, size, tree.get)
    assert [p.hex() for p in got] == proof
    assert m.verify_inclusion(index, size, m.leaf_hash(CT_LEAVES[index]), got, CT_ROOTS[size])


@pytest.mark.parametrize(("first", "second", "proof"), CT_CONSISTENCY)
def test_ct_consistency_vectors(first: int, second: int, proof: list[str]) -> None:
    tree = Tree(CT_LEAVES)
    got = m.consistency_proof(first, second, tree.get)
    assert [p.hex() for p in got] == proof
    assert m.verify_consistency(first, second, CT_ROOTS[first], CT_ROOTS[second], got)


def test_every_size_to_300_matches_the_naive_rfc() -> None:
    D = entries(300, seed=1)
    tree = Tree([])
    rng = random.Random(7)
    for n in range(1, 301):
        tree.append(D[n - 1])
        root = MTH(D[:n])
        assert tree.frontier.root() == root == m.root_hash(n, tree.get)
        for i in {0, n - 1, rng.randrange(n), rng.randrange(n)}:
            proof = m.inclusion_proof(i, n, tree.get)
            assert proof == PATH(i, D[:n])
            assert m.verify_inclusion(i, n, m.leaf_hash(D[i]), proof, root)
            assert naive.verify_inclusion(i, n, m.leaf_hash(D[i]), proof, root)
        for first in {1, n, rng.randint(1, n), rng.randint(1, n)}:
            proof = m.consistency_proof(first, n, tree.get)
            assert proof == PROOF(first, D[:n])
            assert m.verify_consistency(first, n, MTH(D[:first]), root, proof)
            assert naive.verify_consistency(first, n, MTH(D[:first]), root, proof)


def test_all_proofs_of_small_trees() -> None:
    D = entries(40, seed=2)
    tree = Tree(D)
    roots = [MTH(D[:n]) for n in range(41)]
    for n in range(1, 41):
        for i in range(n):
            assert m.inclusion_proof(i, n, tree.get) == PATH(i, D[:n])
        for first in range(0, n + 1):
            proof = m.consistency_proof(first, n, tree.get)
            assert proof == (PROOF(first, D[:n]) if 0 < first < n else [])
            assert m.verify_consistency(first, n, roots[first], roots[n], proof)


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=5000), st.data())
def test_random_larger_sizes(n: int, data: st.DataObject) -> None:
    D = entries(n, seed=n)
    tree = Tree(D)
    root = MTH(D)
    i = data.draw(st.integers(min_value=0, max_value=n - 1))
    first = data.draw(st.integers(min_value=1, max_value=n))
    assert m.root_hash(n, tree.get) == root
    proof = m.inclusion_proof(i, n, tree.get)
    assert proof == PATH(i, D)
    assert m.verify_inclusion(i, n, m.leaf_hash(D[i]), proof, root)
    cproof = m.consistency_proof(first, n, tree.get)
    assert m.verify_consistency(first, n, MTH(D[:first]), root, cproof)
    # a smaller tree's root from stored nodes of the larger tree
    assert m.root_hash(first, tree.get) == MTH(D[:first])


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=200), st.data())
def test_tampered_proofs_fail(n: int, data: st.DataObject) -> None:
    D = entries(n, seed=n + 1)
    tree = Tree(D)
    root = MTH(D)
    i = data.draw(st.integers(min_value=0, max_value=n - 1))
    proof = m.inclusion_proof(i, n, tree.get)
    leaf = m.leaf_hash(D[i])
    assert not m.verify_inclusion(i, n, m.leaf_hash(b"x" + D[i]), proof, root)
    if proof:
        j = data.draw(st.integers(min_value=0, max_value=len(proof) - 1))
        bad = list(proof)
        bad[j] = bytes([bad[j][0] ^ 1]) + bad[j][1:]
        assert not m.verify_inclusion(i, n, leaf, bad, root)
        assert not m.verify_inclusion(i, n, leaf, proof[:-1], root)
    assert not m.verify_inclusion(i, n, leaf, proof + [root], root)
    first = data.draw(st.integers(min_value=1, max_value=n - 1))
    cproof = m.consistency_proof(first, n, tree.get)
    old = MTH(D[:first])
    assert not m.verify_consistency(first, n, H(old), root, cproof)
    assert not m.verify_consistency(first, n, old, H(root), cproof)
    assert not m.verify_consistency(first, n, old, root, cproof[:-1])
    forked = D[: first - 1] + [b"fork"] + D[first:]
    assert not m.verify_consistency(first, n, old, MTH(forked), cproof)


def test_bad_requests_are_proof_errors() -> None:
    tree = Tree(entries(5))
    with pytest.raises(m.ProofError):
        m.inclusion_proof(5, 5, tree.get)
    with pytest.raises(m.ProofError):
        m.inclusion_proof(-1, 5, tree.get)
    with pytest.raises(m.ProofError):
        m.consistency_proof(6, 5, tree.get)
    assert not m.verify_inclusion(0, 0, b"\0" * 32, [], b"\0" * 32)
    assert not m.verify_consistency(3, 2, b"", b"", [])
    assert not m.verify_consistency(2, 4, b"\0" * 32, b"\0" * 32, [])


def test_frontier_reload_from_stored_nodes() -> None:
    D = entries(77)
    tree = Tree(D)
    again = m.Frontier.load(77, tree.get)
    assert again.hashes == tree.frontier.hashes and again.root() == MTH(D)
    again.append(m.leaf_hash(b"more"))
    assert again.root() == MTH(D + [b"more"])


def test_entry_bytes() -> None:
    assert m.entry_bytes(1, b"\xab" * 32) == b"\0" * 7 + b"\x01" + b"\xab" * 32
    with pytest.raises(ValueError):
        m.entry_bytes(1, b"short")


def test_extend_entries_is_append_unrolled() -> None:
    D = entries(300, seed=9)
    pairs = [(int.from_bytes(e[:8], "big"), e[8:]) for e in D]
    slow, fast = m.Frontier(), m.Frontier()
    slow_nodes = [n for e in D for n in slow.append(m.leaf_hash(e))[1:]]
    fast_nodes = fast.extend_entries(pairs[:100]) + fast.extend_entries(pairs[100:])
    assert fast_nodes == slow_nodes and fast.hashes == slow.hashes and fast.size == 300
    assert fast.root() == MTH(D)


@pytest.mark.parametrize("stride", [1, 2, 4])
def test_extend_leaves_makes_the_same_tree_level_by_level(stride: int) -> None:
    D = entries(300, seed=10)
    slow = m.Frontier()
    every = {(lv, ix): h for e in D for lv, ix, h in slow.append(m.leaf_hash(e))[1:]}
    fast, got = m.Frontier(), {}
    for lo, hi in [(0, 1), (1, 2), (2, 7), (7, 64), (64, 65), (65, 200), (200, 300)]:  # odd and aligned starts
        for lv, ix, h in fast.extend_leaves([m.leaf_hash(e) for e in D[lo:hi]], stride):
            assert (lv, ix) not in got
            got[(lv, ix)] = h
        assert fast.size == hi and fast.hashes == m.Frontier.load(hi, lambda keys: [every.get(k) or m.leaf_hash(D[k[1]]) for k in keys]).hashes
    assert got == {k: v for k, v in every.items() if k[0] % stride == 0}
    assert fast.hashes == slow.hashes and fast.root() == MTH(D)
    assert fast.extend_leaves([]) == [] and fast.size == 300
