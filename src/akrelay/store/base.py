"""The one storage interface.

Handlers and the sync loop never see a backend; the service layer talks to this
interface only, and ``tests/store_contract.py`` holds every backend to it. Keep
it free of SQL-isms: a Redis backend implements the same methods.

This file fixes the shape of the interface; the owner of the store may extend
it (and must keep ``docs/architecture.md`` in step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from akrelay.protocol.envelope import Envelope


@dataclass(frozen=True, slots=True)
class Record:
    """An acceptance record as stored: the envelope plus local service assertions."""

    seq: int
    accepted_at: int
    envelope: Envelope
    withheld: bool = False


class Store(Protocol):
    """Durable acceptance log with exact filtered enumeration."""

    def get(self, event_id: str) -> Record | None:
        """The record for ``event_id``, withheld or not; ``None`` if not retained."""

    def get_many(self, event_ids: Sequence[str]) -> dict[str, Record]:
        """Records for the retained IDs among ``event_ids`` (withheld included)."""

    def commit(self, envelope: Envelope, accepted_at: int) -> tuple[Record, bool]:
        """Atomically store ``envelope`` and allocate the next ``seq``.

        If the ID is already retained, return its existing record and ``False``:
        the check and the insert happen at one serialized commit point.
        """

    def checkpoint(self) -> int:
        """The committed sequence high-water mark (never decreases)."""

    def iter_records(self, after_seq: int, limit: int) -> list[Record]:
        """Records with ``seq > after_seq`` in ascending ``seq``, withheld included."""

    def set_withheld(self, event_id: str, withheld: bool) -> bool:
        """Hide or show a retained record; ``False`` if it is not retained."""

    def close(self) -> None: ...
