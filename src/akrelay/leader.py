"""One leader per data directory for work that must not run twice.

Granian runs several worker processes on one data directory, and some jobs
must have exactly one runner: the Tantivy writer (one writer per index), the
sync loop (one writer per peer checkpoint), the KIP snapshot writer. The
process that holds an exclusive, non-blocking ``flock`` on the job's lock file
is its leader; the kernel drops the lock when the holder dies, so a killed
leader is replaced by the next process that asks and no stale lock survives.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LeaderLock:
    """An exclusive, non-blocking ``flock``; ``acquire`` says whether we lead."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        self.release()
