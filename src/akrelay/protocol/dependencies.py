"""Dependencies and target rules (Agent Knowledge §6.1, §6.2, §7.1, §8.2).

``resolve`` is the caller's lookup of retained envelopes (withheld ones
included), so the same rules serve the relay, the sync loop and clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import ASSESS, PUBLISH, RETRACT

if TYPE_CHECKING:
    from akrelay.protocol.envelope import Envelope

#: Relationships that may also point at an assessment (never at a retraction).
ASSESSMENT_TARGET_RELATIONS = frozenset(("derived_from", "supports", "contradicts"))
#: Relationships whose target must be a publication of one contribution kind.
REQUIRED_TARGET_KIND = {"addresses": "question", "tests": "hypothesis"}


def links(envelope: Envelope) -> list[tuple[str, str]]:
    """Outgoing ``(relation, target)`` pairs; assessments and retractions use their event type as relation."""
    event = envelope.event
    payload = event["payload"]
    if event["type"] == PUBLISH:
        return [(r["relation"], r["target"]) for r in payload.get("relations", ())]
    return [(event["type"], payload["target"])]


def dependencies(envelope: Envelope) -> list[str]:
    """Distinct direct dependencies in ascending ASCII order."""
    return sorted({target for _, target in links(envelope)})


def _invalid(message: str, relation: str, target: str) -> ProtocolError:
    return ProtocolError("invalid_target", message, {"relation": relation, "target": target})


def check_targets(envelope: Envelope, resolve: Callable[[str], Envelope | None]) -> None:
    """Raise ``missing_dependency`` (``data.missing`` sorted) or ``invalid_target``."""
    pairs = links(envelope)
    resolved: dict[str, Envelope] = {}
    missing = []
    for target in sorted({t for _, t in pairs}):
        found = resolve(target)
        if found is None:
            missing.append(target)
        else:
            resolved[target] = found
    if missing:
        raise ProtocolError(
            "missing_dependency",
            f"{len(missing)} target(s) are not retained here; submit them first and retry",
            {"missing": missing},
        )
    event = envelope.event
    for relation, target_id in pairs:
        target_event = resolved[target_id].event
        ttype = target_event["type"]
        if relation in (RETRACT, *ASSESSMENT_TARGET_RELATIONS):
            if ttype not in (PUBLISH, ASSESS):
                raise _invalid(f"{relation} cannot target a {ttype} event", relation, target_id)
        elif ttype != PUBLISH:
            raise _invalid(f"{relation} must target a knowledge.publish event, not {ttype}", relation, target_id)
        kind = REQUIRED_TARGET_KIND.get(relation)
        if kind is not None and target_event["payload"]["kind"] != kind:
            raise _invalid(f"{relation} must target a {kind} publication", relation, target_id)
        if relation in ("supersedes", RETRACT):
            if target_event["actor"] != event["actor"]:
                raise _invalid(f"{relation} must target an event by the same actor", relation, target_id)
            if not target_event["nonce"] < event["nonce"]:
                raise _invalid(f"{relation} must target an event with a strictly smaller nonce", relation, target_id)
