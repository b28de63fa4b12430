"""Long sessions stay cheap: a bounded history summary per turn and a paged session document (issue 24, 6)."""

from __future__ import annotations

import pytest

from akrelay.knowql.compose import ExtractiveComposer
from akrelay.knowql.models import EXTRA_COMPOSERS, HistoryEntry, ModelEntry
from akrelay.knowql.runner import HISTORY_ANSWER_CHARS, HISTORY_TURNS, history_of

from .kq_harness import knowql_app


class Recording:
    """The extractive composer, remembering each turn's input."""

    def __init__(self) -> None:
        self.inputs: list = []

    def compose(self, turn, retrieval, emit):
        self.inputs.append(turn)
        return ExtractiveComposer().compose(turn, retrieval, emit)


@pytest.fixture
def recording():
    composer = Recording()
    EXTRA_COMPOSERS["test/record"] = lambda settings: ModelEntry("test/record", "Recording (tests)", "tests", composer)
    try:
        yield composer
    finally:
        EXTRA_COMPOSERS.pop("test/record", None)


def _session(kq, turns: int) -> tuple[str, list[str]]:
    capsule = kq.corpus.publish("alice", "Cache clears on restart", "Restart clears the cache.")
    kq.submit(capsule)
    first = kq.ask({"ask": "cache restart 0", "scope": ["knowledge"], "model": "test/record"}).json()
    ids = [first["id"]]
    for n in range(1, turns):
        doc = kq.ask({"ask": f"cache restart {n}", "session_id": first["session_id"]}).json()
        assert doc["status"] == "completed", doc
        ids.append(doc["id"])
    return first["session_id"], ids


def test_a_turn_reads_a_bounded_summary_of_its_history(recording) -> None:
    with knowql_app() as kq:
        _session(kq, HISTORY_TURNS + 3)
        last = recording.inputs[-1].history
        assert len(last) == HISTORY_TURNS
        assert all(isinstance(entry, HistoryEntry) for entry in last)
        assert [entry.ask for entry in last] == [f"cache restart {n}" for n in range(2, HISTORY_TURNS + 2)]
        assert all(entry.sources for entry in last)  # the event IDs each earlier answer cited


def test_the_summary_clips_answers_and_sources() -> None:
    turn = {"status": "completed", "input": [{"role": "user", "content": "q"}],
            "output": [{"content": [{"type": "output_text", "text": "a" * (HISTORY_ANSWER_CHARS * 5)}]}],
            "citations": [{"source": f"s{i}"} for i in range(100)]}
    failed = dict(turn, status="failed")
    entries = history_of([turn, failed] * (HISTORY_TURNS * 2))
    assert len(entries) == HISTORY_TURNS
    assert all(len(e.answer) == HISTORY_ANSWER_CHARS and 0 < len(e.sources) <= 16 for e in entries)


def test_the_session_document_is_paged(recording) -> None:
    with knowql_app() as kq:
        session_id, ids = _session(kq, 25)
        whole = kq.client.get(f"/sessions/{session_id}")
        assert whole.status_code == 200
        body = whole.json()
        assert [q["id"] for q in body["queries"]] == ids[:20]
        assert body["akrelay"]["queries"] == {"total": 25, "offset": 0, "limit": 20, "next_offset": 20}
        page = kq.client.get(f"/sessions/{session_id}", params={"offset": 20, "limit": 3}).json()
        assert [q["id"] for q in page["queries"]] == ids[20:23]
        assert page["akrelay"]["queries"]["next_offset"] == 23
        tail = kq.client.get(f"/sessions/{session_id}", params={"offset": 23, "limit": 100}).json()
        assert [q["id"] for q in tail["queries"]] == ids[23:] and tail["akrelay"]["queries"]["next_offset"] is None
        for bad in ({"limit": "0"}, {"limit": "101"}, {"offset": "-1"}, {"limit": "x"}, {"offset": "²"}):
            r = kq.client.get(f"/sessions/{session_id}", params=bad)
            assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", (bad, r.text)
