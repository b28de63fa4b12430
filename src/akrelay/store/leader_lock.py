"""The one ``flock`` leader lock: at most one process of a data directory runs a job.

:mod:`akrelay.leader` explains the elections that use it; it lives in the store
package because the store elects with it too (the Redis store's node-local text
index writer) and :mod:`akrelay.leader` sits on the store (its Redis lease).
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
