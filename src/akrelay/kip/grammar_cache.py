"""Compiled KQL/META grammar tables kept on disk, so a restarted process loads them instead of compiling.

Compiling both grammars costs about half a second of CPU, in every worker and in the
followers' process of each start (issue 25, "A fast restart"); loading the tables takes a
few milliseconds. They live in the user's cache directory (:func:`cache_dir`); the file's
name carries a hash of everything the tables depend on (grammar text, options, Lark and
Python versions), and anything wrong with a file (missing, truncated, unreadable) means
compiling again. :mod:`akrelay.kip.kql.grammar` stays free of I/O: the runtime installs
:func:`load_or_compile` there (``akrelay.kip.runtime.preload``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import sys
import tempfile
from pathlib import Path

import lark
from lark import Lark

from akrelay.kip.kql.grammar import OPTIONS

log = logging.getLogger("akrelay.kip")


def cache_dir() -> Path | None:
    """``$XDG_CACHE_HOME/akrelay`` (or ``~/.cache/akrelay``), or ``None`` where there is no home."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        return None
    return Path(base) / "akrelay"


def _private(directory: Path) -> bool:
    """Only a directory of this user's that nobody else can write: the tables are a pickle, and a
    file another user could write would let them run code in the relay."""
    try:
        info = directory.stat()
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def cache_file(source: str, directory: Path) -> Path:
    """The file for ``source`` compiled with the grammar's options by this Lark on this Python."""
    key = repr((source, sorted(OPTIONS.items()), lark.__version__, sys.version_info[:2])).encode()
    return directory / f"kip-grammar-{hashlib.sha256(key).hexdigest()[:32]}.lark"


def load_or_compile(source: str, directory: Path | None = None) -> Lark:
    """The parser of ``source``: loaded from ``directory`` (default :func:`cache_dir`) if compiled
    there before, else compiled and stored there (whole, by rename: several processes may race)."""
    if directory is None:
        directory = cache_dir()
    if directory is None:
        return Lark(source, **OPTIONS)
    path = cache_file(source, directory)
    if _private(directory):
        try:
            with open(path, "rb") as fh:
                return Lark.load(fh)
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001 - a damaged cache only means compiling again
            log.info("compiled grammar %s unusable (%s); compiling it again", path, exc)
    compiled = Lark(source, **OPTIONS)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(directory):
            return compiled
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".kip-grammar-", delete=False) as tmp:
            try:
                compiled.save(tmp)
            except BaseException:
                os.unlink(tmp.name)
                raise
        os.replace(tmp.name, path)
    except OSError as exc:  # a read-only home: compile each time
        log.debug("cannot keep the compiled grammar in %s: %s", directory, exc)
    return compiled
