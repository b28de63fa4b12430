"""The bounded reads every turn store offers: recent turns, a page of a session, turns in progress."""

from __future__ import annotations

from .test_knowql_store import _query, store  # noqa: F401 - the parametrized fixture (memory, file, redis)


def _session_of(store, turns: int) -> list[str]:  # noqa: F811
    ids = []
    for n in range(turns):
        qid = f"qry_{n}"
        store.create_turn({"id": "ses_1", "scope": ["knowledge"]} if n == 0 else None, "ses_1", _query(qid), 2e9)
        store.finish(qid, "completed", {})
        ids.append(qid)
    return ids


def test_recent_queries_reads_only_the_last_turns(store) -> None:  # noqa: F811
    ids = _session_of(store, 12)
    assert [q["id"] for q in store.recent_queries("ses_1", 5)] == ids[-5:]
    assert [q["id"] for q in store.recent_queries("ses_1", 50)] == ids
    assert store.recent_queries("ses_unknown", 5) == []


def test_session_page(store) -> None:  # noqa: F811
    ids = _session_of(store, 7)
    assert store.session_page("ses_1", 0, 3) == (7, [store.get_query(q) for q in ids[:3]])
    total, page = store.session_page("ses_1", 5, 10)
    assert total == 7 and [q["id"] for q in page] == ids[5:]
    assert store.session_page("ses_1", 9, 3) == (7, [])


def test_in_progress_lists_only_running_turns(store) -> None:  # noqa: F811
    _session_of(store, 2)
    store.create_turn({"id": "ses_2", "scope": ["knowledge"]}, "ses_2", _query("qry_run"), 2e9)
    assert [q["id"] for q in store.in_progress(10)] == ["qry_run"]
    store.finish("qry_run", "cancelled", {})
    assert store.in_progress(10) == []
