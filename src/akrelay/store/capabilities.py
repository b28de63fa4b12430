"""What some stores can do beyond :class:`akrelay.store.base.Store`, as Protocols to test for.

Callers ask ``isinstance(store, Watchable)`` instead of ``getattr(store, "watch", None)``:
each optional capability has one name, one signature and a docstring, and mypy checks
the call after the test. A store offers a capability by having the member; nothing
registers it. The Protocols are ``runtime_checkable``: ``isinstance`` looks for the
members only, so the signatures here are the contract a backend keeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

from akrelay.store.recon import ReconIndex


@runtime_checkable
class Watchable(Protocol):
    """A store that announces commits, this process's and other nodes' (Redis: a pub/sub channel)."""

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on another thread) after commits; returns the function that stops it."""
        ...


@runtime_checkable
class BlockingIO(Protocol):
    """A store whose calls wait on the network (Redis): an event loop hands them to a thread."""

    blocking_io: bool


@runtime_checkable
class FileBacked(Protocol):
    """An embedded store in one file (SQLite): its directory is the node's data directory."""

    path: Path


@runtime_checkable
class MemoryReporting(Protocol):
    """A store that reports its server's memory (Redis ``INFO memory``)."""

    def memory(self) -> tuple[int, int]:
        """``(used, maximum)`` bytes; maximum 0 when unbounded."""
        ...


@runtime_checkable
class TextIndexed(Protocol):
    """A store whose ``q`` trigram index follows its log."""

    def text_index_lag(self) -> int:
        """Records committed that the text index does not cover yet."""
        ...


@runtime_checkable
class LogFollowing(Protocol):
    """A store whose Merkle log is extended after its commits rather than in them (Redis)."""

    def log_catch_up(self, limit: int = 100000) -> int:
        """Extend the log over committed records (at most ``limit``); returns the log's size."""
        ...


@runtime_checkable
class Reconcilable(Protocol):
    """A store that keeps the set-reconciliation index of its records (docs/federation.md)."""

    recon: ReconIndex


@runtime_checkable
class MerkleSwitchable(Protocol):
    """A store that can run without extending its Merkle log (``--no-merkle-log``)."""

    merkle_log: bool


def blocking_io(store: object) -> bool:
    """Whether calls on ``store`` may block on the network (see :class:`BlockingIO`)."""
    return isinstance(store, BlockingIO) and bool(store.blocking_io)


def store_directory(store: object) -> Path | None:
    """The directory of a file-backed store, else ``None``."""
    return Path(store.path).parent if isinstance(store, FileBacked) and store.path is not None else None


@runtime_checkable
class MetadataHolding(Protocol):
    """A store with the small metadata area of :class:`akrelay.store.base.Store` (a test's stand-in may lack it)."""

    def meta_get(self, key: str) -> bytes | None:
        """The value stored under ``key``; ``None`` if absent."""
        ...


class ChangeWakeups(Protocol):
    """Wake-ups per key for readers on an event loop (:class:`akrelay.knowql.wakeup.Wakeups`).

    A reader ``watch`` es a key, takes its ``mark`` before it reads the store, then awaits
    ``wait``, which returns at once if the key changed since the mark; ``unwatch`` when done.
    """

    def watch(self, key: str, /) -> None: ...

    def unwatch(self, key: str, /) -> None: ...

    def mark(self, key: str, /) -> int: ...

    async def wait(self, key: str, mark: int, timeout: float, /) -> None: ...


@runtime_checkable
class Waking(Protocol):
    """A store that wakes the readers of what changed (the KnowQL turn stores: their turns' events)."""

    @property
    def wakeups(self) -> ChangeWakeups:
        """The wake-ups its writers notify after each commit."""
        ...
