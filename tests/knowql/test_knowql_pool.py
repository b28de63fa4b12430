"""Turn threads are shared fairly: one client's queue does not delay another client's turn (issue 24, 3)."""

from __future__ import annotations

import threading

from akrelay.knowql.pool import FairPool


def test_a_free_thread_serves_the_least_served_client_first() -> None:
    pool = FairPool(1)
    gate, order = threading.Event(), []

    def job(name: str) -> str:
        if name == "a0":
            gate.wait(30)
        order.append(name)
        return name

    try:
        futures = [pool.submit("a", job, f"a{n}") for n in range(4)]  # a0 holds the only thread
        futures.append(pool.submit("b", job, "b0"))  # queued after a1..a3, served before them
        gate.set()
        assert [f.result(30) for f in futures] == ["a0", "a1", "a2", "a3", "b0"]
        assert order == ["a0", "b0", "a1", "a2", "a3"]
    finally:
        pool.shutdown()


def test_shutdown_cancels_queued_turns_and_refuses_new_ones() -> None:
    pool = FairPool(1)
    gate, entered = threading.Event(), threading.Event()

    def hold() -> bool:
        entered.set()
        return gate.wait(30)

    running = pool.submit("a", hold)
    queued = pool.submit("a", lambda: "never")
    assert entered.wait(30)
    pool.shutdown()
    gate.set()
    assert running.result(30) is True and queued.cancelled()
    try:
        pool.submit("a", lambda: None)
    except RuntimeError:
        pass
    else:
        raise AssertionError("a shut-down pool took a turn")
    for thread in pool.threads:
        thread.join(30)
        assert not thread.is_alive()
