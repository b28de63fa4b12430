"""``akrelay serve`` options of the KIP endpoint (one ``option`` call each)."""

from __future__ import annotations

from dataclasses import dataclass

from akrelay.kip.budget import DEFAULT_BUDGET_MS
from akrelay.optionkit import _int, option, setting


def budget_ms(text: object) -> int:
    """A CPU budget in milliseconds; 0 turns the budget off."""
    value = _int(text)
    if value < 0:
        raise ValueError("must be a non-negative integer (0: no budget)")
    return value


option("kip_budget_ms", budget_ms, DEFAULT_BUDGET_MS,
       "thread CPU milliseconds one /v1/kip request (KQL and META) may use; beyond it the operation fails "
       "ExecutionTimeout (0: no budget)", metavar="MS")


@dataclass(frozen=True, slots=True)
class KipSettings:
    """The KIP endpoint's settings (``settings.kip``)."""

    budget_ms: int = setting("kip_budget_ms")
