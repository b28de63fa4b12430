"""Validation switches that an operator may set.

Kept in one frozen value so that the same envelope always gets the same answer
from every caller (HTTP, sync, CLI) under one configuration.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ValidationOptions:
    #: Accept a ``knowledge.retract`` payload without ``license``, as the earlier
    #: draft of agent-knowledge/1.0 (bundled with the agent-protocols 0.12.6 SDK)
    #: defines it. Event IDs keep both forms distinct, so this is unambiguous.
    allow_legacy_retract: bool = True


DEFAULT_OPTIONS = ValidationOptions()
