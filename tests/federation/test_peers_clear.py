"""``akrelay peers clear``: the misbehaving mark goes, the evidence stays, on SQLite and Redis state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from akrelay.cli import main
from akrelay.federation.state import FederationState, PeerState

ORIGIN = "https://peer-a.example"
EVIDENCE = {"old": "peer-a.example\n5\nAAAA\n\n— sig\n", "new": "peer-a.example\n4\nBBBB\n\n— sig\n"}


def misbehaving() -> PeerState:
    st = PeerState(ORIGIN, checkpoint=40, peer_checkpoint=44, log_note=EVIDENCE["old"], log_frontier=["x"],
                   misbehaving="the peer's log shrank from 5 to 4 entries (a rewrite)", evidence=EVIDENCE,
                   cosigned="cosigned note", retry_at=99)
    st.bump("passes", 7)
    return st


def check_cleared(st: PeerState) -> None:
    assert st.misbehaving is None and st.evidence is None and st.cosigned is None
    assert st.log_note is None and st.log_frontier == [] and st.checkpoint == 0 and st.retry_at == 0
    assert st.counts["passes"] == 7  # history of the peer is kept
    [archived] = st.cleared
    assert archived["misbehaving"].startswith("the peer's log shrank") and archived["evidence"] == EVIDENCE
    assert archived["log_note"] == EVIDENCE["old"] and archived["checkpoint"] == 40


def test_peers_clear_on_a_data_directory(tmp_path: Path, capsys) -> None:
    state = FederationState.open_in(tmp_path)
    state.put(misbehaving())
    state.put(PeerState("https://peer-b.example"))
    state.close()
    assert main(["peers", "clear", "peer-a.example", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cleared https://peer-a.example" in out and "re-verifies its log from size 0" in out
    state = FederationState.open_in(tmp_path)
    check_cleared(state.get(ORIGIN))
    state.close()
    assert main(["peers", "--json", "status", "--data", str(tmp_path)]) == 0
    shown = {s["origin"]: s for s in json.loads(capsys.readouterr().out)}
    assert shown[ORIGIN]["cleared"][0]["evidence"] == EVIDENCE
    # a peer that is not misbehaving, an unknown one, no state at all: said so, non-zero
    assert main(["peers", "clear", ORIGIN, "--data", str(tmp_path)]) == 1
    assert "not marked misbehaving" in capsys.readouterr().err
    assert main(["peers", "clear", "https://nobody.example", "--data", str(tmp_path)]) == 2
    assert "no sync state" in capsys.readouterr().err
    assert main(["peers", "clear", ORIGIN, "--data", str(tmp_path / "empty")]) == 2


@pytest.mark.redis
def test_peers_clear_on_a_deployments_redis_state_without_the_lease(redis_url: str, capsys) -> None:
    from akrelay.federation.redis_state import RedisFederationState
    from akrelay.leader import RedisLease
    from akrelay.store.redis.client import connect, shared_prefix

    client = connect(redis_url)
    prefix = shared_prefix("dep1", "sync")
    lease = RedisLease(client, prefix, ttl=600)
    assert lease.acquire()  # a running leader holds the lease: the operator's clear needs none
    leader = RedisFederationState(client, token=lease.token, prefix=prefix)
    leader.put(misbehaving())
    assert main(["peers", "clear", ORIGIN, "--store", redis_url, "--store-namespace", "dep1"]) == 0
    assert "cleared https://peer-a.example" in capsys.readouterr().out
    check_cleared(leader.get(ORIGIN))
    assert main(["peers", "clear", ORIGIN, "--store", redis_url, "--store-namespace", "dep1"]) == 1
    # the swap is a compare-and-set: a state changed since it was read is not overwritten
    leader.put(misbehaving())
    reader = RedisFederationState(client, prefix=prefix)
    raw = client.hget(reader._peers, ORIGIN)
    assert int(reader._swap(keys=[reader._peers], args=[ORIGIN, raw + b" ", "{}"])) == 0
    assert leader.get(ORIGIN).misbehaving
    client.close()
