"""A second, naive implementation of RFC 9162 §2.1, written from the RFC text only (recursive, O(n) per call).

The tests check the relay's fast tree (``akrelay.protocol.merkle``, stored nodes)
and its HTTP answers against it; keep it independent of akrelay.
"""
# ruff: noqa: N802, N803, N806  (RFC 9162's names: MTH, PATH, PROOF, D)

from __future__ import annotations

import hashlib


def H(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def k_of(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def MTH(D: list[bytes]) -> bytes:
    n = len(D)
    if n == 0:
        return H(b"")
    if n == 1:
        return H(b"\x00" + D[0])
    k = k_of(n)
    return H(b"\x01" + MTH(D[:k]) + MTH(D[k:]))


def PATH(mi: int, D: list[bytes]) -> list[bytes]:
    n = len(D)
    if n == 1:
        return []
    k = k_of(n)
    if mi < k:
        return PATH(mi, D[:k]) + [MTH(D[k:])]
    return PATH(mi - k, D[k:]) + [MTH(D[:k])]


def SUBPROOF(mi: int, D: list[bytes], b: bool) -> list[bytes]:
    n = len(D)
    if mi == n:
        return [] if b else [MTH(D)]
    k = k_of(n)
    if mi <= k:
        return SUBPROOF(mi, D[:k], b) + [MTH(D[k:])]
    return SUBPROOF(mi - k, D[k:], False) + [MTH(D[:k])]


def PROOF(mi: int, D: list[bytes]) -> list[bytes]:
    return SUBPROOF(mi, D, True)



def verify_inclusion(index: int, size: int, leaf_hash: bytes, path: list[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2, written out again."""
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf_hash
    for p in path:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            r = H(b"\x01" + p + r)
            if fn % 2 == 0:
                while fn % 2 == 0 and fn != 0:
                    fn //= 2
                    sn //= 2
        else:
            r = H(b"\x01" + r + p)
        fn //= 2
        sn //= 2
    return sn == 0 and r == root


def verify_consistency(first: int, second: int, first_hash: bytes, second_hash: bytes, path: list[bytes]) -> bool:
    """RFC 9162 §2.1.4.2, written out again (equal sizes: an empty proof and equal roots)."""
    if first == second:
        return not path and first_hash == second_hash
    if not path:
        return False
    path = list(path)
    if first & (first - 1) == 0:
        path = [first_hash] + path
    fn, sn = first - 1, second - 1
    while fn % 2 == 1:
        fn //= 2
        sn //= 2
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            fr = H(b"\x01" + c + fr)
            sr = H(b"\x01" + c + sr)
            if fn % 2 == 0:
                while fn % 2 == 0 and fn != 0:
                    fn //= 2
                    sn //= 2
        else:
            sr = H(b"\x01" + sr + c)
        fn //= 2
        sn //= 2
    return fr == first_hash and sr == second_hash and sn == 0


def entry_leaf(seq: int, event_hash: bytes) -> bytes:
    """Issue 23's entry (8-byte big-endian seq || 32-byte event hash) as an RFC 9162 leaf hash."""
    return H(b"\x00" + seq.to_bytes(8, "big") + event_hash)
