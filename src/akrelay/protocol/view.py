"""The deterministic known-set view (Agent Knowledge §7.2).

A pure function of a dependency-closed set of validated envelopes, so every
arrival order gives the same facts. Event-ID sets are sorted ASCII.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from akrelay.protocol.payload import ASSESS, PUBLISH, RETRACT

if TYPE_CHECKING:
    from akrelay.protocol.envelope import Envelope


def materialize(envelopes: Iterable[Envelope]) -> dict[str, dict[str, str | list[str]]]:
    """Map each publication and assessment ID to its view.

    Publications get ``status``, ``successors``, ``assessments`` and
    ``active_assessments``; assessments get ``status`` only; retractions have no
    entry. Withdrawal never propagates to referencing events.
    """
    known = {e.id: e for e in envelopes}
    retracted: set[str] = set()
    successors: dict[str, set[str]] = {}
    assessments: dict[str, set[str]] = {}
    for event_id, envelope in known.items():
        event = envelope.event
        payload = event["payload"]
        if event["type"] == RETRACT:
            retracted.add(payload["target"])
        elif event["type"] == ASSESS:
            assessments.setdefault(payload["target"], set()).add(event_id)
        else:
            for relation in payload.get("relations", ()):
                if relation["relation"] == "supersedes":
                    successors.setdefault(relation["target"], set()).add(event_id)
    view: dict[str, dict[str, str | list[str]]] = {}
    for event_id in sorted(known):
        etype = known[event_id].event["type"]
        if etype == RETRACT:
            continue
        entry: dict[str, str | list[str]] = {"status": "retracted" if event_id in retracted else "active"}
        if etype == PUBLISH:
            reports = assessments.get(event_id, set())
            entry["successors"] = sorted(successors.get(event_id, ()))
            entry["assessments"] = sorted(reports)
            entry["active_assessments"] = sorted(reports - retracted)
        view[event_id] = entry
    return view
