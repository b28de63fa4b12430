"""schema_cases: the bundled JSON Schema and our hand-written structural check agree.

Every case is validated with ``jsonschema`` against ``schemas/agent-knowledge-1.0.schema.json``.
For envelope cases our step-1 structure (``verify_envelope`` → closed envelope and event,
``check_payload_structure``) must agree: a schema-invalid envelope is ``invalid_event``,
and a schema-valid one gets past the shape (the mutations are not re-signed, so it may
still fail later with a hash or signature error, never ``invalid_event``).
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.options import ValidationOptions
from akrelay.protocol.payload import check_payload_structure
from knowledge_vectors import DRAFT_SCHEMA_PATH, SCHEMA_PATH, apply_changes, cases, raw_envelope

SCHEMA = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
DRAFT = json.loads(DRAFT_SCHEMA_PATH.read_text(encoding="utf-8"))
STRICT = ValidationOptions(allow_legacy_retract=False)
CASES = cases("schema_cases")
ENVELOPE_CASES = [c for c in CASES if c["definition"] == "signedEnvelope"]


def _value(case):
    return case["value"] if "value" in case else apply_changes(raw_envelope(case["fixture"]), case["changes"])


def _validator(schema, definition):
    return jsonschema.Draft202012Validator({"$ref": "#/$defs/" + definition, "$defs": schema["$defs"]})


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_schema_case_with_jsonschema(case):
    assert _validator(SCHEMA, case["definition"]).is_valid(_value(case)) is case["valid"]


@pytest.mark.parametrize("case", ENVELOPE_CASES, ids=[c["name"] for c in ENVELOPE_CASES])
def test_structure_agrees_with_schema(case):
    from akrelay.protocol.envelope import verify_envelope

    value = _value(case)
    try:
        verify_envelope(json.dumps(value, ensure_ascii=False).encode("utf-8"), options=STRICT)
        code = "valid"
    except ProtocolError as exc:
        code = exc.code
    if case["valid"]:
        assert code != "invalid_event", code
    else:
        assert code == "invalid_event"


KNOWN_TYPE_CASES = [c for c in ENVELOPE_CASES if _value(c)["event"]["type"] in
                    ("knowledge.publish", "knowledge.assess", "knowledge.retract")]


@pytest.mark.parametrize("case", KNOWN_TYPE_CASES, ids=[c["name"] for c in KNOWN_TYPE_CASES])
def test_payload_structure_agrees_with_payload_schema(case):
    """With a known event type, the payload check alone agrees with the payload definition."""
    event = _value(case)["event"]
    definition = {"knowledge.publish": "publishPayload", "knowledge.assess": "assessPayload",
                  "knowledge.retract": "retractPayload"}[event["type"]]
    expected = _validator(SCHEMA, definition).is_valid(event.get("payload"))
    try:
        check_payload_structure(event["type"], event.get("payload"), STRICT)
        ours = True
    except ProtocolError as exc:
        assert exc.code == "invalid_event"
        ours = False
    assert ours is expected


def test_legacy_retraction_follows_the_draft_schema():
    """Without ``license`` a retraction is valid under the earlier draft only; the switch decides."""
    retraction = raw_envelope("retract_original")["event"]["payload"]
    del retraction["license"]
    assert _validator(DRAFT, "retractPayload").is_valid(retraction)
    assert not _validator(SCHEMA, "retractPayload").is_valid(retraction)
    check_payload_structure("knowledge.retract", retraction)  # on by default
    with pytest.raises(ProtocolError) as info:
        check_payload_structure("knowledge.retract", retraction, STRICT)
    assert info.value.code == "invalid_event" and "license" in info.value.message


def test_legacy_retraction_still_checks_everything_else():
    retraction = raw_envelope("retract_original")["event"]["payload"]
    del retraction["license"]
    retraction["license_url"] = "https://example.com/"
    with pytest.raises(ProtocolError) as info:
        check_payload_structure("knowledge.retract", retraction)
    assert info.value.code == "invalid_event"
