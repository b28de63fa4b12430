"""The evaluator's limits (KIP §42; DESCRIBE CAPABILITIES reports them): path hops and visits, solutions, the
result cap without ``LIMIT``, and how long a cursor lives."""

from __future__ import annotations

from akrelay.kip.kql import cursor as C

LIMITS = {
    "max_path_hops": 32,
    "max_path_visits": 200_000,
    "max_solutions": 500_000,
    "result_cap": 1000,
    "cursor_ttl_seconds": C.TTL_MS // 1000,
}
