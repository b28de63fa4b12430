"""acceptance_cases run through the core steps of §8.1 in order, over a dict.

This proves the core's answers and their order (resubmission before the
clock and target checks; rejection changes nothing). The same vectors run
against the real service and stores in store-service's suite.
"""

from __future__ import annotations

import json

import pytest

from akrelay.protocol.dependencies import check_targets
from akrelay.protocol.envelope import verify_envelope
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.payload import check_payload_rules
from akrelay.protocol.timestamps import check_created_at
from knowledge_vectors import FIXTURES, cases, hash_of

CASES = cases("acceptance_cases")


class Pipeline:
    def __init__(self):
        self.records = {}  # id -> (envelope, record); withheld ones stay here
        self.withheld = set()
        self.seq = 0

    def submit(self, raw: bytes, now: int):
        item = verify_envelope(raw)                     # step 1
        if item.id in self.records:                     # step 2
            return "resubmission", self.records[item.id][1]
        check_payload_rules(item)                       # step 3
        check_created_at(item, now)                     # step 4
        check_targets(item, lambda i: self.records.get(i, (None,))[0])  # step 5 (withheld included)
        self.seq += 1                                   # step 7
        record = {"envelope": item.to_dict(), "accepted_at": now, "seq": self.seq}
        self.records[item.id] = (item, record)
        return "accepted", record

    def state(self):
        return self.seq, sorted(self.records), sorted(self.withheld)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_acceptance_case_core(case):
    pipeline, receipts = Pipeline(), {}
    for step in case["steps"]:
        if "withhold" in step:
            pipeline.withheld.add(hash_of(step["withhold"]))
            continue
        raw = json.dumps(FIXTURES[step["fixture"]]["envelope"]).encode()
        before = pipeline.state()
        try:
            outcome, record = pipeline.submit(raw, step["now"])
            if outcome == "resubmission":
                assert record == receipts[hash_of(step["fixture"])]
            else:
                assert record["accepted_at"] == step["now"]
                receipts[hash_of(step["fixture"])] = record
        except ProtocolError as exc:
            outcome = exc.code
        assert outcome == step["expected"], step
        assert pipeline.seq == step["seq"]
        if outcome != "accepted":
            assert pipeline.state() == before
