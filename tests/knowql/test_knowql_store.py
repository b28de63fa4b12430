"""The shared turn store: compare-and-set transitions, the in-flight slot, expiry of lost turns."""

from __future__ import annotations

import threading

import pytest

from akrelay.knowql.errors import KnowqlError
from backends import Opener, params


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _query(qid: str, timeout: int = 10) -> dict:
    return {"id": qid, "object": "query", "status": "in_progress", "_started": 1_800_000_000.0,
            "_timeout": timeout, "error": None}


@pytest.fixture(params=params())
def store(request, tmp_path):
    """Every backend of the turn store runs the same tests (Redis: a real server, a flushed database)."""
    clock = Clock()
    s = Opener(request.param, request, tmp_path).turn_store(clock=clock)
    s.test_clock = clock  # type: ignore[attr-defined]
    yield s
    s.close()


def test_one_transition_wins_and_releases_the_session(store) -> None:
    store.create_turn({"id": "ses_1", "scope": ["knowledge"]}, "ses_1", _query("qry_1"), deadline=2e9)
    with pytest.raises(KnowqlError) as busy:
        store.create_turn(None, "ses_1", _query("qry_2"), deadline=2e9)
    assert busy.value.status == 409 and busy.value.code == "session_busy"
    assert store.get_query("qry_2") is None
    results = []
    barrier = threading.Barrier(2)

    def finish(status: str) -> None:
        barrier.wait()
        results.append((status, store.finish("qry_1", status, {"error": None if status == "completed" else "x"})))

    threads = [threading.Thread(target=finish, args=(s,)) for s in ("completed", "cancelled")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(ok for _, ok in results) == [False, True]
    winner = next(status for status, ok in results if ok)
    assert store.get_query("qry_1")["status"] == winner
    assert [kind for _, kind, _ in store.events("qry_1")] == [f"response.{winner}"]
    _, second = store.create_turn(None, "ses_1", _query("qry_2"), deadline=2e9)
    assert second["previous_query_id"] == "qry_1"
    assert store.append_events("qry_1", [{"type": "response.step"}]) is None  # ended turns take no events


def test_a_lost_turn_past_its_deadline_is_failed_by_the_next_reader(store) -> None:
    clock = store.test_clock
    store.create_turn({"id": "ses_1", "scope": ["knowledge"]}, "ses_1", _query("qry_1", timeout=5),
                      deadline=clock.now + 5)
    assert store.get_query("qry_1")["status"] == "in_progress"
    clock.now += 6  # its worker died: nobody will finish it
    _, nxt = store.create_turn(None, "ses_1", _query("qry_2"), deadline=clock.now + 10)
    lost = store.get_query("qry_1")
    assert lost["status"] == "failed" and lost["error"] == "timed out after 5 s"
    assert [kind for _, kind, _ in store.events("qry_1")] == ["response.failed"]
    assert nxt["previous_query_id"] == "qry_1"


def test_unknown_session_and_delete(store) -> None:
    with pytest.raises(KnowqlError) as missing:
        store.create_turn(None, "ses_nope", _query("qry_1"), deadline=2e9)
    assert missing.value.status == 404
    store.create_turn({"id": "ses_1", "scope": []}, "ses_1", _query("qry_1"), deadline=2e9)
    store.append_events("qry_1", [{"type": "response.created"}, {"type": "response.step"}])
    assert [seq for seq, _, _ in store.events("qry_1", 2)] == [2]
    assert store.delete_session("ses_1") is True and store.delete_session("ses_1") is False
    assert store.get_query("qry_1") is None and store.events("qry_1") == []


def test_serve_refuses_a_bad_contexts_file_at_startup(tmp_path, capsys) -> None:
    """The option reads a path; the KnowQL component checks the file before serve opens anything."""
    from akrelay.cli import main

    bad = tmp_path / "contexts.json"
    data = tmp_path / "d"
    for text, message in (('{"contexts": [{"slug": "X"}]}', "slug must be"),
                          ('{"contexts": [{"slug": "ops", "filter": {"colour": "red"}}]}', "unknown filter field"),
                          ('{"contexts": [{"slug": "knowledge"}]}', "built in"), ("nope", "not JSON")):
        bad.write_text(text)
        assert main(["serve", "--data", str(data), "--knowql-contexts", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("akrelay serve: --knowql-contexts") and message in err
    assert main(["serve", "--data", str(data), "--knowql-contexts", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert not data.exists()  # refused before the store was opened


def test_every_turn_store_wakes_its_tails_and_a_bare_store_does_not(store) -> None:
    """Tails find wake-ups through the ``Waking`` capability, not ``getattr`` (a store without them polls)."""
    from akrelay.store.capabilities import Waking

    assert isinstance(store, Waking)
    assert store.wakeups.mark("qry_none") == 0
    assert not isinstance(object(), Waking)
