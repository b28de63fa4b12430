"""Two deployments on one Redis database, told apart by ``--store-namespace``, share no state.

The log's keys carry the namespace (tests/store/test_redis.py); so must everything else a
deployment keeps in Redis: its rate budget, its sync lease and state, its KnowQL sessions.
"""

from __future__ import annotations

from akrelay.backend import backend_for
from akrelay.settings import defaults


def _settings(tmp_path, url, namespace):
    return defaults(data=str(tmp_path / namespace), store=url, store_namespace=namespace,
                    write_rate=1.0, write_burst=1)


def test_rate_budgets_are_per_deployment(tmp_path, redis_url):
    a = backend_for(_settings(tmp_path, redis_url, "alpha")).rate_limits()
    b = backend_for(_settings(tmp_path, redis_url, "beta")).rate_limits()
    try:
        assert a["write"].take("10.0.0.1") == 0
        assert a["write"].take("10.0.0.1") > 0  # alpha's burst of 1 is spent
        assert b["write"].take("10.0.0.1") == 0  # beta's is not
    finally:
        a.close()
        b.close()


def test_each_deployment_elects_its_own_sync_leader_and_keeps_its_own_state(tmp_path, redis_url):
    alpha, beta = backend_for(_settings(tmp_path, redis_url, "alpha")), backend_for(_settings(tmp_path, redis_url, "beta"))
    a = alpha.leadership()
    b = beta.leadership()
    try:
        assert a.lock.acquire()
        assert b.lock.acquire()  # not refused by alpha's lease
    finally:
        a.close()
        b.close()
    state_a = alpha.federation_state()
    state_b = beta.federation_state()
    try:
        assert state_a.prefix == "alpha:sync:" and state_b.prefix == "beta:sync:"
    finally:
        state_a.close()
        state_b.close()
        alpha.close()
        beta.close()


def test_knowql_sessions_are_per_deployment(tmp_path, redis_url):
    a = backend_for(_settings(tmp_path, redis_url, "alpha")).turn_store()
    b = backend_for(_settings(tmp_path, redis_url, "beta")).turn_store()
    try:
        query = {"id": "qry_1", "object": "query", "status": "in_progress", "_started": 1_800_000_000.0,
                 "_timeout": 10, "error": None}
        a.create_turn({"id": "ses_1", "scope": ["knowledge"]}, "ses_1", query, deadline=2e9)
        assert a.get_session("ses_1") is not None
        assert b.get_session("ses_1") is None
    finally:
        a.close()
        b.close()
