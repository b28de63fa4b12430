"""Interop: the agent-protocols SDK's KnowledgeClient drives a real relay over TLS.

The relay runs as ``akrelay serve`` (Granian subprocess, self-signed certificate
from its data directory). Every SDK call validates the response with the SDK's
own validators (discovery, records, query pages through its page tracker,
batch partitions). The SDK implements the earlier draft: it never sends ``q``
and refuses retractions that carry ``license``, so those go through akrelay's
own client, and SDK enumerations filter by type so they never meet them.
"""

from __future__ import annotations

import json

import pytest
import requests
from agent_protocols.http_client import HttpResponseError, KnowledgeClient
from agent_protocols.knowledge import validate_knowledge_envelope
from relay_harness import FIXTURES, hash_of, start_relay

from akrelay.client import RelayClient

pytestmark = pytest.mark.slow

SDK_INVALID_BY_RELAY = {
    "cross_author_supersedes": "invalid_target",
    "backwards_supersedes": "invalid_target",
    "wrong_assessment_target": "invalid_target",
    "equal_nonce_supersedes": "invalid_target",
    "research_bad_addresses": "invalid_target",
    "research_bad_tests": "invalid_target",
}


def sdk_valid(name: str) -> bool:
    try:
        validate_knowledge_envelope(FIXTURES[name]["envelope"])
        return True
    except Exception:  # noqa: BLE001 - the SDK's verdict, whatever it raises
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    relay = start_relay(tmp_path_factory.mktemp("interop") / "data", extra=["--write-rate", "0", "--read-rate", "0"])
    yield relay
    relay.stop()


@pytest.fixture(scope="module")
def sdk(served):
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE in the environment would override verify
    session.verify = str(served.cacert)
    client = KnowledgeClient.discover(served.origin, session)
    yield client
    session.close()


def test_sdk_drives_the_relay_over_tls(served, sdk) -> None:
    discovery = sdk.discovery
    assert discovery["service"] == served.origin
    assert all(url.startswith(served.origin + "/") for url in discovery["endpoints"].values())

    # Submit every fixture the SDK accepts, retrying those whose dependencies arrive later.
    pending = [n for n in FIXTURES if sdk_valid(n)]
    accepted: dict[str, dict] = {}
    refused: dict[str, str] = {}
    for _ in range(6):
        still = []
        for name in pending:
            try:
                accepted[name] = sdk.submit(FIXTURES[name]["envelope"])  # SDK validates the record
            except HttpResponseError as exc:
                code = exc.code
                assert code is not None, exc.body  # an Identity §8.1 error body
                if code == "missing_dependency":
                    still.append(name)
                else:
                    refused[name] = code
        pending = still
    assert len(accepted) >= 25
    for name, code in SDK_INVALID_BY_RELAY.items():
        assert refused.get(name) == code, (name, refused.get(name))
    assert all(code in ("invalid_target", "invalid_event", "missing_dependency") for code in refused.values())

    # Exact resubmission through the SDK returns the original record.
    assert sdk.submit(FIXTURES["original"]["envelope"]) == accepted["original"]

    # Retractions carry `license` (current draft): submitted with akrelay's client instead.
    with RelayClient(served.origin, cacert=str(served.cacert)) as ours:
        for name in ("retract_original", "text_retraction"):
            ours.submit(json.dumps(FIXTURES[name]["envelope"]).encode())

    # Read every accepted event back.
    for name, record in accepted.items():
        assert sdk.event(hash_of(name)) == record

    # Enumerate every page of type-filtered queries; the SDK's tracker checks each page.
    for event_type, limit in (("knowledge.publish", 3), ("knowledge.assess", 2)):
        pages = list(sdk.query_pages({"type": event_type, "limit": limit}))
        assert len(pages) >= 2
        got = [r["envelope"]["hash"] for page in pages for r in page["result"]]
        want = sorted((r for r in accepted.values() if r["envelope"]["event"]["type"] == event_type),
                      key=lambda r: r["seq"])
        assert got == [r["envelope"]["hash"] for r in want]
        assert len({(p["checkpoint"], p["as_of"]) for p in pages}) == 1

    publications = [n for n, r in accepted.items() if r["envelope"]["event"]["type"] == "knowledge.publish"]
    target = hash_of("original")
    answers = list(sdk.query_pages({"target": target, "type": "knowledge.assess"}))
    assert all(r["envelope"]["event"]["payload"]["target"] == target for p in answers for r in p["result"])

    # Batch: partitions in request order, absent IDs in missing, all validated by the SDK.
    absent = hash_of("retract_left")
    wanted = [hash_of(publications[2]), absent, hash_of(publications[0])]
    page = sdk.batch(wanted)
    assert [r["envelope"]["hash"] for r in page["result"]] == [wanted[0], wanted[2]]
    assert page["missing"] == [absent]

    # Polling from the completed checkpoint is empty.
    checkpoint = sdk.query({"type": "knowledge.publish"})["checkpoint"]
    assert sdk.query({"type": "knowledge.publish", "after_seq": checkpoint})["result"] == []


def test_sdk_sees_spec_errors(served, sdk) -> None:
    with pytest.raises(HttpResponseError) as exc:
        sdk.event("A" * 43)
    assert (exc.value.status, exc.value.code) == (404, "not_found")
    with pytest.raises(HttpResponseError) as exc:
        sdk.query({"after_seq": 10**9})  # well-formed, but beyond the checkpoint
    assert (exc.value.status, exc.value.code) == (400, "invalid_request")
