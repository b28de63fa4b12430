"""The model catalog (``GET /models``) and the composers behind it.

The catalog always holds the extractive composer, ``akrelay/extractive-1``,
which needs no model and is the default. When the operator configures an
OpenAI-compatible endpoint, its model joins the catalog as
``openai-compatible/<model>`` and the ``standard`` and ``pro`` tiers point at
it; ``lite`` always resolves to the extractive composer. A request may name a
catalog id or a tier; anything else is 400 ``model_unavailable``.

:data:`EXTRA_COMPOSERS` lets embedding code (and tests) add a composer under
its own model id without touching this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from akrelay.jsontypes import JSON, JSONObject

from akrelay.knowql.compose import EXTRACTIVE_MODEL, Composition
from akrelay.knowql.errors import KnowqlError
from akrelay.knowql.retrieval import Retrieval

if TYPE_CHECKING:
    from akrelay.settings import Settings

TIERS = ("lite", "standard", "pro")


@dataclass(frozen=True)
class HistoryEntry:
    """One earlier turn of the session, as a later turn sees it (bounded: see ``runner.history_of``)."""

    ask: str
    answer: str                               # the answer text, clipped
    sources: tuple[str, ...]                  # event IDs the answer cited, in citation order


@dataclass(frozen=True)
class TurnInput:
    """What a composer may read about the turn."""

    ask: str
    history: tuple[HistoryEntry, ...]         # earlier completed turns, oldest first
    system_prompt: str | None
    guardrails: str | None
    shape: JSONObject | None
    deadline: float                           # time.time() value the composer must finish by


class ComposerError(Exception):
    """The composer could not produce an answer; the turn fails with this message."""


class Composer(Protocol):
    def compose(self, turn: TurnInput, retrieval: Retrieval, emit: Callable[[str], None]) -> Composition: ...


@dataclass(frozen=True)
class ModelEntry:
    id: str
    label: str
    provider: str
    composer: Composer
    available: bool = True

    def to_wire(self) -> dict[str, JSON]:
        return {"id": self.id, "label": self.label, "provider": self.provider, "available": self.available}


#: model id -> factory(settings) returning a ModelEntry or None; consulted when a catalog is built.
EXTRA_COMPOSERS: dict[str, Callable[[Settings], ModelEntry | None]] = {}


class Catalog:
    def __init__(self, entries: Sequence[ModelEntry], tiers: dict[str, str]) -> None:
        self.entries = {e.id: e for e in entries}
        self.tiers = tiers
        self.default = EXTRACTIVE_MODEL

    def resolve(self, preference: Sequence[str]) -> ModelEntry:
        """The first available model of ``preference`` (ids or tiers); the default when it is empty.

        Every listed name must be known and available: a list naming an
        unknown model is refused even if an earlier one would serve.
        """
        chosen = None
        for name in preference:
            entry = self.entries.get(self.tiers.get(name, name))
            if entry is None or not entry.available:
                raise KnowqlError(400, "model_unavailable",
                                  f"model {name!r} is not available here (see GET /models)")
            chosen = chosen or entry
        return chosen or self.entries[self.default]

    def to_wire(self) -> dict[str, JSON]:
        return {"default": self.default, "models": [e.to_wire() for e in self.entries.values()],
                "tiers": dict(self.tiers), "phase_defaults": {"compose": self.tiers["standard"],
                                                              "retrieve": self.default},
                "supported_curate_models": []}
