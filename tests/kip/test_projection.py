"""Every projection outcome under each policy (KIP §21, issue 6)."""

from __future__ import annotations

import pytest

from akrelay.kip import KipError, TrustState, project
from akrelay.kip.projection import POLICIES

from .conftest import World

ALL = ("kip:structural", "kip:memory-default", "akrelay:corroborated")


def _project(world: World, capsule_id: str, policy: str, trust: TrustState | None = None, as_of=None) -> dict:
    nexus = world.nexus()
    return project(nexus, nexus.holds(capsule_id).id, trust=trust or TrustState(), policy_name=policy, as_of=as_of)


def test_policies_are_registered_with_versions() -> None:
    assert {(p.id, p.version) for p in POLICIES.values()} == {(p, 1) for p in ALL}


@pytest.mark.parametrize("policy", ALL)
def test_no_active_assertion_is_insufficient(world: World, policy: str) -> None:
    q = world.publish("alice", "question")
    out = _project(world, q.id, policy)
    assert (out["status"], out["leading"]) == ("insufficient", "none")
    obs = world.publish("alice", "observation")
    world.retract("alice", obs.id)
    out = _project(world, obs.id, policy)
    assert out["status"] == "insufficient"
    assert out["explanation"]["ledger"]["eligibility_exclusions"][0]["reason"] == "retracted"


@pytest.mark.parametrize("policy", ALL)
def test_support_from_another_actor_is_accepted(world: World, policy: str) -> None:
    c = world.publish("alice")
    world.assess("bob", c.id, "reproduced")
    out = _project(world, c.id, policy)
    assert (out["status"], out["leading"]) == ("accepted", "support")
    assert len(out["support"]["root_groups"]) == 2 and out["support"]["score"] is None


@pytest.mark.parametrize("policy", ALL)
def test_author_only_support(world: World, policy: str) -> None:
    c = world.publish("alice")
    world.assess("alice", c.id, "supports")  # the author repeating itself is one root
    out = _project(world, c.id, policy)
    assert len(out["support"]["root_groups"]) == 1 and len(out["support"]["assertion_ids"]) == 2
    if policy == "akrelay:corroborated":
        assert (out["status"], out["leading"]) == ("uncertain", "none")
        assert out["uncertainty"]["reasons"] == ["uncorroborated"]
    else:
        assert (out["status"], out["leading"]) == ("accepted", "support")


@pytest.mark.parametrize("policy", ALL)
def test_author_support_counts_against_opposition(world: World, policy: str) -> None:
    c = world.publish("alice")
    world.assess("bob", c.id, "challenges")
    out = _project(world, c.id, policy)
    assert (out["status"], out["leading"]) == ("contested", "none")  # one root each: a tie


@pytest.mark.parametrize("policy", ALL)
@pytest.mark.parametrize("extra, leading", [("supports", "support"), ("not_reproduced", "opposition")])
def test_contested_leading_goes_to_more_roots(world: World, policy: str, extra: str, leading: str) -> None:
    c = world.publish("alice")
    world.assess("bob", c.id, "challenges")
    world.assess("carol", c.id, extra)
    world.assess("bob", c.id, "not_reproduced")  # a second bob assertion is not a second root
    out = _project(world, c.id, policy)
    assert (out["status"], out["leading"]) == ("contested", leading)


@pytest.mark.parametrize("policy", ALL)
def test_reject_alone_is_rejected(world: World, policy: str) -> None:
    q = world.publish("alice", "question")  # no author stance
    world.assess("bob", q.id, "challenges")
    out = _project(world, q.id, policy)
    assert (out["status"], out["leading"]) == ("rejected", "opposition")


@pytest.mark.parametrize("policy", ALL)
def test_only_uncertain_is_uncertain(world: World, policy: str) -> None:
    h = world.publish("alice", "hypothesis")
    world.assess("bob", h.id, "inconclusive")
    world.assess("carol", h.id, "applied")
    out = _project(world, h.id, policy)
    assert (out["status"], out["leading"]) == ("uncertain", "none")
    assert "uncorroborated" not in out["uncertainty"]["reasons"]
    assert len(out["uncertainty"]["root_groups"]) == 3


@pytest.mark.parametrize("policy", ALL)
def test_blocked_actor_is_ineligible(world: World, policy: str) -> None:
    c = world.publish("alice")
    world.assess("mallory", c.id, "challenges")
    world.assess("bob", c.id, "supports")
    trust = TrustState({world.did("mallory"): "blocked"})
    out = _project(world, c.id, policy, trust)
    assert out["status"] == "accepted"
    assert {"assertion_id": out["explanation"]["ledger"]["eligibility_exclusions"][0]["assertion_id"],
            "reason": "blocked_actor"} in out["explanation"]["ledger"]["eligibility_exclusions"]
    blocked_bob = TrustState({world.did("bob"): "blocked", world.did("mallory"): "trusted"})
    out = _project(world, c.id, policy, blocked_bob)
    assert out["status"] == "contested"
    assert out["basis"]["trust_state_version"] != trust.version


@pytest.mark.parametrize("policy", ALL)
def test_relayed_retraction_of_an_assessment(world: World, policy: str) -> None:
    c = world.publish("alice")
    a = world.assess("bob", c.id, "challenges")
    world.assess("carol", c.id, "supports")
    world.retract("bob", a.id)
    assert _project(world, c.id, policy, as_of=3)["status"] == "contested"
    assert _project(world, c.id, policy)["status"] == "accepted"


def test_basis_is_complete(world: World) -> None:
    c = world.publish("alice")
    out = _project(world, c.id, "akrelay:corroborated")
    basis = out["basis"]
    assert set(basis) == {"space_id", "snapshot_seq", "schema_environment_version", "identity_resolution_version",
                          "policy", "trust_state_version", "authorization_view", "context_refs", "purpose", "risk",
                          "valid_at", "next_invalid_at"}
    assert basis["policy"] == {"id": "akrelay:corroborated", "version": 1}
    assert basis["snapshot_seq"] == 1 and basis["next_invalid_at"] is None and basis["context_refs"] == []
    assert out["opposition"]["score"] is None and out["conflict_refs"] == []


def test_unknown_policy_and_future_seq_fail(world: World) -> None:
    c = world.publish("alice")
    nexus = world.nexus()
    with pytest.raises(KipError) as exc:
        project(nexus, nexus.holds(c.id).id, trust=TrustState(), policy_name="kip:weighted")
    assert exc.value.code == "ProjectionPolicyUnavailable"
    with pytest.raises(KipError) as exc:
        project(nexus, nexus.holds(c.id).id, trust=TrustState(), as_of=5)
    assert exc.value.code == "HistoricalSnapshotUnavailable"
    with pytest.raises(KipError) as exc:
        project(nexus, "p99.1", trust=TrustState())
    assert exc.value.code == "NotFoundOrNotVisible"


def test_trust_classes_are_validated() -> None:
    with pytest.raises(ValueError):
        TrustState({"did:agent:x": "admin"})
