"""Differential test: our step-1 + payload validator against the agent-protocols 0.12.6 SDK.

For a few thousand generated envelopes (valid fixtures; the vectors' schema and
identity mutations, as given and re-signed; generated mutations of the same
kinds; random pairs of re-signed payload mutations) both validators must agree
on accept versus reject and on the error code.

Known differences are accounted for explicitly, case by case, never by
loosening our rules (see docs/conformance.md, "SDK differences"):

1. Draft difference: the SDK bundles the earlier schema, which has no
   ``license`` on retractions, so it refuses every current-draft retraction
   with ``invalid_event``. (The other draft difference, ``q``, concerns query
   requests, not envelopes.) Legacy retractions without ``license`` are
   accepted by both, ours by the documented default compatibility rule.
2. The SDK decodes ``bytes`` with ``json.loads``, which strips a UTF-8 byte
   order mark and accepts UTF-16/32 text; I-JSON must be UTF-8 and we refuse
   both with ``invalid_event``. The SDK's answer must then equal ours on the
   same text re-encoded as plain UTF-8.
3. A signature or actor whose base64url is non-canonical (non-zero trailing
   bits) gets the SDK-internal code ``invalid_encoding``, which is not a wire
   code of either spec; we answer ``invalid_signature`` and ``invalid_event``.
"""

from __future__ import annotations

import collections
import json

import pytest

from akrelay.protocol.envelope import verify_envelope
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import check_payload_rules

from identity_differential import generate

sdk_knowledge = pytest.importorskip("agent_protocols.knowledge")
sdk_errors = pytest.importorskip("agent_protocols.errors")


def ours(raw: bytes) -> tuple[str, str]:
    try:
        check_payload_rules(verify_envelope(raw))
    except ProtocolError as err:
        return err.code, err.message
    return "accept", ""


def sdk(raw: bytes) -> str:
    try:
        sdk_knowledge.parse_knowledge_envelope(raw)
    except sdk_errors.AgentProtocolError as err:
        return err.code
    except Exception as err:  # noqa: BLE001 - an SDK crash is a disagreement to report, not to hide
        return f"crash:{type(err).__name__}"
    return "accept"


def expected_sdk_answer(raw: bytes, code: str, message: str) -> tuple[str, str | None]:
    """The SDK's expected answer given ours, and which known difference applies (if any)."""
    try:
        text = raw.decode(json.detect_encoding(raw))
    except (UnicodeDecodeError, LookupError):
        return code, None
    plain = text.lstrip("\ufeff").encode("utf-8", "surrogatepass")
    if plain != raw:
        again_code, again_message = ours(plain)
        return expected_sdk_answer(plain, again_code, again_message)[0], "sdk-decodes-bom-or-utf16"
    try:
        value = json.loads(text)
    except ValueError:
        return code, None
    event = value.get("event") if isinstance(value, dict) else None
    if (
        isinstance(event, dict)
        and event.get("type") == "knowledge.retract"
        and isinstance(event.get("payload"), dict)
        and "license" in event["payload"]
    ):
        return "invalid_event", "draft-retraction-license"
    if code == "invalid_signature" and "not canonical" in message:
        return "invalid_encoding", "sdk-invalid-encoding"
    if code == "invalid_event" and "actor public key" in message and "not canonical" in message:
        return "invalid_encoding", "sdk-invalid-encoding"
    return code, None


@pytest.mark.slow
def test_our_validator_agrees_with_the_sdk():
    cases = generate()
    assert len(cases) >= 2000
    disagreements = []
    answers: collections.Counter[str] = collections.Counter()
    differences: collections.Counter[str] = collections.Counter()
    for label, raw in cases:
        code, message = ours(raw)
        answers[code] += 1
        expected, difference = expected_sdk_answer(raw, code, message)
        if difference:
            differences[difference] += 1
        actual = sdk(raw)
        if actual != expected:
            disagreements.append(f"{label}: ours={code} ({message}) sdk={actual} expected-sdk={expected}")
    assert disagreements == []
    # The generator must exercise acceptance and every step-1 code, and each accounted difference.
    assert answers["accept"] >= 100
    assert {"invalid_event", "invalid_event_hash", "invalid_signature"} <= set(answers)
    assert set(differences) == {"draft-retraction-license", "sdk-decodes-bom-or-utf16", "sdk-invalid-encoding"}


def test_legacy_retraction_is_accepted_by_both_and_refusable_by_us():
    from akrelay.protocol.options import ValidationOptions
    from akrelay.protocol.signer import Signer, retract_event

    from identity_support import FIXTURES, KNOWLEDGE, to_bytes

    signer = Signer.from_seed(bytes.fromhex(KNOWLEDGE["seeds"]["publisher"]))
    target = FIXTURES["original"]["envelope"]["hash"]
    legacy = to_bytes(signer.sign(retract_event(signer.agent_id, 1, 10**7, {"target": target, "reason": "superseded"})))
    current = to_bytes(
        signer.sign(
            retract_event(
                signer.agent_id, 1, 10**7, {"license": "https://creativecommons.org/licenses/by/4.0/", "target": target, "reason": "superseded"}
            )
        )
    )
    assert ours(legacy)[0] == "accept" and sdk(legacy) == "accept"
    assert ours(current)[0] == "accept" and sdk(current) == "invalid_event"
    strict = ValidationOptions(allow_legacy_retract=False)
    with pytest.raises(ProtocolError) as err:
        check_payload_rules(verify_envelope(legacy, options=strict), strict)
    assert err.value.code == "invalid_event"
