"""What protects a SQLite store file across ``akrelay restore``: who has it open, and the seqs handed out.

Two small files sit next to ``relay.sqlite3`` (outside it, so replacing the file keeps them):

* ``<file>.open-lock``: every process that opens the store holds a *shared* ``flock`` on it
  for as long as the store is open (a relay's workers, its followers, an admin command).
  ``akrelay restore`` takes it *exclusively* without waiting, so it is refused while anything
  has the store open: a running relay would keep writing to the file it replaced, and what it
  acknowledged then would be gone after its restart (issue 24). The kernel drops the lock of a
  killed process, and an opener waits while a restore holds it.
* ``<file>.hwm``: a durable bound on every ``seq`` handed out. A commit that would go past it
  first moves it :data:`RESERVE_BLOCK` further (written to a new file, fsynced, renamed), under
  the store's write flock; a restore starts the restored store above it, so a seq is never
  reused even when the replaced file is lost (Knowledge §8.3: gaps are permitted, reuse is not).
  One fsync per :data:`RESERVE_BLOCK` seqs, not one per commit.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

#: seqs reserved at a time: the most a restore may skip, and the fsyncs saved per commit.
RESERVE_BLOCK = 1024

OPEN_LOCK_SUFFIX = ".open-lock"
HWM_SUFFIX = ".hwm"


def hold_open_lock(store_path: str | os.PathLike[str]) -> int:
    """Take the shared "this store is open" lock (waiting while a restore runs); the descriptor holds it."""
    fd = os.open(f"{store_path}{OPEN_LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def try_exclusive_open_lock(store_path: str | os.PathLike[str]) -> int | None:
    """The exclusive lock (no process has the store open), or ``None`` at once when one has."""
    fd = os.open(f"{store_path}{OPEN_LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_reserved(store_path: str | os.PathLike[str]) -> int:
    """The durable bound on the seqs handed out for ``store_path`` (0 when none was kept)."""
    try:
        text = Path(f"{store_path}{HWM_SUFFIX}").read_text("ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return 0
    return int(text) if text.isdigit() else 0


class SeqReservation:
    """The ``<file>.hwm`` bound of one open store; :meth:`cover` runs under its write flock."""

    __slots__ = ("path", "_reserved")

    def __init__(self, store_path: str | os.PathLike[str]) -> None:
        self.path = Path(f"{store_path}{HWM_SUFFIX}")
        self._reserved = -1  # unknown until the first cover: another process may have moved it

    def cover(self, seq: int) -> None:
        """Make the durable bound at least ``seq`` before a commit hands it out."""
        if seq <= self._reserved:
            return
        current = read_reserved(str(self.path)[: -len(HWM_SUFFIX)])
        if seq > current:
            current = max(current, seq) + RESERVE_BLOCK
            _write_durably(self.path, current)
        self._reserved = current


def _write_durably(path: Path, value: int) -> None:
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"%d\n" % value)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
