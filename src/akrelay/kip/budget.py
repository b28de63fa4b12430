"""The CPU-time budget of one KIP request (KQL and META).

Result caps such as ``max_solutions`` bound the size of each intermediate
solution set, not the work: a nested ``NOT`` re-evaluates its inner block per
incoming solution, each run staying under the cap while the product runs for
hours. So every request gets a budget of CPU seconds, and the evaluator's inner
loops (candidate scans, joins, FILTER, path walks, sorting, keyword search)
call :meth:`Budget.tick`; when the budget is spent the request's current
operation fails ``ExecutionTimeout`` (§87.10, category ``resource``) and every
later operation of the request fails the same way without running.

The clock is the executing thread's CPU time, not wall time: waiting for the
runtime lock or for the GIL while other requests run costs nothing, so a query
that fits its budget on an idle relay fits it on a busy one, and the answer
does not depend on the neighbours. The runtime installs a budget with
:func:`scope`; code that loops reads it with :func:`current`, so no signature
between the runtime and the loops has to carry it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Callable, Iterator

from akrelay.kip.errors import KipError

#: Default CPU budget per KIP request in milliseconds (``akrelay serve --kip-budget-ms``).
DEFAULT_BUDGET_MS = 2000
#: Ticks between two reads of the clock: a tick is a few hundred nanoseconds of
#: loop work, the clock read about as much, so checking every tick would double it.
STRIDE = 128


def _never() -> float:
    return -math.inf


class Budget:
    """CPU seconds for one request; ``tick()`` in loops, ``check()`` between steps."""

    __slots__ = ("budget_ms", "_clock", "_deadline", "_countdown")

    def __init__(self, budget_ms: int | None, clock: Callable[[], float] | None = None) -> None:
        """``clock`` (CPU seconds, e.g. ``time.thread_time``) is the caller's; a bounded budget needs one."""
        if budget_ms is not None and clock is None:
            raise ValueError("a bounded budget needs a clock")
        self.budget_ms = budget_ms
        self._clock = clock or _never
        self._deadline = math.inf if budget_ms is None or clock is None else clock() + budget_ms / 1000
        self._countdown = STRIDE

    def tick(self) -> None:
        self._countdown -= 1
        if self._countdown <= 0:
            self._countdown = STRIDE
            self.check()

    def check(self) -> None:
        if self._clock() > self._deadline:
            self._countdown = 0  # stay spent: every later tick checks and fails again
            raise KipError("ExecutionTimeout", f"the request used its CPU budget of {self.budget_ms} ms",
                           details={"budget_ms": self.budget_ms, "clock": "thread_cpu"},
                           hint="make the query more selective (put the narrowest pattern first, "
                                "avoid cartesian products under NOT) or ask the operator for a larger budget")


UNLIMITED = Budget(None)
_CURRENT: contextvars.ContextVar[Budget] = contextvars.ContextVar("akrelay_kip_budget", default=UNLIMITED)


def current() -> Budget:
    """The budget of the request running in this thread (unlimited outside one)."""
    return _CURRENT.get()


@contextlib.contextmanager
def scope(budget: Budget) -> Iterator[Budget]:
    """Make ``budget`` the current one for the code inside the ``with``."""
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)
